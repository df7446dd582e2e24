"""One tenant key check (gateway/api/tenant_auth.py `TenantAuth`) serves both tenant surfaces:
the proxied paths (`TenantSurface`) and the read-only ones (`TenantReads`: `/v1/models`,
`/v1/provenance/...`). It reads the parts active now on every request, so a key a config
reload removed, or one revoked in the state, is refused on every path at once: none of
them may keep the key index or the revocations of an earlier config.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.waiting import until

ACME = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
OTHER_KEY_HASH = hash_api_key("og-test-a-new-key-for-acme-0123")
_CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}


def write_config(path: Path, url: str, tenants: list[dict[str, Any]]) -> None:
    config = gateway_config([backend("gpu", url, "m")], tenants=tenants)
    path.with_suffix(".tmp").write_text(
        yaml.safe_dump(config.model_dump(mode="json", exclude_none=True))
    )
    path.with_suffix(".tmp").replace(path)  # atomic, as a deploy tool would write it


def _statuses(url: str) -> dict[str, int]:
    """What each tenant path answers the tenant's key."""
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        return {
            "chat": http.post("/v1/chat/completions", json=_CHAT).status_code,
            "models": http.get("/v1/models").status_code,
            "receipt": http.get("/v1/provenance/receipts/req_0").status_code,
        }


def test_a_key_removed_by_a_reload_or_revoked_is_refused_on_every_tenant_path(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    path = tmp_path / "gateway.yaml"
    write_config(path, sim.url, [ACME])
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    refused = {"chat": 401, "models": 401, "receipt": 401}
    try:
        accepted = _statuses(server.url)
        assert accepted["chat"] == accepted["models"] == 200, accepted
        assert accepted["receipt"] != 401, accepted  # the key passed; no such receipt
        # Removed from the config by a reload: refused everywhere.
        arrival = app.parts
        write_config(path, sim.url, [{**ACME, "api_key_hashes": [OTHER_KEY_HASH]}])
        until(lambda: app.parts is not arrival, "the reload", timeout=30.0)
        assert _statuses(server.url) == refused
        # Given back by the next reload, then revoked in the state: refused everywhere.
        arrival = app.parts
        write_config(path, sim.url, [ACME])
        until(lambda: app.parts is not arrival, "the second reload", timeout=30.0)
        assert _statuses(server.url) == accepted
        assert asyncio.run(app.parts.state.revoke_key(hash_api_key(TENANT_KEY)))
        assert _statuses(server.url) == refused
    finally:
        server.stop()
