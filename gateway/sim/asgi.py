"""The few raw-ASGI pieces the simulator uses: types, body reading, plain responses."""

from __future__ import annotations

from typing import Final

from gateway.asgi import JSON, Message, Receive, Scope, Send

__all__ = [
    "JSON",
    "SSE_HEADERS",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "read_body",
    "respond",
    "start",
    "wait_disconnect",
]

SSE_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
)


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away first."""
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def wait_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (call after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def start(status: int, content_type: bytes, length: int) -> Message:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", b"%d" % length)],
    }


async def respond(send: Send, status: int, body: bytes, content_type: bytes = JSON) -> None:
    """A complete response with a content length."""
    await send(start(status, content_type, len(body)))
    await send({"type": "http.response.body", "body": body})
