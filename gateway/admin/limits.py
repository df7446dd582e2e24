"""A bound on admin API request bodies, before any of them is read into memory.

FastAPI reads a whole body, and parses it as JSON, before it runs an endpoint's
dependencies, the admin token check among them; this ASGI middleware refuses one whose
Content-Length is over `limit` (413 `request_too_large`) without reading it, and stops
reading a body sent without one at `limit` bytes. A request that carries a body is
authenticated first (`identify`: 401 without a valid token, a tokenless loopback client
included, since it may only read), also before any of it is read: anyone who reaches the
admin listener could otherwise have it hold `limit` bytes per connection, sent slowly,
and parse each, with no token at all. Which role may use the endpoint is still the
endpoint's to check (403). The per-field bounds (a receipt, a cases file) are in the
request models; this keeps every body, of every endpoint, to a size the process can
hold.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admin.auth import identify
from gateway.config.schema import AdminSettings
from gateway.errors import ErrorCode, GatewayError, error_body

__all__ = ["MAX_BODY_BYTES", "BodyLimit"]

MAX_BODY_BYTES = 1024 * 1024


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope["headers"] if k == b"content-length"]
        if declared and not _within(declared[0], self.limit):
            await _refuse(send, GatewayError(ErrorCode.request_too_large, _message(self.limit)))
            return
        if _has_body(scope, declared):
            settings: AdminSettings = scope["app"].state.control.runtime.config.admin
            try:
                identify(Request(scope), settings)
            except GatewayError as refused:  # no body is read for a caller without a token
                await _refuse(send, refused)
                return
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise GatewayError(ErrorCode.request_too_large, _message(self.limit))
            return message

        await self.app(scope, bounded, send)


def _within(declared: bytes, limit: int) -> bool:
    """Whether a Content-Length value is digits naming at most `limit` bytes. Its leading
    zeros are dropped before int(): HTTP allows any number of them, and Python refuses to
    convert more than 4300 digits (a `0…01` of 5,000 digits, sent without a token, was a
    500 and a traceback in the log per request); past `limit`'s digits it is over it."""
    if not declared.isdigit():
        return False
    digits = declared.lstrip(b"0") or b"0"
    return len(digits) <= len(str(limit)) and int(digits) <= limit


def _message(limit: int) -> str:
    return f"the request body is over {limit} bytes"


def _has_body(scope: Scope, declared: list[bytes]) -> bool:
    """Whether the request carries a body: a length over 0, or chunked framing."""
    if declared:
        return declared[0].lstrip(b"0") != b""  # digits within the limit: checked above
    return any(k == b"transfer-encoding" for k, _ in scope["headers"])


async def _refuse(send: Send, error: GatewayError) -> None:
    body = error_body(error.code, error.message, error.param)
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
