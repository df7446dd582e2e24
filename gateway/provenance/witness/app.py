"""The witness's HTTP interface (C2SP tlog-witness `add-checkpoint`) as a raw ASGI app.

    POST <prefix>/add-checkpoint
    old <size>\\n<base64 proof hash>\\n...\\n\\n<signed checkpoint note>

200 with the cosignature line(s) (`text/plain`); 409 with the size the witness knows,
`<size>\\n` as `text/x.tlog.size`; 400 malformed, 403 no trusted signature, 404 unknown
log, 422 bad consistency proof, 503 the state could not be written; 404/405/413 for other
paths, methods and oversized bodies. The app needs no web framework and imports no
server: run it with any ASGI server (`owngate witness serve` uses uvicorn). The witness
itself is opened and closed by the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.provenance.witness.witness import Witness, WitnessCode, WitnessError

__all__ = ["MAX_BODY", "SIZE_CONTENT_TYPE", "STATUS", "ASGIApp", "create_witness_app"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: the spec's HTTP status for each refusal, in one place.
STATUS: dict[WitnessCode, int] = {
    "malformed": 400,
    "untrusted": 403,
    "unknown_log": 404,
    "conflict": 409,
    "inconsistent": 422,
    "unavailable": 503,
}
SIZE_CONTENT_TYPE = b"text/x.tlog.size"
#: 63 proof lines and a checkpoint with 100 signature lines fit many times over.
MAX_BODY = 256 * 1024


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes = b"text/plain; charset=utf-8"
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if status == 405:
        headers.append((b"allow", b"POST"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None when it exceeds `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:  # bounded by the client's body: each message carries a chunk or ends it
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:  # ends with the server's shutdown message
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _error_body(error: WitnessError) -> tuple[bytes, bytes]:
    if error.code == "conflict" and error.known_size is not None:
        return f"{error.known_size}\n".encode(), SIZE_CONTENT_TYPE
    return f"{error}\n".encode(), b"text/plain; charset=utf-8"


def create_witness_app(witness: Witness, *, prefix: str = "", max_body: int = MAX_BODY) -> ASGIApp:
    """The ASGI app serving `witness` at `<prefix>/add-checkpoint`."""
    path = prefix.rstrip("/") + "/add-checkpoint"

    async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets here; the server closes the connection
        if scope["path"] != path:
            await _respond(
                send, 404, f"not found; POST add-checkpoint requests to {path}\n".encode()
            )
            return
        if scope["method"] != "POST":
            await _respond(send, 405, b"add-checkpoint takes POST\n")
            return
        body = await _read_body(receive, max_body)
        if body is None:
            await _respond(send, 413, b"request body too large\n")
            return
        try:
            # The check, the fsync of the new state and the signature run off the event
            # loop; the witness's own lock keeps concurrent requests atomic.
            lines = await asyncio.to_thread(witness.submit, body)
        except WitnessError as error:
            content, content_type = _error_body(error)
            await _respond(send, STATUS[error.code], content, content_type)
            return
        await _respond(send, 200, lines)

    return app
