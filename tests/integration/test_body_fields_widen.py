"""Body fields that would widen where a prompt goes or what is kept are refused, not
dropped: the client gets a 400 naming the field, the backend gets nothing, and the signed
log says what happened (gateway/api/control_fields.py, gateway/upstream/hosted_fields.py).

- A router's control arguments (`api_base`, `fallbacks`, `mock_response`, `litellm_*`,
  `aws_region_name`, ...) for every backend: a private `kind: openai` backend may be a
  LiteLLM proxy, which would honour them. Refused before the policy decides, like a
  malformed body: nothing is dispatched and nothing is recorded.
- Tools the server itself would run (an `mcp` tool, web search, ...) for every backend,
  refused the same way (a LiteLLM proxy as a private backend would run them too).
- A hosted provider's own actions (`web_search_options`, `audio`, `store: true`):
  refused for the hosted attempt before its dispatch record (nothing is sent, so no
  dispatch record names the provider); with nothing else tried, the 400 the client got
  has a refusal record (`reason` `upstream_bad_request`). The same for a private
  `kind: openai` backend, which may be a router that passes them to a hosted provider
  (gateway/api/router_fields.py); a vLLM backend gets them as sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    logged_gateway,
    logged_private_gateway,
    served,
)
from tests.helpers.log_truth import hosted_gateway
from tests.helpers.provenance import assert_never_logged, request_records

pytestmark = LITELLM_WARNINGS

ASK: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(gateway: Gateway, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )


# -- a router's control arguments, for every backend -----------------------------------------


@pytest.fixture
def private(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    return logged_private_gateway(start_gateway, tmp_path, sim.url, "example.com/fields"), sim


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (b'"api_base": "http://decoy.example/v1"', "api_base"),
        (b'"base_url": "http://decoy.example/v1"', "base_url"),
        (b'"api\\u005fbase": "http://decoy.example/v1"', "api_base"),  # as the backend reads it
        (b'"api_key": "sk-client"', "api_key"),
        (b'"custom_llm_provider": "openai"', "custom_llm_provider"),
        (b'"fallbacks": ["gpt-4o"]', "fallbacks"),
        (b'"mock_response": "made up"', "mock_response"),
        (b'"extra_headers": {"x": "1"}', "extra_headers"),
        (b'"extra_body": {"api_base": "http://decoy.example"}', "extra_body"),
        (b'"litellm_params": {"api_base": "http://decoy.example"}', "litellm_params"),
        (b'"user_config": {"model_list": []}', "user_config"),
        # a LiteLLM proxy merges it into its Router's call: fallbacks to other model groups
        (
            b'"router_settings_override": {"fallbacks": [{"m": ["gpt-4o"]}]}',
            "router_settings_override",
        ),
        (b'"aws_region_name": "us-east-1"', "aws_region_name"),
        (b'"vertex_location": "us-central1"', "vertex_location"),
        # LiteLLM `completion()` arguments the first list missed (its main.py's kwargs)
        (b'"ssl_verify": false', "ssl_verify"),
        (b'"use_litellm_proxy": true', "use_litellm_proxy"),
        (b'"gigachat_auth_url": "http://decoy.example/oauth"', "gigachat_auth_url"),
        (b'"provider_specific_header": {"extra_headers": {"x": "1"}}', "provider_specific_header"),
        (b'"prompt_id": "stored"', "prompt_id"),
        (b'"preset_cache_key": "k"', "preset_cache_key"),
        (b'"input_cost_per_token": 0', "input_cost_per_token"),
        # LiteLLM's Router's own: deployments picked by provider model, across groups
        (b'"specific_deployment": true', "specific_deployment"),
        (b'"passthrough_on_no_deployment": true', "passthrough_on_no_deployment"),
        # an inference server's disaggregation channel: where its KV cache comes from
        (
            b'"kv_transfer_params": {"do_remote_prefill": true, "remote_host": "decoy.example"}',
            "kv_transfer_params",
        ),
        # vLLM's encoder-cache disaggregation (EPD): a consumer fetches an image's encoder
        # output by its hash from the host, port and memory address the params name
        (
            b'"ec_transfer_params": {"mm-hash": {"do_remote_encode": true, '
            b'"remote_host": "decoy.example", "remote_port": 5557, "mm_base_addr": 0}}',
            "ec_transfer_params",
        ),
        (b'"bootstrap_host": "decoy.example", "bootstrap_room": 1', "bootstrap_host"),
        (b'"custom_logit_processor": "gASV..."', "custom_logit_processor"),
        # a LiteLLM proxy decodes a string `metadata` as its object: its `user_id` (the end
        # user of its spend and budgets) reached it as written, another tenant's included
        (b'"metadata": "{\\"user_id\\": \\"decoy\\"}"', "metadata"),
        (b'"Metadata": "{\\"tags\\": [\\"decoy\\"]}"', "Metadata"),
        (b'"metadata": ["decoy"]', "metadata"),
    ],
)
def test_a_routers_control_field_is_refused_and_nothing_leaves(
    private: tuple[Gateway, Sim], tmp_path: Path, extra: bytes, param: str
) -> None:
    gateway, sim = private
    body = orjson.dumps(ASK)[:-1] + b", " + extra + b"}"
    refused = post(gateway, body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert "decoy" not in refused.text and "sk-client" not in refused.text
    assert served(sim) == 0
    # Nothing was dispatched, so nothing is recorded (as for a malformed body): the next
    # request's records are covered by a checkpoint, and none is the refused one's.
    ok = post(gateway, orjson.dumps(ASK))
    assert ok.status_code == 200, ok.text
    log = tmp_path / "log"
    assert_never_logged(log, refused.headers["x-request-id"], ok.headers["x-request-id"])


def test_a_long_control_field_name_is_not_echoed_whole(private: tuple[Gateway, Sim]) -> None:
    gateway, _ = private
    name = "litellm_" + "x" * 5000
    refused = post(gateway, orjson.dumps({**ASK, name: 1}))
    assert refused.status_code == 400, refused.text
    assert len(refused.content) < 1000


def test_openai_fields_still_reach_a_private_backend(private: tuple[Gateway, Sim]) -> None:
    gateway, sim = private
    body = {**ASK, "metadata": {"app": "x"}, "user": "u1", "top_k": 3, "store": True}
    answer = post(gateway, orjson.dumps(body))
    assert answer.status_code == 200, answer.text
    (sent,) = sim.app.captured("/v1/chat/completions")
    forwarded = orjson.loads(sent.body)
    # `user` as the tenant's own identifier (gateway/upstream/tenant_ids.py), the rest as sent
    assert forwarded.pop("user").startswith("og-")
    assert forwarded == {k: v for k, v in body.items() if k != "user"}


# -- a hosted provider's own actions -----------------------------------------------------------


@pytest.fixture
def hosted(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim]:
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    return hosted_gateway(start_gateway, tmp_path, f"{provider.url}/v1", "m"), provider


def _tool(kind: str, **more: Any) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": {"name": "f"}}, {"type": kind, **more}]}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"web_search_options": {}}, "web_search_options"),
        ({"web_search_options": {"search_context_size": "high"}}, "web_search_options"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"store": True}, "store"),
    ],
)
def test_a_provider_action_is_refused_on_the_hosted_attempt(
    hosted: tuple[Gateway, Sim], tmp_path: Path, extra: dict[str, Any], param: str
) -> None:
    gateway, provider = hosted
    refused = post(gateway, orjson.dumps({**ASK, **extra}))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert "not sent" in error["message"] and "decoy" not in refused.text
    assert served(provider) == 0
    # Not an attempt (nothing was sent): a refusal saying what the client got.
    request_id = refused.headers["x-request-id"]
    (refusal,) = request_records(tmp_path / "log", request_id, "refusal")
    assert (refusal["reason"], refusal["rule"]) == (
        "upstream_bad_request",
        "owngate/hosted_request",
    )
    kinds = {r["type"] for r in request_records(tmp_path / "log", request_id)}
    assert kinds == {"refusal"}


# A private `kind: openai` backend may be a LiteLLM proxy in front of hosted providers: it
# would pass these on as a hosted call would (a search, a stored completion, a prompt cache
# kept for the client's `ttl`). Before, it was sent them as the client wrote them.
ROUTED: list[tuple[dict[str, Any], str]] = [
    ({"web_search_options": {}}, "web_search_options"),
    ({"store": True}, "store"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, "cache_control"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ]
        },
        "messages[0].content[0].cache_control",
    ),
    # a LiteLLM proxy's tag-based routing: the deployments tagged so (another region's)
    ({"metadata": {"tags": ["eu-deployment"]}}, "metadata.tags"),
    ({"metadata": {"inherited_tags": ["eu-deployment"]}}, "metadata.inherited_tags"),
    ({"metadata": {"_routing_request_tags": ["eu"]}}, "metadata._routing_request_tags"),
    ({"metadata": {"disable_global_guardrails": True}}, "metadata.disable_global_guardrails"),
    # a guardrail the client names: its service gets the prompt (with the client's
    # `extra_body`); an answer from another cache namespace or model group's cache
    ({"metadata": {"guardrails": [{"g": {"extra_body": {"x": 1}}}]}}, "metadata.guardrails"),
    ({"metadata": {"redis_namespace": "team-b"}}, "metadata.redis_namespace"),
    ({"metadata": {"caching_groups": [["m", "gpt-4o"]]}}, "metadata.caching_groups"),
    # `metadata` in another case: a router in Go reads it as `metadata`, and the last
    # match over an exact one ahead of it
    ({"Metadata": {"tags": ["eu-deployment"]}}, "metadata.tags"),
    ({"metadata": {}, "METADATA": {"deployment": "eu/gpt"}}, "metadata.deployment"),
    # in another case: a router in Go reads it as the marker (named as the marker)
    (
        {"messages": [{"role": "user", "content": "hi", "Cache_Control": {"type": "ephemeral"}}]},
        "messages[0].cache_control",
    ),
]


@pytest.fixture
def router(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gpu = backend("gpu", sim.url, "m", kind="openai")
    return logged_gateway(start_gateway, tmp_path, [gpu], "example.com/fields"), sim


@pytest.mark.parametrize(("extra", "param"), ROUTED)
def test_a_provider_action_is_refused_for_a_private_router(
    router: tuple[Gateway, Sim], tmp_path: Path, extra: dict[str, Any], param: str
) -> None:
    gateway, sim = router
    refused = post(gateway, orjson.dumps({**ASK, **extra}))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert "not sent" in error["message"]
    assert served(sim) == 0
    # The attempt was not made (no dispatch record): a refusal saying what the client got.
    request_id = refused.headers["x-request-id"]
    (refusal,) = request_records(tmp_path / "log", request_id, "refusal")
    assert (refusal["reason"], refusal["rule"]) == (
        "upstream_bad_request",
        "owngate/hosted_request",
    )
    assert {r["type"] for r in request_records(tmp_path / "log", request_id)} == {"refusal"}


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({"tags": ["us-deployment"]}, "metadata.tags"),
        ({"guardrails": ["g"]}, "metadata.guardrails"),
    ],
)
def test_router_metadata_on_an_embedding_is_refused_for_a_private_router(
    router: tuple[Gateway, Sim], tmp_path: Path, metadata: dict[str, Any], param: str
) -> None:
    """A LiteLLM proxy's Router picks an embedding's deployment by `metadata.tags` as it
    does a chat's (`aembedding`: tag-based routing), and runs the guardrails it names.
    Before, only chat and text completions were judged: an embedding's reached it."""
    gateway, sim = router
    refused = httpx.post(
        f"{gateway.url}/v1/embeddings",
        content=orjson.dumps({"model": "m", "input": "hi", "metadata": metadata}),
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert sim.app.captured("/v1/embeddings") == []
    request_id = refused.headers["x-request-id"]
    assert {r["type"] for r in request_records(tmp_path / "log", request_id)} == {"refusal"}


def test_an_embedding_still_reaches_a_private_router(router: tuple[Gateway, Sim]) -> None:
    # the hosted rule's chat fields are not an embedding's: `store` passes as before
    gateway, sim = router
    body = {"model": "m", "input": "hi", "metadata": {"topic": "x"}, "store": True}
    answer = httpx.post(
        f"{gateway.url}/v1/embeddings",
        content=orjson.dumps(body),
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert orjson.loads(sim.app.captured("/v1/embeddings")[-1].body) == body


def test_a_provider_action_passes_a_router_to_reach_an_inference_server(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    # vLLM acts on none of them: the plan's vLLM backend serves, the router gets nothing.
    routing = start_sim("vllm", models=("m",), zero_latency=True)
    vllm = start_sim("vllm", models=("m",), zero_latency=True)
    backends = [backend("router", routing.url, "m", kind="openai"), backend("gpu", vllm.url, "m")]
    gateway = logged_gateway(start_gateway, tmp_path, backends, "example.com/fields")
    for extra, _ in ROUTED:
        body = {**ASK, **extra}
        answer = post(gateway, orjson.dumps(body))
        assert answer.status_code == 200, answer.text
        assert orjson.loads(vllm.app.captured("/v1/chat/completions")[-1].body) == body
    assert served(routing) == 0
    assert served(vllm) == len(ROUTED)


# Tools the server itself would run: refused at the ingress for every backend, as a
# router's control fields are (gateway/upstream/client_tools.py). A private `kind: openai`
# backend may be a LiteLLM proxy, which runs an `mcp` tool's calls to its `server_url`
# from inside the network; before, a private backend was sent them byte for byte.
TOOLS: list[tuple[dict[str, Any], str]] = [
    (_tool("mcp", server_url="http://decoy.example/mcp", server_label="x"), "tools[1].type"),
    (_tool("web_search_preview"), "tools[1].type"),
    (_tool("web_search"), "tools[1].type"),
    (_tool("web_search_20250305", name="web_search"), "tools[1].type"),
    (_tool("file_search", vector_store_ids=["vs_1"]), "tools[1].type"),
    (_tool("code_interpreter"), "tools[1].type"),
    (_tool("computer_use_preview"), "tools[1].type"),
    # Gemini's adapter drops `type` and reads a lone other key as its built-in tool.
    ({"tools": [{"type": "custom", "googleSearch": {}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "x": 1}]}, "tools[0]"),
    # a router in Go reads `Type` as the tool's type, and `Tools` as `tools`
    ({"tools": [{"type": "function", "Type": "mcp", "function": {"name": "f"}}]}, "tools[0]"),
    ({"Tools": [{"type": "mcp", "server_url": "http://decoy.example/mcp"}]}, "Tools[0].type"),
    ({"functions": [{"googleSearch": {}}]}, "functions[0]"),
    # what orjson reads of `{"type": "web_search", "type": null}` (test below)
    ({"tools": [{"type": None, "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": 7, "function": {"name": "f"}}]}, "tools[0].type"),
    ({"functions": [{"name": "f", "url_context": {}}]}, "functions[0]"),
]


@pytest.mark.parametrize("path", ["private", "hosted"])
@pytest.mark.parametrize(("extra", "param"), TOOLS)
def test_a_tool_the_server_would_run_is_refused_on_every_path(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    path: str,
    extra: dict[str, Any],
    param: str,
) -> None:
    gateway, backend = request.getfixturevalue(path)
    refused = post(gateway, orjson.dumps({**ASK, **extra}))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert error["type"] == "invalid_request_error"
    assert "decoy" not in refused.text
    assert served(backend) == 0
    # Refused before the policy decides, like a control field: nothing is recorded.
    ok = post(gateway, orjson.dumps(ASK))
    assert ok.status_code == 200, ok.text
    log = tmp_path / "log"
    assert_never_logged(log, refused.headers["x-request-id"], ok.headers["x-request-id"])


def test_a_tool_type_a_later_null_copy_hides_is_refused(private: tuple[Gateway, Sim]) -> None:
    # orjson keeps the last copy (null: a tool of no type, which passed as the backend's
    # to refuse); Go's encoding/json keeps the string over a later null: to a router in
    # Go, a web search.
    gateway, sim = private
    tool = b'{"type": "web_search", "type": null}'
    body = orjson.dumps(ASK)[:-1] + b', "tools": [' + tool + b"]}"
    refused = post(gateway, body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "tools[0].type")
    assert served(sim) == 0


def test_client_run_tools_still_reach_a_private_backend(private: tuple[Gateway, Sim]) -> None:
    gateway, sim = private
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "custom", "custom": {"name": "g"}},
    ]
    body = {**ASK, "tools": tools, "functions": [{"name": "h", "parameters": {}}]}
    answer = post(gateway, orjson.dumps(body))
    assert answer.status_code == 200, answer.text
    (sent,) = sim.app.captured("/v1/chat/completions")
    assert orjson.loads(sent.body) == body


def test_client_run_tools_and_unstored_requests_still_reach_the_provider(
    hosted: tuple[Gateway, Sim],
) -> None:
    gateway, provider = hosted
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "custom", "custom": {"name": "g"}},
    ]
    body = {**ASK, "tools": tools, "store": False, "web_search_options": None, "audio": None}
    body["functions"] = [{"name": "h", "description": "d", "parameters": {"type": "object"}}]
    answer = post(gateway, orjson.dumps(body))
    assert answer.status_code == 200, answer.text
    (sent,) = provider.app.captured("/v1/chat/completions")
    forwarded = orjson.loads(sent.body)
    assert forwarded["tools"] == tools
    assert forwarded["functions"] == body["functions"]
    assert not {"store", "web_search_options", "audio"} & forwarded.keys()


# A LiteLLM proxy's `text_completion` passes a text completion's other fields on to
# `completion()` as sent (LiteLLM 1.108.7, main.py): a web search or a stored completion
# on /v1/completions too. Before, only chat requests to a router were judged.
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"web_search_options": {}}, "web_search_options"),
        ({"store": True}, "store"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
        ({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, "cache_control"),
    ],
)
def test_a_provider_action_on_a_text_completion_is_refused_for_a_private_router(
    router: tuple[Gateway, Sim], tmp_path: Path, extra: dict[str, Any], param: str
) -> None:
    gateway, sim = router
    refused = httpx.post(
        f"{gateway.url}/v1/completions",
        content=orjson.dumps({"model": "m", "prompt": "hi", **extra}),
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert served(sim) == 0
    request_id = refused.headers["x-request-id"]
    (refusal,) = request_records(tmp_path / "log", request_id, "refusal")
    assert refusal["rule"] == "owngate/hosted_request"
    assert {r["type"] for r in request_records(tmp_path / "log", request_id)} == {"refusal"}


# A router in Go (encoding/json and its look-alikes) matches names without regard to case
# and reads the last match: `"Store": true` is a stored completion to it. Before, the
# hosted rule read the exact spelling only, so these reached a `kind: openai` backend.
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (b'"Store": true', "Store"),
        (b'"store": false, "STORE": true', "STORE"),
        (b'"Web_Search_Options": {}', "Web_Search_Options"),
        (b'"\\u017ftore": true', "\u017ftore"),  # long s folds to `s`
        (b'"cachepoint": {"type": "default"}', "cachepoint"),
        (b'"Prompt_Cache_Retention": "24h"', "Prompt_Cache_Retention"),
    ],
)
def test_a_provider_action_in_another_case_is_refused_for_a_private_router(
    router: tuple[Gateway, Sim], tmp_path: Path, extra: bytes, param: str
) -> None:
    gateway, sim = router
    refused = post(gateway, orjson.dumps(ASK)[:-1] + b", " + extra + b"}")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert served(sim) == 0
    request_id = refused.headers["x-request-id"]
    assert {r["type"] for r in request_records(tmp_path / "log", request_id)} == {"refusal"}


def test_a_harmless_value_in_another_case_still_reaches_a_private_router(
    router: tuple[Gateway, Sim],
) -> None:
    gateway, sim = router
    body = orjson.dumps(ASK)[:-1] + b', "Store": false, "Audio": null}'
    answer = post(gateway, body)
    assert answer.status_code == 200, answer.text
    assert served(sim) == 1


def test_other_metadata_still_reaches_a_private_router(router: tuple[Gateway, Sim]) -> None:
    gateway, sim = router
    answer = post(gateway, orjson.dumps({**ASK, "metadata": {"topic": "x", "tags": None}}))
    assert answer.status_code == 200, answer.text
    assert served(sim) == 1
