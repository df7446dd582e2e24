"""A hosted backend's `proxy` that accepts the connection and never answers CONNECT fails
the attempt at `limits.connect_timeout_s`, on httpx's transport too
(gateway/upstream/hosted_tunnel.py).

LiteLLM serves some providers (`oobabooga/` here) only synchronously, on its sync httpx
client, which read the proxy's answer to CONNECT with the call's first-byte timeout (120 s
by default): each attempt, and its client, waited that long before failing over.
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
CLIENT_S = 30.0  # a quarter of the first-byte timeout: a gateway that waits for it fails here


@pytest.fixture
def proxy() -> Iterator[SilentServer]:
    with silent_server() as server:
        yield server


def test_a_proxy_that_never_answers_connect_fails_at_the_connect_timeout(
    proxy: SilentServer, start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    (tmp_path / "policy.yaml").write_text(HOSTED_ONLY_POLICY)
    backend = hosted_backend(
        "hosted",
        "https://provider.invalid/v1",
        "m",
        provider="oobabooga",
        proxy=f"http://127.0.0.1:{proxy.port}",
        models=[{"name": "m", "provider_model": "oobabooga/m"}],
    )
    gateway = start_gateway(
        [backend],
        policy={"paths": [str(tmp_path)]},
        environ={"HOSTED_KEY": "test-key"},
        limits={"connect_timeout_s": CONNECT_S},  # the first-byte timeout stays 120 s
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=CLIENT_S
    )
    assert response.status_code in (502, 503, 504), response.text
    assert response.json()["error"]["type"], response.text
    assert proxy.heard.is_set()  # the CONNECT reached the proxy, which never answered
    # and the gateway gave the connection up (not left it open for the first-byte timeout)
    assert proxy.closed.acquire(timeout=CLIENT_S)
