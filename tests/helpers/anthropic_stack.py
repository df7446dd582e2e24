"""A gateway whose only hosted backend is the Anthropic mock, admitted by a zero-retention
policy with the provenance log on: the stack the hosted refusal tests send to.

`anthropic_stack(root, origin)` serves it (optionally with private backends listed before
the mock, e.g. one down so that requests fail over) and yields a `Stack`; `chat` sends one
chat request as the tenant, after clearing what the mock received.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import TENANT_KEY, anthropic_backend, gateway_config

__all__ = ["ANTHROPIC_KEY", "ZERO_RETENTION_POLICY", "Stack", "anthropic_stack", "chat"]

ANTHROPIC_KEY = "sk-ant-stack-0123456789"
ZERO_RETENTION_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: zero, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: claude}]
"""


@dataclass
class Stack:
    url: str
    anthropic: AnthropicMock
    log: Path


@contextlib.contextmanager
def anthropic_stack(
    root: Path, origin: str, private: tuple[dict[str, Any], ...] = ()
) -> Iterator[Stack]:
    """The gateway over `private` then the Anthropic mock (`claude`), its log in `root`."""
    (root / "policies").mkdir()
    (root / "policies" / "zero.yaml").write_text(ZERO_RETENTION_POLICY)
    write_signing_key(root / "log.key", origin)
    anthropic = AnthropicMock(api_key=ANTHROPIC_KEY)
    with ServerThread(anthropic) as claude_server:
        config = gateway_config(
            [*private, anthropic_backend("claude", claude_server.url)],
            policy={"paths": [str(root / "policies")]},
            provenance={
                "dir": str(root / "log"),
                "origin": origin,
                "signing_key_file": str(root / "log.key"),
                "checkpoint_interval_ms": 20,
            },
        )
        app = create_app(config, environ={"MOCK_ANTHROPIC_KEY": ANTHROPIC_KEY})
        with ServerThread(app) as gateway:
            yield Stack(gateway.url, anthropic, root / "log")


def chat(stack: Stack, **fields: Any) -> httpx.Response:
    """One chat request of `fields` (with `model` "m" and `max_tokens` 8 unless given)."""
    stack.anthropic.reset()
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        json={"model": "m", "max_tokens": 8, **fields},
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=120,  # the first hosted request imports LiteLLM
    )
