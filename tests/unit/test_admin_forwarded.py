"""The loopback opt-in (`admin.allow_loopback`) admits the socket's own peer, never an
address a header names: owngate's servers take no proxy headers (uvicorn's
ProxyHeadersMiddleware would make `X-Forwarded-For: 127.0.0.1` a loopback client under
`FORWARDED_ALLOW_IPS=*`), and a request that a proxy forwarded (it names a client in
`Forwarded`, `X-Forwarded-For` or `X-Real-IP`) is not a local one, whatever its peer.

Driven through the app exactly as `gateway.serving.uvicorn_config` wraps it for uvicorn
(`Config.load()`), with the peer address set by the transport: no socket is opened."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.serving import uvicorn_config
from tests.helpers.gateways import backend

TOKEN = "og-admin-forwarded-token"
REMOTE = ("203.0.113.9", 40000)
LOOPBACK = ("127.0.0.1", 40000)


def _served(monkeypatch: pytest.MonkeyPatch) -> httpx.AsyncBaseTransport:
    """The admin app of a loopback-admitting gateway, as uvicorn would run it, with
    uvicorn told (as a deployment behind a load balancer often does) to trust every
    proxy."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {
            "allow_loopback": True,
            "token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()],
        },
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))
    server = uvicorn_config(app)
    server.load()
    return server.loaded_app  # type: ignore[no-any-return]


def _get(app: object, client: tuple[str, int], headers: dict[str, str]) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app, client=client)  # type: ignore[arg-type]
        # the Host a local client that dialled the listener sends (never a rebound name)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090") as http:
            return await http.get("/admin/v1/whoami", headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize(
    "headers",
    [
        {"x-forwarded-for": "127.0.0.1"},
        {"x-forwarded-for": "127.0.0.1, 203.0.113.9"},
        {"x-forwarded-for": "::1"},
    ],
)
def test_a_remote_client_naming_loopback_in_a_header_is_not_admitted(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    answer = _get(_served(monkeypatch), REMOTE, headers)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "missing_api_key"


@pytest.mark.parametrize(
    "headers",
    [
        {"forwarded": "for=203.0.113.9;proto=https"},
        {"x-forwarded-for": "203.0.113.9"},
        {"x-real-ip": "203.0.113.9"},
        {"x-forwarded-for": "127.0.0.1"},  # named, so forwarded: whom it names is moot
        # what other proxies, CDNs and load balancers add (a forward proxy: `Via` alone)
        {"via": "1.1 tinyproxy (tinyproxy/1.11.1)"},
        {"x-forwarded-host": "gateway.example"},
        {"true-client-ip": "203.0.113.9"},
        {"cf-connecting-ip": "203.0.113.9"},
        {"x-client-ip": "203.0.113.9"},
        {"client-ip": "203.0.113.9"},
        {"fastly-client-ip": "203.0.113.9"},
        {"x-cluster-client-ip": "203.0.113.9"},
        {"x-original-forwarded-for": "203.0.113.9"},
    ],
)
def test_a_request_a_local_proxy_forwarded_is_not_a_loopback_client(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    answer = _get(_served(monkeypatch), LOOPBACK, headers)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "missing_api_key"


def test_a_loopback_client_and_a_token_are_still_admitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _served(monkeypatch)
    local = _get(app, LOOPBACK, {})
    assert local.status_code == 200, local.text
    assert local.json()["role"] == "loopback"  # reads only (test_admin_loopback_reads.py)
    forwarded = _get(
        app, REMOTE, {"authorization": f"Bearer {TOKEN}", "x-forwarded-for": "1.2.3.4"}
    )
    assert forwarded.status_code == 200, forwarded.text
