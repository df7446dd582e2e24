"""What a hosted provider (a simulator behind LiteLLM's OpenAI adapter) receives of a
client's request through a real gateway, and which hosted models a policy keeps out.

Found by a red-team pass over the request path: a `models` deny that a public name
escaped, `stream_options` sent on whole, and `user` lost on chat.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.upstream.tenant_ids import scoped_identifier
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    hosted_backend,
)

pytestmark = LITELLM_WARNINGS

TIMEOUT = 120  # the first request imports LiteLLM


def start(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    models: list[dict[str, Any]],
    policy: str = HOSTED_ONLY_POLICY,
) -> tuple[Gateway, Sim]:
    """A gateway whose only backend, `hosted`, is a simulator serving `m` and `gpt-4o`."""
    sim = start_sim("vllm", models=("m", "gpt-4o"), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(policy)
    settings = {**hosted_backend("hosted", f"{sim.url}/v1"), "models": models}
    gateway = start_gateway(
        [settings],
        environ={"HOSTED_KEY": "sk-provider"},
        policy={"paths": [str(tmp_path / "policies")]},
    )
    return gateway, sim


@pytest.fixture
def rig(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim]:
    return start(start_sim, start_gateway, tmp_path, [{"name": "m", "provider_model": "openai/m"}])


def post(gateway: Gateway, path: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=doc, headers=gateway.headers, timeout=TIMEOUT)


def last_body(sim: Sim, path: str) -> dict[str, Any]:
    captured = sim.app.captured(path)
    assert captured, path
    body: dict[str, Any] = orjson.loads(captured[-1].body)
    return body


def test_only_known_stream_options_reach_the_provider(rig: tuple[Gateway, Sim]) -> None:
    """A client's `stream_options` went to LiteLLM whole: the provider received
    `{"x": 1, "include_obfuscation": true, ...}`. Now the provider gets `include_usage`
    alone: `include_obfuscation` (padding) and keys that ask for nothing are left out, and
    any other key is refused as top-level fields outside the allowlist are
    (tests/unit/test_hosted_request_fields.py)."""
    gateway, sim = rig
    options = {"include_usage": False, "x": None, "include_obfuscation": True}
    for path, doc in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        body = {"model": "m", "max_tokens": 2, "stream": True, "stream_options": options, **doc}
        response = post(gateway, path, body)
        assert response.status_code == 200, response.text
        assert response.text.endswith("data: [DONE]\n\n")
        assert '"usage"' not in response.text  # the client did not ask for it
        assert last_body(sim, path)["stream_options"] == {"include_usage": True}, path


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_user_reaches_the_provider_as_the_tenants_digest(
    rig: tuple[Gateway, Sim], path: str
) -> None:
    """docs/api.md: `user` is forwarded as the tenant's own identifier. On chat it never
    arrived: LiteLLM sends `user` only for a model in its OpenAI catalog."""
    gateway, sim = rig
    doc: dict[str, Any] = {"model": "m", "max_tokens": 2, "user": "end-user-7"}
    if path == "/v1/chat/completions":
        doc["messages"] = [{"role": "user", "content": "hi"}]
        doc["safety_identifier"] = "end-user-7"
    else:
        doc["prompt"] = "hi"
    response = post(gateway, path, doc)
    assert response.status_code == 200, response.text
    sent = last_body(sim, path)
    digest = scoped_identifier("acme", "end-user-7")
    assert sent["user"] == digest
    if path == "/v1/chat/completions":
        assert sent["safety_identifier"] == digest


DENY_GPT_4O = HOSTED_ONLY_POLICY + '  models: {deny: ["gpt-4o*"]}\n'


def test_a_models_deny_holds_for_a_hosted_model_under_any_public_name(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The operator serves `openai/gpt-4o` as `fast` (and `m` as itself); the security
    team's policy denies `gpt-4o*`. `fast` used to be sent: the rule judged only the
    public name. Now it is refused, and nothing reaches the provider: the 404 of a model
    that does not exist, since the policy hides it from the tenant's `/v1/models`."""
    models: list[dict[str, Any]] = [
        {"name": "fast", "aliases": ["quick"], "provider_model": "openai/gpt-4o"},
        {"name": "m", "provider_model": "openai/m"},
    ]
    gateway, sim = start(start_sim, start_gateway, tmp_path, models, DENY_GPT_4O)
    for name in ("fast", "quick"):
        doc = {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        response = post(gateway, "/v1/chat/completions", doc)
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "model_not_found"
    assert sim.app.captured("/v1/chat/completions") == []
    ok = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert post(gateway, "/v1/chat/completions", ok).status_code == 200  # the rig works
