"""A full tile or entry bundle never changes, so the auditor's client may keep it for a
year; but it is served to the auditor role alone, so no shared cache may keep it: a
response to a request with `Authorization` that says `public` may be stored by a caching
proxy in front of the admin listener and served to the next client, token or not
(RFC 9111 section 3.5)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-tile-caching-token"


@pytest.mark.parametrize("path", ["tile/0/000", "tile/entries/000"])
def test_a_full_tile_may_be_kept_by_the_auditors_client_alone(tmp_path: Path, path: str) -> None:
    tile = tmp_path / "log" / path
    tile.parent.mkdir(parents=True)
    tile.write_bytes(b"\x00" * 32 * 256)
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": "tiles.test/log", "signing_key_file": "log.key"},
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.get(f"/log/{path}", headers={"authorization": f"Bearer {TOKEN}"})

    answer = asyncio.run(run())
    assert answer.status_code == 200, answer.text
    assert answer.content == tile.read_bytes()
    directives = {d.strip() for d in answer.headers["cache-control"].split(",")}
    assert "private" in directives
    assert not directives & {"public", "s-maxage"}
    assert {"immutable", "max-age=31536000"} <= directives
