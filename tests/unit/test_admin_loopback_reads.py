"""`admin.allow_loopback` (the demo) lets a loopback client read the admin API without a
token, never change anything: every route of the admin app that takes a method other than
GET or HEAD (reload, drain, tenant key creation and revocation, and the POSTs that only
compute an answer) needs a token. Without this, any local user or process (a local SSRF,
a browser tab that gets a request past the page checks) held the security and operator
roles' write powers on a demo host: `POST /admin/v1/keys` minted a tenant key.

Parametrised over the admin app's own route table, so a route added later is covered;
driven in-process with the peer address set by the transport (no socket), as a local
tool such as curl sends it (loopback `Host`, no `Origin`)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

LOOPBACK = ("127.0.0.1", 40000)
LISTENER = "127.0.0.1:9090"
READS = frozenset(("GET", "HEAD"))
# Path parameters filled in: tenant acme's key digest (revoked, if it were admitted), a
# request id, a tile, an asset.
FILLED = {"{digest}": "cd" * 32, "{request_id}": "req_0", "{path:path}": "0/000", "{name}": "x"}


def _app() -> Any:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "api_key_hashes": ["sha256:" + "cd" * 32], "models": ["*"]}],
        "admin": {"allow_loopback": True},
    }
    return admin_app(create_app(GatewaySettings.model_validate(config)))


def _table() -> list[tuple[str, str]]:
    """(method, path) of every route of the admin app; a route that names no methods (a
    mount) is listed as POST, so that it is held to the stricter rule."""
    rows: set[tuple[str, str]] = set()
    for context in iter_route_contexts(_app().routes):
        path = context.path
        assert path is not None, context.original_route
        for method in context.methods or {"POST"}:
            rows.add((method, path))
    return sorted(rows)


TABLE = _table()
WRITES = [(method, path) for method, path in TABLE if method not in READS]


def _path(template: str) -> str:
    for name, value in FILLED.items():
        template = template.replace(name, value)
    assert "{" not in template, f"fill in the path parameter of {template}"
    return template


def _calls(app: Any, *calls: tuple[str, str, Any]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{LISTENER}") as http:
            return [await http.request(m, path, json=body) for m, path, body in calls]

    return asyncio.run(run())


def test_the_table_holds_every_write_the_docs_name() -> None:
    """The parametrisation below is not empty, and holds the writes of docs/admin-api.md."""
    assert {
        ("POST", "/admin/v1/keys"),
        ("DELETE", "/admin/v1/keys/{digest}"),
        ("POST", "/admin/v1/reload"),
        ("POST", "/admin/v1/drain"),
        ("POST", "/admin/v1/policies/test"),
        ("POST", "/admin/v1/config/validate"),
    } <= set(WRITES), WRITES


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_no_route_but_a_read_answers_a_loopback_client_without_a_token(
    method: str, path: str
) -> None:
    body = {"tenant": "acme"} if path == "/admin/v1/keys" else {}
    answer, status = _calls(_app(), (method, _path(path), body), ("GET", "/admin/v1/status", None))
    assert answer.status_code == 401, answer.text
    error = answer.json()["error"]
    assert error["code"] == "missing_api_key"
    assert "Authorization: Bearer" in error["message"]
    assert status.status_code == 200, status.text
    assert status.json()["draining"] is False


@pytest.mark.parametrize(("method", "path"), [row for row in TABLE if row[0] in READS])
def test_every_read_still_answers_a_loopback_client_without_a_token(method: str, path: str) -> None:
    (answer,) = _calls(_app(), (method, _path(path), None))
    assert answer.status_code not in (401, 403), answer.text


def test_a_loopback_client_is_named_a_reader_and_a_token_still_writes() -> None:
    token = "og-admin-loopback-reads-token"
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {
            "allow_loopback": True,
            "token_hashes": ["sha256:" + hashlib.sha256(token.encode()).hexdigest()],
        },
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{LISTENER}") as http:
            whoami = await http.get("/admin/v1/whoami")
            drained = await http.post(
                "/admin/v1/drain", headers={"authorization": f"Bearer {token}"}
            )
            return [whoami, drained]

    whoami, drained = asyncio.run(run())
    assert whoami.status_code == 200, whoami.text
    assert whoami.json() == {"role": "loopback", "may": ["operator", "security", "auditor"]}
    assert drained.status_code == 200, drained.text
