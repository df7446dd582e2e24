"""A hosted provider's connection opens within `limits.connect_timeout_s`, TLS handshake
included, as a private backend's does (gateway/upstream/hosted_sockets.py).

LiteLLM hands aiohttp its `timeout` (the first-byte timeout, 120 s by default) for
connecting, and the event loop gives a TLS handshake 60 s of its own: a provider address
that accepted the connection and never answered the handshake (a stuck load balancer, a
firewall that swallows, a plain-HTTP port behind an `https://` URL) held every attempt a
minute before it failed over, and its client with it (the secret canary sweep's `tls`
backend timed a 60 s client out in CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, hosted_backend
from tests.helpers.silent_server import SilentServer, silent_server

pytestmark = LITELLM_WARNINGS

CONNECT_S = 0.5
CLIENT_S = 30.0  # half the handshake's own minute: a gateway that waits for it fails here


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with silent_server() as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_that_never_finishes_the_handshake_fails_at_the_connect_timeout(
    silent: SilentServer, start_gateway: Callable[..., Gateway], tmp_path: Path, stream: bool
) -> None:
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway = start_gateway(
        [hosted_backend("hosted", f"https://127.0.0.1:{silent.port}/v1", "m")],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"connect_timeout_s": CONNECT_S},  # the first-byte timeout stays 120 s
    )
    ask = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=CLIENT_S
    )
    assert response.status_code in (502, 503, 504), response.text
    assert response.json()["error"]["type"], response.text
    assert silent.accepted >= 1  # the provider's address was reached: the handshake stalled
    # and the gateway gave the connection up (not left it open for the handshake's minute)
    assert silent.closed.acquire(timeout=CLIENT_S)
