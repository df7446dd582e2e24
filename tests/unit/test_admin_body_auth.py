"""The admin API reads no byte of a request body before the caller is authenticated:
FastAPI reads and parses a whole body before an endpoint's dependencies (the token check)
run, so anyone who reached the admin listener could have it hold up to the body limit
per connection, sent slowly, and parse each (gateway/admin/limits.py)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from starlette.types import ASGIApp, Message

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-body-auth-token"
PIECE = 64 * 1024
# Every endpoint that takes a body (docs/admin-api.md), and one that does not exist.
POSTS = [
    "/admin/v1/policies/explain",
    "/admin/v1/config/validate",
    "/admin/v1/keys",
    "/admin/v1/policies/test",
    "/admin/v1/receipts/verify",
    "/admin/v1/nowhere",
]


def _app(allow_loopback: bool = False) -> ASGIApp:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {
            "token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()],
            "allow_loopback": allow_loopback,
        },
    }
    return admin_app(create_app(GatewaySettings.model_validate(config)))


def _post(
    app: ASGIApp,
    path: str,
    headers: list[tuple[bytes, bytes]],
    client: tuple[str, int] = ("10.1.2.3", 40000),  # not loopback
) -> tuple[int, int]:
    """POST a 16-piece JSON body to `path`; the answer's status and how many body
    pieces the app asked for before it answered."""
    body = b'{"yaml": "' + b"a" * (16 * PIECE - 12) + b'"}'
    pieces = [body[at : at + PIECE] for at in range(0, len(body), PIECE)]
    asked = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal asked
        if asked < len(pieces):
            asked += 1
            return {"type": "http.request", "body": pieces[asked - 1], "more_body": asked < 16}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": client,
        "server": ("admin", 9000),
    }

    async def run() -> None:
        await app(scope, receive, send)

    asyncio.run(run())
    return sent[0]["status"], asked


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([(b"content-length", b"%d" % (16 * PIECE))], id="length"),
        pytest.param([(b"transfer-encoding", b"chunked")], id="chunked"),
        pytest.param(
            [(b"content-length", b"%d" % (16 * PIECE)), (b"authorization", b"Bearer wrong")],
            id="wrong-token",
        ),
    ],
)
def test_no_body_byte_is_read_before_the_caller_is_authenticated(
    path: str, headers: list[tuple[bytes, bytes]]
) -> None:
    status, asked = _post(_app(), path, headers)
    assert status == 401
    assert asked == 0


def test_an_authenticated_callers_body_is_read() -> None:
    token = (b"authorization", b"Bearer " + TOKEN.encode())
    status, asked = _post(
        _app(), "/admin/v1/config/validate", [(b"content-length", b"%d" % (16 * PIECE)), token]
    )
    assert asked == 16
    assert status != 401


@pytest.mark.parametrize("path", POSTS[:-1])
def test_a_tokenless_loopback_clients_body_is_not_read(path: str) -> None:
    """Under `admin.allow_loopback` a loopback client without a token may only read
    (test_admin_loopback_reads.py): its body is refused unread, as a remote one's."""
    headers = [(b"content-length", b"%d" % (16 * PIECE)), (b"host", b"127.0.0.1:9090")]
    status, asked = _post(_app(allow_loopback=True), path, headers, ("127.0.0.1", 40000))
    assert status == 401
    assert asked == 0
