"""Raw ASGI without a web framework, for the gateway, the simulator and the witness server.

One copy of what each of them needs: the types, header lookup, reading a request body
with a size limit, sending whole responses (plain, with the gateway's request id, or as
an OpenAI error object) and the lifespan protocol. It imports only the standard library,
orjson and `gateway.errors`, so the provenance witness can serve HTTP with it.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from gateway.errors import ErrorCode, GatewayError

if TYPE_CHECKING:
    from gateway.body_budget import Held

__all__ = [
    "JSON",
    "PRIVATE_ANSWER",
    "REFUSAL_SCOPE_KEY",
    "LifespanHook",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header",
    "header_values",
    "lifespan",
    "read_body",
    "respond",
    "send_bytes",
    "send_error",
    "send_json",
    "start",
    "wait_disconnect",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
LifespanHook = Callable[[], Awaitable[str | None]]
"""A lifespan startup or shutdown step: None when it succeeded, else why it failed."""

JSON: Final = b"application/json"

# The headers of an answer meant for its caller alone (an admin's status, the metrics under
# `listen.metrics: admin`, a tenant's receipt, whose salts open its commitments): never
# stored (a browser's cache or a proxy's heuristic freshness would show it to the next
# caller of the URL) and never read as another type than it declares.
PRIVATE_ANSWER: Final = ((b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"))

# The listener (gateway/listener.py) answered a request whose app already runs (its body
# timed out or broke its framing): the app reads a disconnect, and finds under this key
# the `GatewayError` the client got, so its access log and metrics say what the client saw.
REFUSAL_SCOPE_KEY: Final = "owngate.listener_refusal"


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


async def read_body(
    scope: Scope, receive: Receive, limit: int = sys.maxsize, held: Held | None = None
) -> bytes:
    """The whole request body, at most `limit` bytes, reserved in `held` (the process's
    `BodyBudget`, gateway/body_budget.py) before it is read: its declared length at once,
    a chunked body as it arrives.

    Raises `GatewayError`: 413 `request_too_large` past the limit (before reading when the
    declared length says so); 429 `rate_limit_exceeded` past the budget (the same);
    when the body never completed, the listener's answer (see `REFUSAL_SCOPE_KEY`) or 400
    `invalid_request` "client disconnected"."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    # A declared length too long to be a number we accept is refused without int():
    # Python refuses to convert integers of more than 4300 digits.
    if declared is not None and declared.isdigit():
        if len(declared) > len(str(limit)) or int(declared) > limit:
            raise _too_large(limit)
        if held is not None:
            held.cover(int(declared))
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _body_lost(scope)
    body: bytes = message.get("body", b"")
    if len(body) > limit:
        raise _too_large(limit)
    if held is not None:
        held.cover(len(body))
    if not message.get("more_body", False):
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _body_lost(scope)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        if held is not None:
            held.cover(size)
        parts.append(chunk)
    return b"".join(parts)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        ErrorCode.request_too_large, f"The request body exceeds the limit of {limit} bytes."
    )


def _body_lost(scope: Scope) -> GatewayError:
    """The body never completed: the listener answered the client (a body timeout, broken
    framing; that answer is what the client got) or the client went away."""
    refusal = scope.get(REFUSAL_SCOPE_KEY)
    if isinstance(refusal, GatewayError):
        return refusal
    return GatewayError(ErrorCode.invalid_request, "client disconnected")


async def wait_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (call after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def start(
    status: int, content_type: bytes, length: int, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> Message:
    """The `http.response.start` message of a response of `length` bytes."""
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", b"%d" % length), *headers],
    }


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A complete response with a content length."""
    await send(start(status, content_type, len(body), headers))
    await send({"type": "http.response.body", "body": body})


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = JSON,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A complete gateway response: `respond` with the `x-request-id` header (built in
    place: every answer the gateway gives itself goes through here)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", b"%d" % len(body)),
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
    """`error` as an OpenAI error object, with its headers (and a bearer challenge for a
    missing or wrong API key)."""
    extra = (*error.headers, *more)
    if error.code in (ErrorCode.invalid_api_key, ErrorCode.missing_api_key):
        extra = (*extra, (b"www-authenticate", b'Bearer realm="owngate"'))
    await send_bytes(send, error.status, error.body(), request_id, extra=extra)


async def lifespan(
    receive: Receive,
    send: Send,
    startup: LifespanHook | None = None,
    shutdown: LifespanHook | None = None,
) -> None:
    """Answer the ASGI lifespan protocol until the server's shutdown: `startup` runs when
    the server starts, `shutdown` when it stops. A step that returns a message failed: the
    server is told so (`lifespan.startup.failed` ends the protocol: it will not serve)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            failure = None if startup is None else await startup()
            if failure is not None:
                await send({"type": "lifespan.startup.failed", "message": failure})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            failure = None if shutdown is None else await shutdown()
            if failure is not None:
                await send({"type": "lifespan.shutdown.failed", "message": failure})
            else:
                await send({"type": "lifespan.shutdown.complete"})
            return
