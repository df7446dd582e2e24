"""The `owngate attest` relay in front of one inference server.

Every POST is relayed to the backend with the gateway's own upstream client
(`gateway/upstream/http.py`); the sidecar hashes the body it received and the body it sends
back, commits to both with the salts the gateway passed in `x-owngate-salts`
(`gateway/provenance/formats/commitments.py`, the same functions, so both sides compute the
same digests from the same bytes) and countersigns the statement (`Notary`). The
countersignature travels back as the `x-owngate-attest` header (a whole answer) or as a final
SSE comment line `: owngate-attest <base64>` (a stream: HTTP trailers would be the natural
place, but few clients and proxies pass them on, and the gateway's own listener refuses them),
always on a line of its own (after a last line the backend left unended, an LF goes first;
after events with `id` fields an `id` line with no value: stream_end.py; both relayed and
hashed as part of the body). The inference server's own `owngate-` comment lines are removed
from a stream or a whole answer before it is hashed (gateway/sse_comments.py, as the gateway
does), so the countersigned body is the one the gateway relays. Only an answer the gateway
relays as one, a 2xx with a body, is countersigned (`relayed_status`,
gateway/upstream/content_types.py): an error answer is not relayed as served, and the gateway
records none; a 204, 205, 304 or redirect it refuses before its client sees a byte. Those are
relayed whole, unsigned (a 204 or 304 has no body, so no stream may follow its head). Nor is
an answer the backend ended by closing the connection (no content-length, not chunked): a
backend that died mid-answer ends it the same way, so the sidecar cannot tell that it is
whole. Such a stream is relayed with that framing (ended by the sidecar closing), so the
gateway reads it as it would without the sidecar (`[DONE]` or a broken stream). Nor is a
stream with no body at all: the gateway takes a stream that ends before its first byte for a
failure to try elsewhere, and the comment alone would be that first byte.

The sidecar takes answers in no content coding: its upstream client asks for identity on
every request (the gateway's `accept-encoding` is not among the fields it forwards), and
an answer in another coding is refused, never decompressed nor countersigned: 502
`upstream_error`. So is an answer below 400 of a content type the gateway does not relay
(gateway/upstream/content_types.py: only an event stream or JSON, in UTF-8).

A request without salts (not from a gateway: a client that bypassed it) gets fresh ones: it is
countersigned and logged all the same, so the cross-check against the gateway's log shows it.
Only what a gateway sends is relayed (`RELAYED`, the path before any query; a request with one
is not one): POSTs to the three OpenAI endpoints, countersigned (the statement covers the
body, and a gateway sends no query), and the GETs of its probes and scrapes (`/health`,
`/metrics`, `/v1/models`, llama.cpp's `/props` and `/slots`), without a statement. The server
behind the sidecar listens where only the sidecar reaches it, so any other path (a server's
admin endpoints: SGLang's `/update_weights_from_disk`, vLLM's `/sleep`, llama.cpp's
`POST /props` or slot saves) would be a way to change what the server serves, whose answers
the sidecar would then countersign: 404. Other methods are refused (405): a gateway sends
none, and a HEAD's answer has no body whatever its content-length says (the client waits).

A whole answer (not a stream) is held while it is read, hashed and written: the whole
answers of all connections together are bounded (`--max-held-answer-bytes`, `answers`,
a `BodyBudget`), each counted from its declared length before any of it is read (else
its bytes as they arrive) until its client has taken it (`Connection.answer`). One that
would pass the budget is dropped, never countersigned, and its client gets 429
`rate_limit_exceeded` with `retry-after: 1` (the gateway takes it for a busy backend).

A client (the gateway) that leaves stops the relay: its connection (`protocol.Connection`)
aborts the backend's answer, and nothing is countersigned for an answer it did not get.
The HTTP side is `gateway/attest/protocol.py`; `gateway/attest/server.py` runs both.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from gateway.attest.notary import COUNTER_FILE, CounterFile, Notary, last_logged_counter
from gateway.attest.protocol import Connection, Request
from gateway.attest.request import forwarded
from gateway.attest.settings import AttestSettings
from gateway.attest.stream_end import StreamEnd
from gateway.body_budget import RETRY_AFTER, BodyBudget, Held, hold_answer
from gateway.errors import ErrorCode, GatewayError
from gateway.log_tally import Tally
from gateway.logs import get_logger
from gateway.provenance import (
    LogSettings,
    ProvenanceError,
    ProvenanceLog,
    Salts,
    commit_digest,
    load_signer,
)
from gateway.provenance.formats.attestation import (
    ATTEST_HEADER,
    SALTS_HEADER,
    SSE_PREFIX,
    parse_salts,
)
from gateway.provenance.formats.commitments import SALT_SIZE
from gateway.provenance.formats.receipt_payload import REQUEST_ID
from gateway.sse_comments import CommentFilter, without_comments_in_turns
from gateway.upstream.content_types import UNRELAYABLE_TYPE, relayed_kind, relayed_status
from gateway.upstream.http import HttpPool, UpstreamError, UpstreamResponse

__all__ = ["RELAYED", "AttestRelay", "AttestSettings"]

# What a gateway sends a private backend (gateway/api/openai.py, gateway/routing/
# scraper.py), by method: the only paths the sidecar relays.
RELAYED: dict[bytes, frozenset[bytes]] = {
    b"POST": frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"}),
    b"GET": frozenset({b"/health", b"/metrics", b"/v1/models", b"/props", b"/slots"}),
}

_JSON = b"application/json"
_ATTEST_LINE = ATTEST_HEADER + b": "
_NOT_ALLOWED = GatewayError(ErrorCode.method_not_allowed, "The sidecar relays GET and POST only.")
_NOT_RELAYED = GatewayError(ErrorCode.not_found, "The sidecar relays only a gateway's requests.")
_UNRELAYED = f"the backend answered with {UNRELAYABLE_TYPE}"
_sha256 = hashlib.sha256
_b64 = binascii.b2a_base64  # base64.b64encode without its Python frame (newline=False)
# Random bytes for a request without salts or a valid id (not from a gateway): both salts
# and an 8-byte id, one `getrandom` per request whatever is missing.
_FRESH = 2 * SALT_SIZE + 8


class AttestRelay:
    """Relays and countersigns; `open()` loads the key and opens the log and the pool."""

    notary: Notary  # set by open()
    _pool: HttpPool
    _base: bytes

    def __init__(
        self, settings: AttestSettings, *, random: Callable[[int], bytes] = os.urandom
    ) -> None:
        self._settings = settings
        self._random = random
        self._log: ProvenanceLog | None = None
        self._pool_open = False
        self._notary: Notary | None = None
        self._strip_reports = Tally()
        self.answers = BodyBudget()  # whole answers held at once, by all connections
        self._relayed_kind = functools.lru_cache(maxsize=16)(relayed_kind)  # parsed once a type
        self._events = get_logger("owngate.attest")
        # Why the stop was not clean (`close`): `owngate attest` then exits 4.
        self.shutdown_error: str | None = None

    async def open(self) -> str | None:
        """None when the sidecar can serve, else why not (key, log or backend URL)."""
        s = self._settings
        try:
            signer = load_signer(s.key_file)
            self._pool, self._base = HttpPool.for_url(
                s.backend,
                connect_timeout=s.connect_timeout,
                first_byte_timeout=s.read_timeout,
                read_timeout=s.read_timeout,
                max_connections=s.max_connections,
                max_body=s.max_body,
            )
            self._pool_open = True
            cadence = LogSettings(
                deferred_flush_ms=s.flush_ms, checkpoint_interval_ms=s.checkpoint_ms
            )
            self._log = await ProvenanceLog.open(
                s.log_dir, s.origin or signer.name, signer, settings=cadence, events=self._events
            )
            counters = CounterFile(Path(s.log_dir) / COUNTER_FILE)
            logged = last_logged_counter(Path(s.log_dir), self._log.size)
            self.notary = self._notary = Notary(signer, self._log, counters=counters, logged=logged)
        except (OSError, ValueError, ProvenanceError) as exc:
            return f"owngate attest: {exc}"
        return None

    async def close(self) -> None:
        """Flush the log and sign its final checkpoint; close the backend connections. A
        final checkpoint not signed, or statements handed out and not logged (the disk
        still refused them), set `shutdown_error`."""
        problems = []
        try:
            if self._log is not None:
                await self._log.close()
        except (OSError, ProvenanceError) as exc:
            problems.append(f"the final checkpoint was not signed ({type(exc).__name__})")
            self._events.error("final checkpoint not signed", reason=type(exc).__name__)
        finally:
            if self._notary is not None:
                self._notary.close()
        if self._notary is not None and self._notary.unlogged:
            problems.append(
                f"{self._notary.unlogged} countersignature(s) handed out are not in its log"
            )
        if problems:
            self.shutdown_error = "owngate attest: " + "; ".join(problems)
        if self._pool_open:
            await self._pool.close()

    async def __call__(self, conn: Connection, request: Request) -> None:
        paths = RELAYED.get(request.method)
        if paths is None:
            error = _NOT_ALLOWED
            conn.respond(error.status, error.body(), _JSON, b"allow: GET, POST\r\n")
            return
        path, query, _ = request.target.partition(b"?")
        # A gateway sends no query (even an empty one): a countersigned request is its
        # body, which a query would escape, and a probe's query would carry a client's text
        # into the server's own logs.
        if path not in paths or query:
            error = _NOT_RELAYED
            conn.respond(error.status, error.body(), _JSON)
            return
        if request.method == b"GET":
            await self._plain(conn, request)
            return
        unwritable = self.notary.unwritable()  # before the backend works for it
        if unwritable is not None:
            raise _unwritable(unwritable)
        headers = forwarded(request.headers)  # what reaches the backend (request.py)
        request_id = salts_value = None
        for name, value in request.headers:
            if name == b"x-request-id":
                if request_id is None:
                    request_id = value
            elif name == SALTS_HEADER and salts_value is None:
                salts_value = value
        salts = parse_salts(salts_value)
        # Kept only in the form a record's request_id has (each byte one character).
        if request_id is None or not REQUEST_ID.match(request_id.decode("latin-1")):
            fresh = self._random(_FRESH)  # the salts too if they are missing: one system call
            request_id = b"attest-" + fresh[2 * SALT_SIZE :].hex().encode()
            if salts is None:
                salts = Salts(fresh[:SALT_SIZE], fresh[SALT_SIZE : 2 * SALT_SIZE])
        elif salts is None:
            salts = Salts.generate(self._random)
        headers.append((b"x-request-id", request_id))
        body = request.body
        request_commitment = commit_digest("request", salts.request, _sha256(body).digest())
        response = conn.upstream = await self._send(request.method, request.target, headers, body)
        try:
            if conn.left:
                return
            content_type = response.header(b"content-type") or _JSON
            signed = relayed_status(response.status)  # else relayed whole, never signed
            # As the gateway tells a stream, and only a type it relays (content_types.py)
            stream = self._relayed_kind(content_type) if signed else False
            if stream is None:  # the gateway would refuse it: never countersigned
                raise GatewayError(ErrorCode.upstream_error, _UNRELAYED)
            if not stream:
                data = await self._read(conn, response)
                if signed and not response.ended_by_close:  # (turns of the loop: then checked)
                    data, lines = await without_comments_in_turns(data)  # as the gateway may
                    self._stripped(lines)
                if conn.left or conn.transport.is_closing():  # closing: reset, not yet told
                    return
                extra = b""
                if signed and not response.ended_by_close:
                    digest = commit_digest("response", salts.response, _sha256(data).digest())
                    envelope = self._countersign(request_id, request_commitment, digest)
                    extra = _ATTEST_LINE + _b64(envelope, newline=False) + b"\r\n"
                conn.respond(response.status, data, content_type, extra)
                return
            await self._stream(conn, response, content_type, request_id, request_commitment, salts)
        finally:
            response.abort()  # no-op once the exchange completed and the connection is pooled

    async def _stream(
        self,
        conn: Connection,
        response: UpstreamResponse,
        content_type: bytes,
        request_id: bytes,
        request_commitment: str,
        salts: Salts,
    ) -> None:
        framed = (
            response.header(b"content-length") is not None
            or response.header(b"transfer-encoding") is not None
        )
        conn.start_stream(response.status, content_type, framed=framed)
        hashed = _sha256()
        # The inference server's own `owngate-` comment lines are not relayed: the
        # gateway would remove them, and the countersignature must be over what it relays.
        comments = CommentFilter()
        end = StreamEnd()  # (what goes after the backend's bytes: stream_end.py)
        received = False  # whether the backend sent any body byte
        try:
            async for chunk in response.chunks(response.stream_deadline, stream=True):
                received = received or bool(chunk)
                data = comments.feed(chunk)
                if data:
                    hashed.update(data)
                    end.feed(data)
                    await conn.send_chunk(data)
                if conn.left:
                    return
            data = comments.flush()
            if data:
                hashed.update(data)
                end.feed(data)
                await conn.send_chunk(data)
        except UpstreamError as exc:
            if conn.left:
                return
            # The backend broke off: the connection closes, nothing is signed.
            raise GatewayError(
                ErrorCode.upstream_error, f"the backend's answer broke off: {exc.kind}"
            ) from exc
        self._stripped(comments.stripped)
        if conn.left or conn.transport.is_closing():  # closing: reset, not yet told
            return
        if response.ended_by_close:  # maybe cut short: relayed as such, never countersigned
            conn.end_stream(b"")
            return
        if not received:  # no body at all: the gateway tries elsewhere, as without the sidecar
            conn.end_stream(b"")
            return
        line_end = end.after()  # the comment starts a line: stream_end.py (committed to)
        hashed.update(line_end)
        digest = commit_digest("response", salts.response, hashed.digest())
        envelope = self._countersign(request_id, request_commitment, digest)
        conn.end_stream(line_end + SSE_PREFIX + _b64(envelope, newline=False) + b"\n\n")

    def _countersign(self, request_id: bytes, request: str, response: str) -> bytes:
        """`Notary.countersign`; a counter file it cannot write (the reserved block used
        up meanwhile): 503 as for the log, nothing signed (a stream is cut, unsigned)."""
        try:
            return self.notary.countersign(request_id, request, response)
        except OSError as exc:
            raise _unwritable(f"counter file ({type(exc).__name__})") from exc

    def _stripped(self, lines: int) -> None:
        """Say that the inference server's streams held `owngate-` comment lines, at most
        once a minute (how many since, never what)."""
        if not lines:
            return
        said = self._strip_reports.note("backend", asyncio.get_running_loop().time(), lines)
        if said:
            self._events.warning("backend stream held owngate comment lines: removed", lines=said)

    async def _plain(self, conn: Connection, request: Request) -> None:
        """Relay without a statement (probes, metrics, model lists)."""
        headers = forwarded(request.headers)
        response = conn.upstream = await self._send(
            request.method, request.target, headers, request.body
        )
        try:
            data = await self._read(conn, response)
        finally:
            response.abort()
        conn.respond(response.status, data, response.header(b"content-type") or b"text/plain")

    async def _send(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        try:
            return await self._pool.request(method, self._base + target, headers, body)
        except UpstreamError as exc:
            if exc.kind == "encoding":  # an answer the upstream client refused to take
                raise GatewayError(
                    ErrorCode.upstream_error, "the backend answered in a content coding"
                ) from exc
            if exc.kind == "exhausted":  # the sidecar's own state: busy, as at its budgets
                raise GatewayError(
                    ErrorCode.rate_limit_exceeded,
                    "the sidecar is out of file descriptors; retry shortly",
                    headers=((b"retry-after", b"1"),),
                ) from exc
            raise GatewayError(
                ErrorCode.backend_unavailable, f"the backend did not answer: {exc.kind}"
            ) from exc

    async def _read(self, conn: Connection, response: UpstreamResponse) -> bytes:
        """The whole answer, held against `answers` (its declared length before any of it
        is read, else its bytes as they arrive); the connection gives the bytes back once
        its client has taken the answer, or the request ended without it."""
        held = conn.answer = self.answers.hold(self._settings.max_held_answer)
        announced = response.header(b"content-length")
        try:
            # A length over the per-answer limit is read()'s to refuse (502, as before).
            size = int(announced) if announced and announced.isdigit() else -1
            if 0 <= size <= self._settings.max_body:
                if held.take(size) is not None:  # refused: `_cover` raises why
                    _cover(held, size)
                # All of it is held already (the framing ends the body at that length): no
                # call per piece as it arrives; only a longer body would be counted after.
                data = await response.read()
                if len(data) > size:
                    _cover(held, len(data))
                return data
            return await response.read(reserve=lambda taken: _cover(held, taken))
        except UpstreamError as exc:
            raise GatewayError(
                ErrorCode.upstream_error, f"the backend's answer broke off: {exc.kind}"
            ) from exc


def _unwritable(what: str) -> GatewayError:
    """503 with `retry-after: 1`, as the gateway's own: the disk is retried each second."""
    return GatewayError(
        ErrorCode.provenance_unavailable,
        f"the attestation {what} cannot be written; requests are refused until it can",
        headers=(RETRY_AFTER,),
    )


def _cover(held: Held, size: int) -> None:
    """Hold `size` bytes of a whole answer against the sidecar's budget."""
    hold_answer(held, size, holder="sidecar", setting="--max-held-answer-bytes")
