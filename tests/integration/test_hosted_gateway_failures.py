"""Hosted calls that fail on the gateway's side are clear to the client and seen by operators.

Two hosted backends serve `m` (the policy's fallbacks, in order): `claude` (the Anthropic
mock) and `spare` (a simulator through LiteLLM's OpenAI adapter). No private backend
serves it, so every request goes to them.

- LiteLLM failing to load (a broken install: `aload_litellm` raising) was a 500
  `internal_error` with nothing in the log. It is a 503 `backend_unavailable` saying
  "hosted provider unavailable", no other hosted backend is tried in vain, no breaker is
  charged, and the operator gets a log line with the exception's class and
  `owngate_upstream_errors_total{kind="litellm_load"}`.
- A backend failing every request before it sends (kind `untranslated`: a malformed
  credential) was only a counter. It is logged too, naming the backend and the error's
  class, never the client's text or the exception's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.sim import SimApp, SimSettings, create_sim_app
from gateway.upstream import hosted_prepare
from gateway.upstream.hosted import HostedClient
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    TENANT_KEY,
    admin_status,
    anthropic_backend,
    gateway_config,
    hosted_backend,
)

pytestmark = LITELLM_WARNINGS

ANTHROPIC_KEY = "sk-ant-load-0123456789"
ENV = {"HOSTED_KEY": "sk-spare-0123456789", "MOCK_ANTHROPIC_KEY": ANTHROPIC_KEY}
CANARY = "CANARY-71c2-gateway-failure"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: claude}, {backend: spare}]
"""


@dataclass
class Stack:
    url: str
    anthropic: AnthropicMock
    spare: SimApp

    def spare_requests(self) -> int:
        return len(self.spare.captured("/v1/chat/completions"))

    def chat(self) -> httpx.Response:
        doc = {"model": "m", "messages": [{"role": "user", "content": CANARY}], "max_tokens": 8}
        return httpx.post(
            f"{self.url}/v1/chat/completions",
            json=doc,
            headers={"authorization": f"Bearer {TENANT_KEY}"},
            timeout=120,  # the first hosted request imports LiteLLM
        )

    def counter(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return sample.value
        return 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    policies = tmp_path_factory.mktemp("policies")
    (policies / "hosted.yaml").write_text(POLICY)
    anthropic = AnthropicMock(api_key=ANTHROPIC_KEY)
    spare = create_sim_app(SimSettings.for_kind("vllm", models=("m",), zero_latency=True))
    with ServerThread(anthropic) as claude_server, ServerThread(spare) as spare_server:
        config = gateway_config(
            [
                anthropic_backend("claude", claude_server.url),
                hosted_backend("spare", f"{spare_server.url}/v1", "m"),
            ],
            policy={"paths": [str(policies)]},
        )
        with ServerThread(create_app(config, environ=ENV)) as gateway:
            yield Stack(gateway.url, anthropic, spare)


def _breakers_untouched(stack: Stack) -> None:
    for backend in admin_status(stack.url)["backends"]:
        assert backend["breaker"]["state"] == "closed", backend
        assert backend["breaker"]["tenants"] == [], backend


def test_litellm_that_fails_to_load_is_a_clear_503_and_tries_no_other_hosted_backend(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[int] = []

    async def broken_load() -> ModuleType:
        loads.append(1)
        raise ImportError(f"No module named 'litellm.proxy_internals' {CANARY}")

    monkeypatch.setattr(hosted_prepare, "aload_litellm", broken_load)
    stack.anthropic.reset()
    spare_before = stack.spare_requests()
    errors_before = stack.counter(
        "owngate_upstream_errors_total", backend="claude", kind="litellm_load"
    )
    with capture_logs() as logs:
        for _ in range(4):  # past a breaker's failure_threshold (3 by default)
            response = stack.chat()
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "backend_unavailable", error
            assert set(error) == {"message", "type", "param", "code"}, error
            assert response.headers["x-request-id"] in error["message"], error
            # Which backends did not serve, and why, is the operator's (the log line below).
            for internal in ("claude", "spare", "hosted", "ImportError", "litellm", CANARY):
                assert internal not in error["message"], error
    # One load per request: the spare, which would fail the same way, is not tried.
    assert len(loads) == 4
    assert stack.anthropic.received == [] and stack.spare_requests() == spare_before
    _breakers_untouched(stack)
    assert (
        stack.counter("owngate_upstream_errors_total", backend="claude", kind="litellm_load")
        == errors_before + 4
    )
    said = [e for e in logs if e["event"] == "hosted providers unavailable: LiteLLM failed to load"]
    assert said, logs
    assert said[0]["log_level"] == "error" and said[0]["backend"] == "claude", said
    assert said[0]["error_class"] == "ImportError", said
    assert CANARY not in repr(logs) and "proxy_internals" not in repr(logs)
    # LiteLLM loads again (a fixed install): the first backend serves.
    monkeypatch.undo()
    response = stack.chat()
    assert response.status_code == 200, response.text


def test_a_backend_failing_before_it_sends_is_logged_with_its_error_class(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A malformed credential makes LiteLLM raise before anything is sent (its Vertex
    # credentials read raises a bare `Exception`); the spare serves, and the operator is
    # told which backend fails and how, not only by a counter.
    options = HostedClient._options

    def misconfigured(client: HostedClient, provider_model: str) -> dict[str, Any]:
        if client.backend_id == "claude":
            raise Exception(f"Unable to load credentials from {CANARY}")  # as LiteLLM does
        return options(client, provider_model)

    monkeypatch.setattr(HostedClient, "_options", misconfigured)
    with capture_logs() as logs:
        for _ in range(3):
            response = stack.chat()
            assert response.status_code == 200, response.text
    said = [e for e in logs if e["event"].startswith("hosted backend failed before sending")]
    assert said, logs
    assert said[0]["log_level"] == "warning", said
    assert (said[0]["backend"], said[0]["error_class"]) == ("claude", "Exception"), said
    assert CANARY not in repr(logs) and "credentials from" not in repr(logs)
    _breakers_untouched(stack)
