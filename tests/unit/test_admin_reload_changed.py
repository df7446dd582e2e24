"""`POST /admin/v1/reload` says whether it changed what the gateway enforces: a reload
that made an edited policy file's set active (gateway.yaml unchanged) answers `changed:
true` with the new set's digest in its change, and one that found nothing new answers
`changed: false`. The operator reads `changed` to know whether the edit took effect."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import admin_app, create_app
from gateway.config import load_config
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import versioned_policy

TOKEN = "og-admin-reload-token"


def test_a_reload_that_activates_an_edited_policy_set_says_it_changed(tmp_path: Path) -> None:
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    policy.write_text(versioned_policy("1", '"*"'))
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    data["policy"] = {"paths": ["policies"], "reload_interval_s": 3600}  # no watcher runs
    data["admin"] = {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    gateway = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    assert gateway.reloader is not None
    admin = admin_app(gateway)
    before = gateway.policies.current.digest

    async def reload() -> dict[str, Any]:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answer = await http.post(
                "/admin/v1/reload", headers={"authorization": f"Bearer {TOKEN}"}
            )
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    policy.write_text(versioned_policy("2", '"*"'))
    edited = asyncio.run(reload())
    after = gateway.policies.current.digest
    assert after != before  # the reload made the edited set active
    assert edited["changed"] is True, edited
    assert asyncio.run(reload())["changed"] is False  # nothing new the second time
