"""A malformed request shape sent to a hosted backend is the client's 400, never the
provider's failure.

LiteLLM translates an OpenAI request for the provider before sending it, and its adapters
raise on shapes they cannot read (`TypeError`, `KeyError`, ...; LiteLLM 1.108.7 wraps them
as `APIConnectionError`, 500). The gateway read that as the provider failing: the client
got 502/503 instead of a 400 naming the field, and the request went on to the next
hosted backend the policy lists. Now the shapes are checked before LiteLLM sees them
(gateway/upstream/openai_shapes.py), and a failure LiteLLM raises before any HTTP request
began (gateway/upstream/hosted_transport.py) is no provider's failure: the next backend
may serve it (its adapter may translate the shape), and if none does, it is the client's
400.

Two tenants share the hosted backends: `claude` (the Anthropic mock, first) and `spare`
(a simulator through LiteLLM's OpenAI adapter). After each of acme's malformed requests,
neither provider got anything, no breaker holds a failure, and globex is served.
Hosted providers have circuit breakers (tests/integration/test_hosted_breaker.py): the
breaker assertions say none of these requests is counted on them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.config.schema import BackendSettings
from gateway.serving import ServerThread
from gateway.sim import SimApp, SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from gateway.upstream.hosted import HostedClient, HostedError
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    admin_status,
    anthropic_backend,
    gateway_config,
    hosted_backend,
)
from tests.helpers.hosted_shapes import mutated
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

ANTHROPIC_KEY = "sk-ant-shapes-0123456789"
ENV = {"HOSTED_KEY": "sk-spare-0123456789", "MOCK_ANTHROPIC_KEY": ANTHROPIC_KEY}
CANARY = "CANARY-3f9b-shape-value"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted, version: "1"}
spec:
  tenants: [acme, globex]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: claude}, {backend: spare}]
"""
USER = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@dataclass
class Stack:
    url: str
    anthropic: AnthropicMock
    spare: SimApp

    def spare_requests(self) -> int:
        return sum(len(self.spare.captured(p)) for p in ("/v1/chat/completions", "/v1/completions"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    policies = tmp_path_factory.mktemp("policies")
    (policies / "hosted.yaml").write_text(POLICY)
    anthropic = AnthropicMock(api_key=ANTHROPIC_KEY)
    spare = create_sim_app(SimSettings.for_kind("vllm", models=("m",), zero_latency=True))
    with ServerThread(anthropic) as claude_server, ServerThread(spare) as spare_server:
        claude = anthropic_backend("claude", claude_server.url)
        config = gateway_config(
            [claude, hosted_backend("spare", f"{spare_server.url}/v1", "m")],
            policy={"paths": [str(policies)]},
            tenants=[
                {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
                {"id": "globex", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]},
            ],
        )
        with ServerThread(create_app(config, environ=ENV)) as gateway:
            yield Stack(gateway.url, anthropic, spare)


def post(stack: Stack, key: str, path: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{stack.url}{path}",
        json={"model": "m", **doc},
        headers={"authorization": f"Bearer {key}"},
        timeout=120,  # the first hosted request imports LiteLLM
    )


def chat(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"messages": [USER], "max_tokens": 8, **fields}


def user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


# (request, the `param` the 400 names; None: LiteLLM's own refusal, the field unknown)
SHAPES: dict[str, tuple[tuple[str, dict[str, Any]], str | None]] = {
    # Sent on to the provider as it came (an Anthropic 400 at best).
    "tool_choice a bare string": (chat(tool_choice="function"), "tool_choice"),
    "text part of a number": (
        chat(messages=user({"type": "text", "text": 5})),
        "messages[0].content[0].text",
    ),
    # LiteLLM's own 400, naming no field.
    "named tool_choice without a name": (
        chat(tool_choice={"type": "function"}),
        "tool_choice.function",
    ),
    "image_url of a number": (
        chat(messages=user({"type": "image_url", "image_url": 1})),
        "messages[0].content[0].image_url",
    ),
    "tool result without its call id": (
        chat(
            messages=[
                USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "content": "42"},
            ]
        ),
        "messages[2].tool_call_id",
    ),
    # LiteLLM raised TypeError/KeyError/AttributeError: 502/503, the next backend tried.
    "tool_choice function as a string": (
        chat(tool_choice={"type": "function", "function": CANARY}),
        "tool_choice.function",
    ),
    "tool parameters of a number": (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]),
        "tools[0].function.parameters",
    ),
    "custom tool without its definition": (chat(tools=[{"type": "custom"}]), "tools[0].custom"),
    "tool parameters with null properties": (
        chat(
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"properties": None}}}
            ]
        ),
        "tools[0].function.parameters.properties",
    ),
    "tool_calls not an array": (
        chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": 5}]),
        "messages[1].tool_calls",
    ),
    "json_schema format without its schema": (
        chat(response_format={"type": "json_schema"}),
        "response_format.json_schema",
    ),
    "prompt of mixed types": (("/v1/completions", {"prompt": [5, CANARY]}), "prompt[1]"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_malformed_shape_is_the_clients_400_and_no_providers_failure(
    stack: Stack, shape: str
) -> None:
    (path, doc), param = SHAPES[shape]
    stack.anthropic.reset()
    spare_before = stack.spare_requests()
    for _ in range(4):  # past a breaker's failure_threshold (3 by default)
        response = post(stack, TENANT_KEY, path, doc)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "upstream_bad_request",
            param,
        )
        assert "not sent" in error["message"], error["message"]
        assert CANARY not in error["message"] and len(error["message"]) < 300
    assert stack.anthropic.received == []  # nothing left the gateway...
    assert stack.spare_requests() == spare_before  # ...nor went on to the next backend
    for backend in admin_status(stack.url)["backends"]:
        assert backend["breaker"]["state"] == "closed", backend
        assert backend["breaker"]["tenants"] == [], backend
    served = post(stack, OTHER_KEY, *chat())  # another tenant: served by the first provider
    assert served.status_code == 200, served.text
    assert len(stack.anthropic.received) == 1


# -- the mark that a request began: a provider's failure stays the provider's ------------


def _client(url: str, provider_model: str, key_env: str) -> HostedClient:
    provider = provider_model.split("/", 1)[0]
    backend = BackendSettings.model_validate(
        {
            "id": f"{provider}-junk",
            "kind": "hosted",
            "provider": provider,
            "base_url": url,
            "api_key_env": key_env,
            "owner": provider,
            "models": [{"name": "m", "provider_model": provider_model}],
            "region": "eu-west-1",
        }
    )
    return HostedClient(backend, environ=ENV, timeout_s=10.0)


def _failure(client: HostedClient, endpoint: str, doc: dict[str, Any]) -> HostedError:
    async def scenario() -> HostedError:
        try:
            await client.send(endpoint, doc, "m")  # type: ignore[arg-type]
        except HostedError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the junk answer was taken")

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("provider_model", "suffix", "endpoint", "doc"),
    [
        ("openai/m", "/v1", "chat", {"messages": [USER]}),
        ("openai/m", "/v1", "chat", {"messages": [USER], "stream": True}),
        ("openai/m", "/v1", "completions", {"prompt": "hi"}),
        ("openai/m", "/v1", "embeddings", {"input": "hi"}),
        ("anthropic/claude-mock-1", "", "chat", {"messages": [USER]}),
        ("anthropic/claude-mock-1", "", "chat", {"messages": [USER], "stream": True}),
    ],
)
def test_an_answer_that_cannot_be_read_is_still_the_providers_failure(
    start_raw: Callable[[Answer], RawBackend],
    provider_model: str,
    suffix: str,
    endpoint: str,
    doc: dict[str, Any],
) -> None:
    # LiteLLM fails to read the answer with the same kinds of error an adapter raises on
    # a request it cannot translate (a JSON or key error); the request was sent, so it
    # is the provider's failure (the next backend may serve), never the client's 400.
    # Each HTTP path LiteLLM takes here must mark the call: one that did not would be
    # read as "not sent".
    junk = b"{" + orjson.dumps({"unexpected": [CANARY]})  # not JSON
    provider = start_raw(json_answer(junk))
    key_env = "MOCK_ANTHROPIC_KEY" if provider_model.startswith("anthropic") else "HOSTED_KEY"
    client = _client(provider.url + suffix, provider_model, key_env)
    error = _failure(client, endpoint, {"model": "m", **doc})
    assert len(provider.posts) == 1
    assert error.status != 400 and "not sent" not in error.message, error.message
    assert CANARY not in error.message


def test_no_malformed_shape_reaches_another_backend_or_a_breaker(stack: Stack) -> None:
    # A seeded walk of broken chat documents (tests/helpers/hosted_shapes.py): each is the
    # first provider's answer or the client's 400, never a failure that could count
    # against a provider. The next backend gets only what the first never received (a
    # shape its adapter could not translate, sent nowhere), and answers it.
    rng = random.Random(1203)
    statuses: list[int] = []
    for _ in range(150):
        doc = mutated(rng)
        spare_before, first_before = stack.spare_requests(), len(stack.anthropic.received)
        response = post(stack, TENANT_KEY, "/v1/chat/completions", doc)
        statuses.append(response.status_code)
        assert response.status_code in (200, 400), (doc, response.text)
        assert CANARY not in response.text or response.status_code == 200, response.text
        if stack.spare_requests() != spare_before:
            assert len(stack.anthropic.received) == first_before, doc
            assert response.status_code == 200, (doc, response.text)
    assert statuses.count(400) > 50  # the walk did break shapes
    for backend in admin_status(stack.url)["backends"]:
        assert backend["breaker"]["state"] == "closed", backend
        assert backend["breaker"]["tenants"] == [], backend


# -- not sent: no verdict on the provider, but the next backend may serve -----------------


def _breakers_untouched(stack: Stack) -> None:
    for backend in admin_status(stack.url)["backends"]:
        assert backend["breaker"]["state"] == "closed", backend
        assert backend["breaker"]["tenants"] == [], backend


@pytest.mark.parametrize("doc", [{"prompt": [1, 2, 3]}, {"prompt": [[1, 2], [3]], "stream": True}])
def test_a_shape_one_adapter_cannot_translate_goes_to_the_next(
    stack: Stack, doc: dict[str, Any]
) -> None:
    # Token-id prompts are OpenAI's own shape, which LiteLLM's Anthropic adapter cannot
    # translate (it raises before any request begins): the spare (OpenAI) serves them,
    # and the Anthropic backend's breaker holds nothing.
    stack.anthropic.reset()
    spare_before = stack.spare_requests()
    for _ in range(4):  # past a breaker's failure_threshold (3 by default)
        response = post(stack, TENANT_KEY, "/v1/completions", doc)
        assert response.status_code == 200, response.text
    assert stack.anthropic.received == []
    assert stack.spare_requests() == spare_before + 4
    _breakers_untouched(stack)


def test_a_backend_failing_before_it_sends_fails_over_and_keeps_its_breaker(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway's own misconfiguration fails before any request is sent, the way a
    # client's untranslatable input does (LiteLLM's Vertex credentials read raises a bare
    # `Exception` on a malformed key). It was the client's 400 with no failover: every
    # request to such a backend failed. Now the next backend serves, and no breaker is
    # charged; only when every backend fails so is it the client's 400.
    broken: set[str] = {"claude"}
    options = HostedClient._options

    def misconfigured(client: HostedClient, provider_model: str) -> dict[str, Any]:
        if client.backend_id in broken:
            raise Exception("Unable to load credentials")  # as LiteLLM raises it
        return options(client, provider_model)

    monkeypatch.setattr(HostedClient, "_options", misconfigured)
    stack.anthropic.reset()
    spare_before = stack.spare_requests()
    for _ in range(4):  # past a breaker's failure_threshold (3 by default)
        response = post(stack, TENANT_KEY, *chat())
        assert response.status_code == 200, response.text
    assert stack.anthropic.received == []
    assert stack.spare_requests() == spare_before + 4
    _breakers_untouched(stack)
    broken.add("spare")  # nothing left to serve: the client's 400, naming the class only
    response = post(stack, TENANT_KEY, *chat())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_bad_request", error
    assert "not sent" in error["message"] and "could not translate" in error["message"]
    assert "credentials" not in error["message"], error["message"]
    assert stack.spare_requests() == spare_before + 4
    _breakers_untouched(stack)
