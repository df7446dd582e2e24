"""A hosted model LiteLLM serves through a Responses API is asked to store nothing.

OpenAI's Responses API (and Azure's, xAI's) keeps every response 30 days unless the
request says `"store": false`. LiteLLM 1.108.7 sends a chat or text completion of a model
its model map lists as `mode: responses` (`o3-pro`, `gpt-5-pro`, codex models; Azure's
deployments of them), or named with a `responses/` part, to that API, and its bridge
built the request without `store`: a backend the policy admitted for zero-day, zero-data
retention had its prompts and answers kept. Now every bridged request carries `"store":
false` (gateway/upstream/responses_bridge.py), and no `background`,
`previous_response_id` or `conversation` a client sent reaches it.

Each provider's backend points at the same Responses mock (tests/helpers/
responses_mock.py), which records what arrived.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.upstream.litellm_runtime import load_litellm
from gateway.upstream.responses_bridge import BRIDGE, install_unstored_bridge
from tests.helpers.gateways import LITELLM_WARNINGS, TENANT_KEY, gateway_config, hosted_backend
from tests.helpers.responses_mock import Received, ResponsesMock

pytestmark = LITELLM_WARNINGS

ENV = {"HOSTED_KEY": "sk-bridge-0123456789"}
# The gateway's model name -> (backend, LiteLLM's provider model, base path at the mock).
MODELS: dict[str, tuple[str, str, str]] = {
    "o3-pro": ("openai", "openai/o3-pro", "/v1"),
    "gpt-5-pro": ("openai", "openai/gpt-5-pro", "/v1"),
    "gpt-5-codex": ("openai", "openai/gpt-5-codex", "/v1"),
    "gpt-4o-responses": ("openai", "openai/responses/gpt-4o", "/v1"),
    "azure-o3-pro": ("azure", "azure/o3-pro", ""),
    "azure-deployment": ("azure", "azure/responses/eu-deployment", ""),
    "grok": ("xai", "xai/grok-4.20-multi-agent", "/v1"),
    "databricks-gpt": ("databricks", "databricks/databricks-gpt-5-5", ""),
    "sonar": ("perplexity", "perplexity/openai/gpt-5.2", ""),
}
BACKENDS = sorted({backend for backend, _, _ in MODELS.values()})
POLICY = f"""\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: zero, version: "1"}}
spec:
  tenants: [acme]
  residency: {{allow: [eu]}}
  retention: {{max_days: zero}}
  fallback:
    mode: when_private_unavailable
    to: [{", ".join(f"{{backend: {b}}}" for b in BACKENDS)}]
"""
USER = [{"role": "user", "content": "keep nothing of this"}]


@dataclass
class Stack:
    url: str
    provider: ResponsesMock


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("bridge")
    (root / "policies").mkdir()
    (root / "policies" / "zero.yaml").write_text(POLICY)
    provider = ResponsesMock()
    with ServerThread(provider) as server:
        backends = []
        for backend in BACKENDS:
            served = {m: v for m, v in MODELS.items() if v[0] == backend}
            (path,) = {v[2] for v in served.values()}
            models = [{"name": m, "provider_model": v[1]} for m, v in served.items()]
            # the mock is on loopback, not at an Azure endpoint
            unchecked = {"unsafe_unchecked_azure_host": True} if backend == "azure" else {}
            backends.append(
                hosted_backend(
                    backend,
                    f"{server.url}{path}",
                    provider=backend,
                    models=models,
                    owner=backend,
                    **unchecked,
                )
            )
        config = gateway_config(backends, policy={"paths": [str(root / "policies")]})
        with ServerThread(create_app(config, environ=ENV)) as gateway:
            yield Stack(gateway.url, provider)


def post(stack: Stack, endpoint: str, **fields: Any) -> httpx.Response:
    stack.provider.reset()
    return httpx.post(
        f"{stack.url}/v1/{endpoint}",
        json=fields,
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=120,  # the first hosted request imports LiteLLM
    )


def the_responses_request(stack: Stack) -> Received:
    (received,) = stack.provider.received
    assert received.path.endswith("/responses"), received.path
    return received


@pytest.mark.parametrize("model", list(MODELS))
def test_a_bridged_chat_completion_asks_the_provider_to_store_nothing(
    stack: Stack, model: str
) -> None:
    answer = post(stack, "chat/completions", model=model, messages=USER)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == stack.provider.reply
    assert the_responses_request(stack).body["store"] is False


def test_a_bridged_stream_asks_the_provider_to_store_nothing(stack: Stack) -> None:
    answer = post(stack, "chat/completions", model="o3-pro", messages=USER, stream=True)
    assert answer.status_code == 200, answer.text
    events = [line.removeprefix("data: ") for line in answer.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    text = "".join(
        (choice["delta"].get("content") or "")
        for event in events[:-1]
        for choice in orjson.loads(event)["choices"]
    )
    assert text == stack.provider.reply
    received = the_responses_request(stack)
    assert (received.body["stream"], received.body["store"]) == (True, False)


def test_a_bridged_text_completion_asks_the_provider_to_store_nothing(stack: Stack) -> None:
    # LiteLLM serves a text completion of a `mode: responses` model through the same bridge.
    answer = post(stack, "completions", model="o3-pro", prompt="keep nothing", max_tokens=16)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == stack.provider.reply
    assert the_responses_request(stack).body["store"] is False


@pytest.mark.parametrize(
    "state",
    [
        {"background": True},
        {"previous_response_id": "resp_earlier0001"},
        {"conversation": "conv_earlier0001"},
    ],
)
def test_provider_side_state_a_client_asks_for_never_reaches_the_bridge(
    stack: Stack, state: dict[str, Any]
) -> None:
    # A Responses API field on a chat is not sent: refused (it was left out unsaid, and
    # the answer made without the earlier response was a 200: unsent_fields.py).
    refused = post(stack, "chat/completions", model="gpt-5-pro", messages=USER, **state)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "upstream_bad_request"
    assert stack.provider.received == []
    answer = post(
        stack,
        "chat/completions",
        model="gpt-5-pro",
        messages=USER,
        store=False,
        metadata={"keep": "forever"},
    )
    assert answer.status_code == 200, answer.text
    body = the_responses_request(stack).body
    assert body["store"] is False
    assert "metadata" not in body


def test_a_client_asking_a_bridged_model_to_store_is_refused(stack: Stack) -> None:
    refused = post(stack, "chat/completions", model="o3-pro", messages=USER, store=True)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "store"
    assert stack.provider.received == []


def test_the_bridge_step_is_wrapped_once() -> None:
    load_litellm()  # installs it
    module_name, class_name, method_name = BRIDGE
    owner = getattr(importlib.import_module(module_name), class_name)
    wrapped = getattr(owner, method_name)
    install_unstored_bridge()
    assert getattr(owner, method_name) is wrapped
    assert getattr(wrapped.__wrapped__, "__wrapped__", None) is None  # LiteLLM's own
