"""DELETE /admin/v1/keys/{digest} against an in-process gateway's admin app, and the
outcomes (`done`, `local`, `failed`) the admin records it wrote would have said."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.admin import keys as admin_keys
from gateway.admin.models import ActionResult
from gateway.api.app import GatewayApp
from gateway.app import admin_app
from gateway.tenants import hash_api_key


def record_outcomes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the admin API's record writer: each record's outcome is appended to the
    list returned, and its log index is its place in that list (1, 2, ...)."""
    outcomes: list[str] = []

    async def act(*args: Any, failed: bool = False, local: bool = False, **kw: Any) -> Any:
        outcomes.append("failed" if failed else "local" if local else "done")
        return ActionResult(
            action="key_revoke", changed=True, change_digest="0" * 64, log_index=len(outcomes)
        )

    monkeypatch.setattr(admin_keys, "act", act)
    return outcomes


def revoke(gateway: GatewayApp, key: str, token: str) -> httpx.Response:
    """The admin API's answer to revoking API key `key`, with admin token `token`."""

    async def delete() -> httpx.Response:
        transport = httpx.ASGITransport(admin_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            digest = hash_api_key(key).removeprefix("sha256:")
            return await http.delete(
                f"/admin/v1/keys/{digest}", headers={"authorization": f"Bearer {token}"}
            )

    return asyncio.run(delete())
