"""Small ASGI helpers: typed aliases, header lookup, and sending whole responses."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.asgi import JSON, Receive, Scope, Send
from gateway.errors import ErrorCode, GatewayError

__all__ = [
    "JSON",
    "Receive",
    "Scope",
    "Send",
    "header",
    "header_values",
    "send_bytes",
    "send_error",
    "send_json",
]


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every copy of header `name` (lower case), in order: for headers whose copies must
    agree (credentials, labels), where "the first copy wins" would be a guess."""
    return [value for key, value in scope["headers"] if key == name]


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            value_: bytes = value
            return value_
    return None


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = JSON,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: Any, request_id: bytes) -> None:
    await send_bytes(send, status, orjson.dumps(payload), request_id)


async def send_error(
    send: Send,
    error: GatewayError,
    request_id: bytes,
    more: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    extra = (*error.headers, *more)
    if error.code in (ErrorCode.invalid_api_key, ErrorCode.missing_api_key):
        extra = (*extra, (b"www-authenticate", b'Bearer realm="owngate"'))
    await send_bytes(send, error.status, error.body(), request_id, extra=extra)
