"""Paths the admin API does not define are 404 error objects: never a redirect built from
the client's `Host` header (Starlette's trailing-slash redirect)."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-paths-token"


@pytest.mark.parametrize(
    "path",
    ["/admin/v1/status/", "/admin/v1/keys/", "/admin//v1/status", "/openapi.json/"],
)
def test_a_path_the_api_lacks_is_a_404_error_object_never_a_redirect(path: str) -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            headers = {"authorization": f"Bearer {TOKEN}", "host": "evil.example"}
            return await http.get(path, headers=headers)

    answer = asyncio.run(run())
    assert "location" not in answer.headers
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
