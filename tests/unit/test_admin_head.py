"""`HEAD` on every GET route of the admin app answers as the GET does, its head alone.

auth.py (and docs/admin-api.md) let a tokenless loopback client use every role's GET and
HEAD endpoints, but FastAPI routes take GET only: every HEAD was a 405. Now a HEAD is the
GET's status and headers (`Content-Length` the GET body's length), with no body bytes.
Parametrised over the admin app's route table, so a GET route added later is covered."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

LOOPBACK = ("127.0.0.1", 40000)
LISTENER = "127.0.0.1:9090"
# Path parameters filled in: a key digest, a request id, a tile, an asset.
FILLED = {"{digest}": "cd" * 32, "{request_id}": "req_0", "{path:path}": "0/000", "{name}": "x"}


def _app() -> Any:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": ["sha256:" + "cd" * 32], "models": ["*"]}],
        "admin": {"allow_loopback": True},
    }
    return admin_app(create_app(GatewaySettings.model_validate(config)))


def _path(template: str) -> str:
    for name, value in FILLED.items():
        template = template.replace(name, value)
    assert "{" not in template, f"fill in the path parameter of {template}"
    return template


GETS = sorted(
    {c.path for c in iter_route_contexts(_app().routes) if c.path and "GET" in (c.methods or ())}
)
# Answers that do not change between two calls: their lengths must match byte for byte.
STABLE = ("/openapi.json", "/admin/v1/whoami", "/admin/v1/keys", "/console/")


def _pair(app: Any, path: str) -> tuple[httpx.Response, httpx.Response]:
    async def run() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{LISTENER}") as http:
            return await http.get(path), await http.head(path)

    return asyncio.run(run())


def test_the_table_holds_the_documented_reads() -> None:
    assert set(STABLE) | {"/admin/v1/status", "/log/checkpoint"} <= set(GETS), GETS


@pytest.mark.parametrize("path", GETS)
def test_head_answers_every_get_route_as_get_without_a_body(path: str) -> None:
    got, head = _pair(_app(), _path(path))
    assert head.status_code == got.status_code != 405, (head.status_code, got.text)
    assert head.content == b""
    assert head.headers.get("content-type") == got.headers.get("content-type")
    if path in STABLE:
        assert head.headers["content-length"] == str(len(got.content)), head.headers


def test_head_on_a_write_route_is_still_refused_without_a_token() -> None:
    got, head = _pair(_app(), "/admin/v1/drain")  # POST only: GET and HEAD are 405
    assert got.status_code == head.status_code == 405
    assert head.content == b""
