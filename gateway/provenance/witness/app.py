"""The witness's HTTP interface (C2SP tlog-witness `add-checkpoint`) as a raw ASGI app.

    POST <prefix>/add-checkpoint
    old <size>\\n<base64 proof hash>\\n...\\n\\n<signed checkpoint note>

200 with the cosignature line(s) (`text/plain`); 409 with the size the witness knows,
`<size>\\n` as `text/x.tlog.size`; 400 malformed, 403 no trusted signature, 404 unknown
log, 422 bad consistency proof, 503 the state could not be written; 404/405/413 for other
paths, methods and oversized bodies; 429 (`retry-after: 1`) while the bodies all its
connections hold at once would pass `max_held_body` (`BodyBudget`, gateway/body_budget.py:
a body's declared length is reserved before any of it is read, a chunked one's bytes as
they come, until its answer). Without it, anyone reaching the witness could hold a
256 KiB body on every connection the listener allows: 1,500 connections grew `owngate
witness serve` by 390 MB (4,096 by default: over 1 GiB). One peer (a client address; an
IPv6 one by its /64, which one host is given whole) may hold at most `max_held_body_per_peer`
of it (a quarter by default; 429 past it), so one flooding peer cannot have every log's
submissions refused. The app needs no web framework
and imports no server: run it with any ASGI server (`owngate witness serve` uses uvicorn).
The witness itself is opened and closed by the caller.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable

from gateway.asgi import Receive, Scope, Send, lifespan, read_body, respond
from gateway.body_budget import BodyBudget, Held
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.witness.witness import Witness, WitnessCode, WitnessError

__all__ = [
    "MAX_BODY",
    "MAX_HELD_BODY",
    "PEER_SHARE",
    "SIZE_CONTENT_TYPE",
    "STATUS",
    "ASGIApp",
    "create_witness_app",
    "peer_of",
]

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

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
#: what all connections' bodies hold at once: 128 bodies at MAX_BODY, thousands of real ones
MAX_HELD_BODY = 32 * 1024 * 1024
#: the part of it one peer's connections may hold, by default: 32 bodies at MAX_BODY
PEER_SHARE = 4
_TEXT = b"text/plain; charset=utf-8"
#: the most of a refusal's message a witness answers (what it quotes of the request, cut)
MAX_ANSWER_CHARS = 300


def _error_body(error: WitnessError) -> tuple[bytes, bytes]:
    if error.code == "conflict" and error.known_size is not None:
        return f"{error.known_size}\n".encode(), SIZE_CONTENT_TYPE
    # The message quotes the request (its first line, origin, a signature's key name):
    # bounded, and what is not printable ASCII escaped, as `owngate audit` shows it.
    return _plain(str(error)) + b"\n", _TEXT


def _plain(text: str) -> bytes:
    """`text` as printable ASCII, every other character escaped as Python writes it
    (`\\x1b`, `\\u202e`), cut at `MAX_ANSWER_CHARS` characters with a note of the rest."""
    cut = text[:MAX_ANSWER_CHARS]
    escaped = cut.encode("ascii", "backslashreplace")
    plain = b"".join(bytes([c]) if 0x20 <= c < 0x7F else b"\\x%02x" % c for c in escaped)
    rest = len(text) - len(cut)
    return plain + (b"...[%d more characters]" % rest if rest else b"")


def create_witness_app(
    witness: Witness,
    *,
    prefix: str = "",
    max_body: int = MAX_BODY,
    max_held_body: int = MAX_HELD_BODY,
    max_held_body_per_peer: int | None = None,
) -> ASGIApp:
    """The ASGI app serving `witness` at `<prefix>/add-checkpoint`; one peer's bodies hold
    at most `max_held_body_per_peer` (default `max_held_body // PEER_SHARE`), which must
    fit a body of `max_body` (ValueError)."""
    path = prefix.rstrip("/") + "/add-checkpoint"
    per_peer = (
        max_held_body // PEER_SHARE if max_held_body_per_peer is None else max_held_body_per_peer
    )
    if per_peer < max_body:
        raise ValueError(
            f"the bodies one peer may hold ({per_peer} bytes) must fit one body of {max_body}"
        )
    bodies = BodyBudget()  # what all connections' bodies hold at once, and per peer

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets here; the server closes the connection
        if scope["path"] != path:
            await respond(
                send, 404, f"not found; POST add-checkpoint requests to {path}\n".encode(), _TEXT
            )
            return
        if scope["method"] != "POST":
            await respond(send, 405, b"add-checkpoint takes POST\n", _TEXT, ((b"allow", b"POST"),))
            return
        held = bodies.hold(max_held_body, peer_of(scope), per_peer)
        try:
            await _add_checkpoint(scope, receive, send, held)
        finally:
            held.release()

    async def _add_checkpoint(scope: Scope, receive: Receive, send: Send, held: Held) -> None:
        try:
            body = await read_body(scope, receive, max_body, held)
        except GatewayError as error:
            if error.code is ErrorCode.request_too_large:
                await respond(send, 413, b"request body too large\n", _TEXT)
            elif error.code is ErrorCode.rate_limit_exceeded:
                busy = (
                    b"the witness holds as many request bodies as it may (in all, or from "
                    b"your address); retry shortly\n"
                )
                await respond(send, 429, busy, _TEXT, ((b"retry-after", b"1"),))
            return  # otherwise the client left before its body was complete
        try:
            # The check, the fsync of the new state and the signature run off the event
            # loop; the witness's own lock keeps concurrent requests atomic.
            lines = await asyncio.to_thread(witness.submit, body)
        except WitnessError as error:
            content, content_type = _error_body(error)
            await respond(send, STATUS[error.code], content, content_type)
            return
        await respond(send, 200, lines, _TEXT)

    return app


def peer_of(scope: Scope) -> str:
    """Whose share of the body budget a request takes: its client address, an IPv6 one
    by its /64 (a host is given a whole /64), "" when the server names no client."""
    client = scope.get("client")
    host = client[0] if client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
