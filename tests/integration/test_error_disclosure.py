"""What a tenant learns when no backend served its request: nothing of the operator's
backends (ids, addresses, probe or connect failures), on a real `owngate serve`.

The 503 used to name them (`private pool unavailable: gpu-secret-7: ...`,
`no compliant backend could take the request ... (gpu-secret-7: connect)`); which backends
failed, and why, is on `/admin/status` only (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess

SECRET_ID = "gpu-secret-7"
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("sim-model",), zero_latency=True)


@pytest.fixture
def gateway(sim: Sim, tmp_path: Path) -> Iterator[GatewayProcess]:
    """`owngate serve` with one private backend, `SECRET_ID`, and no hosted fallback."""
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "error", "access_log": False},
        "backends": [backend(SECRET_ID, sim.url, "sim-model")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
    }
    process = GatewayProcess(config, tmp_path).start()
    yield process
    process.stop()


def test_a_503_names_no_backend_nor_its_failure(sim: Sim, gateway: GatewayProcess) -> None:
    """The only backend goes away: each request's 503 (the failed attempt's
    `backend_unavailable`, then, once the backend is taken out, the refusal's
    `no_compliant_backend`) says neither the backend's id, its address nor how it failed,
    and names the request's id."""
    port = sim.url.rsplit(":", 1)[1]
    sim.server.stop()
    codes: set[str] = set()
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        for _ in range(20):  # the breaker opens after a few failed attempts
            response = client.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {TENANT_KEY}"},
            )
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            message = error["message"]
            for secret in (SECRET_ID, port, "127.0.0.1", "connect", "failed", "health"):
                assert secret not in message, (secret, message)
            assert response.headers["x-request-id"] in message
            codes.add(error["code"])
            if error["code"] == "no_compliant_backend":
                break
    assert codes == {"backend_unavailable", "no_compliant_backend"}, codes
