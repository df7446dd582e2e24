"""A fault of the admin API itself is answered with the security headers too
(gateway/admin/headers.py): Starlette answers an unhandled exception from its
`ServerErrorMiddleware`, outside every middleware the app adds, so `ApiHeaders` never saw
that 500 (no `nosniff`, no sandboxing CSP, no `no-store`, framing allowed)."""

from __future__ import annotations

import asyncio
import hashlib

import httpx

from gateway.admin.headers import API_HEADERS
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-fault-token"


def test_a_fault_of_the_admin_api_carries_the_security_headers() -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))

    @app.get("/admin/v1/fault")
    async def fault() -> None:  # a fault of an endpoint, as a bug would raise one
        raise RuntimeError("a fault")

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            return await http.get("/admin/v1/fault")

    answer = asyncio.run(run())
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "internal_error"
    for name, value in API_HEADERS:
        assert answer.headers.get(name.decode()) == value.decode(), name
