"""A bound on admin API request bodies, before any of them is read into memory.

FastAPI reads a whole body before it validates it; this ASGI middleware refuses one
whose Content-Length is over `limit` (413 `request_too_large`) without reading it, and
stops reading a body sent without one at `limit` bytes. The per-field bounds (a
receipt, a cases file) are in the request models; this keeps every body, of every
endpoint, to a size the process can hold.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
        if declared and (not declared[0].isdigit() or int(declared[0]) > self.limit):
            await _too_large(send, self.limit)
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


def _message(limit: int) -> str:
    return f"the request body is over {limit} bytes"


async def _too_large(send: Send, limit: int) -> None:
    body = error_body(ErrorCode.request_too_large, _message(limit))
    await send(
        {
            "type": "http.response.start",
            "status": ErrorCode.request_too_large.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
