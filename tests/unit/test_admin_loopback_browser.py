"""`admin.allow_loopback` (the demo) admits a loopback client without a token, but never
a request a browser on the same host sent for a web page of another origin: a form post
from any site the operator visits could otherwise drain or reload the gateway, and a
DNS name rebound to 127.0.0.1 would make the attacker's page same-origin with the admin
listener, free to call (and read) every endpoint, a new tenant key included.

Driven through the admin app with the peer address set by the transport (no socket),
and through `authorize`, the check of `/admin/status` on the public listener."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.api.admin import authorize
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.config.schema import AdminSettings
from gateway.errors import GatewayError
from tests.helpers.gateways import backend

LOOPBACK = ("127.0.0.1", 40000)
LISTENER = "127.0.0.1:9090"  # the Host a tool that dialled the admin listener sends

# What a browser sends for a page of another origin (header sets of real requests).
FROM_ELSEWHERE: list[dict[str, str]] = [
    # a cross-site form post (text/plain, no preflight) to http://127.0.0.1:9090
    {"origin": "https://evil.example", "content-type": "text/plain"},
    # a sandboxed iframe's form post
    {"origin": "null"},
    # another local port's page (say, the public listener's or a dev server's)
    {"origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-site"},
    # a no-cors GET a cross-site page made (no Origin on a GET)
    {"sec-fetch-site": "cross-site"},
    # DNS rebinding: evil.example now resolves to 127.0.0.1; the page is same-origin
    {"host": "evil.example:9090", "origin": "http://evil.example:9090"},
    {"host": "evil.example:9090", "sec-fetch-site": "same-origin"},
    {"host": "evil.example"},
    {"host": "127.0.0.1.evil.example:9090"},
    {"host": "localhost.evil.example:9090"},
]

# What tools on this host send: curl, httpx, urllib (`owngate status`), the page itself.
LOCAL: list[dict[str, str]] = [
    {},
    {"host": "localhost:9090"},
    {"host": "127.0.0.2:9090"},
    {"host": "[::1]:9090"},
    {"origin": f"http://{LISTENER}", "sec-fetch-site": "same-origin"},
    {"sec-fetch-site": "none"},  # typed into the address bar
]


def _app() -> Any:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"allow_loopback": True},
    }
    return admin_app(create_app(GatewaySettings.model_validate(config)))


def _calls(app: Any, *calls: tuple[str, str, dict[str, str]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{LISTENER}") as http:
            return [await http.request(m, path, headers=h) for m, path, h in calls]

    return asyncio.run(run())


@pytest.mark.parametrize("headers", FROM_ELSEWHERE)
def test_a_web_page_of_another_origin_cannot_drain_a_loopback_admitting_gateway(
    headers: dict[str, str],
) -> None:
    drained, whoami, after = _calls(
        _app(),
        ("POST", "/admin/v1/drain", headers),
        ("GET", "/admin/v1/whoami", headers),
        ("GET", "/admin/v1/status", {}),  # a local tool, to see what happened
    )
    assert drained.status_code == 401, drained.text
    assert drained.json()["error"]["code"] == "missing_api_key"
    assert "web page of another origin" in drained.json()["error"]["message"]
    assert whoami.status_code == 401, whoami.text
    assert after.status_code == 200, after.text
    assert after.json()["draining"] is False


@pytest.mark.parametrize("headers", LOCAL)
def test_a_local_tool_is_still_admitted_without_a_token(headers: dict[str, str]) -> None:
    (whoami,) = _calls(_app(), ("GET", "/admin/v1/whoami", headers))
    assert whoami.status_code == 200, whoami.text
    assert whoami.json()["role"] == "loopback"  # reads only: test_admin_loopback_reads.py


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    raw = [(b"host", LISTENER.encode())] if "host" not in headers else []
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "client": LOOPBACK, "headers": raw}


def _refused(scope: dict[str, Any]) -> bool:
    """Whether `/admin/status` on the public listener refuses `scope` without a token."""
    refusal: GatewayError | None = None
    try:
        authorize(scope, AdminSettings(allow_loopback=True))
    except GatewayError as error:
        refusal = error
    assert refusal is None or refusal.status == 401
    return refusal is not None


@pytest.mark.parametrize("headers", FROM_ELSEWHERE)
def test_the_public_listeners_admin_status_refuses_a_page_of_another_origin(
    headers: dict[str, str],
) -> None:
    assert _refused(_scope(headers))


@pytest.mark.parametrize("headers", LOCAL)
def test_the_public_listeners_admin_status_admits_a_local_tool(headers: dict[str, str]) -> None:
    assert not _refused(_scope(headers))


@pytest.mark.parametrize(
    "host", ["127.0.0.1:90x", "[::1", "[::1]x", "[::1]:", "::1", "127.0.0.1:", "0.0.0.0:9090"]
)
def test_a_malformed_or_non_loopback_host_is_not_a_local_one(host: str) -> None:
    assert _refused(_scope({"host": host}))


def test_two_host_headers_are_not_a_local_request() -> None:
    scope = _scope({})
    scope["headers"].append((b"host", b"evil.example"))
    assert _refused(scope)


@pytest.mark.parametrize("host", [b"127.0.0.1:\xb2", b"[::1]:\xb9", b"localhost:\xb3"])
def test_a_port_of_non_ascii_digits_is_not_a_local_host(host: bytes) -> None:
    # Latin-1 superscripts are digits to `str.isdigit` but name no port.
    scope = _scope({})
    scope["headers"] = [(b"host", host)]
    assert _refused(scope)
