"""One keep-alive HTTP/1.1 connection to a backend, as `HttpPool` (gateway/upstream/http.py)
holds it: the asyncio protocol that parses responses with `httptools` and feeds the
current `UpstreamResponse`, within the bounds http.py's docstring describes (the head at
`MAX_HEAD` bytes and so the bytes between two body bytes, the chunks of a read at
`CHUNK_BYTES`, bytes after a response's end drop the connection), and who its TLS
handshake authenticated (`peer`) under which settings (`tls`); and `Connection`, one
that `HttpPool.connect()` handed out and no request has used yet.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import httptools

from gateway.upstream.failures import UpstreamError
from gateway.upstream.response import UpstreamResponse
from gateway.upstream.sockets import received_bytes
from gateway.upstream.tls import Peer

if TYPE_CHECKING:
    from gateway.upstream.http import HttpPool

__all__ = ["CHUNK_BYTES", "FREE_CHUNKS", "MAX_HEAD", "Connection", "ssl_reason"]

# A response's status line and headers (with any 1xx before it): inference servers send
# well under 2 KiB, a countersignature header is under 6 KiB.
MAX_HEAD = 64 * 1024
_NO_BODY = (204, 304)
# Chunks that share a read with another (the first of each read is free: a stream's events
# come one a read, and a body with a length is one "chunk" a read): one for each
# `CHUNK_BYTES` body bytes, past the first `FREE_CHUNKS`. Each chunk is a call into Python;
# 4 MiB in 1-byte chunks were 4 million of them, 0.19 s of the event loop where the same
# body in large chunks costs 8 ms (a `/metrics` scrape's every round; any answer).
CHUNK_BYTES = 8
FREE_CHUNKS = 65_536
# The codings an answer may be in: the pool asks for identity (`HttpPool._head`) and
# sends no `TE`, so chunked is the only transfer coding a backend may use.
_CODINGS = {b"content-encoding": b"identity", b"transfer-encoding": b"chunked"}
_CODED = {
    b"content-encoding": "the backend answered with a content-encoding other than identity, "
    "which the gateway asked for",
    b"transfer-encoding": "the backend answered with a transfer coding other than chunked",
}


class _Connection(asyncio.Protocol):
    """One TCP connection; parses responses and feeds the current `UpstreamResponse`."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        # The loop it runs on, set by the pool once connected: a response asks it, not
        # `asyncio.get_running_loop()`, whose fork check is a `getpid` system call each time.
        self.loop: asyncio.AbstractEventLoop | None = None
        # The body bytes of the read being parsed: the parser calls `on_body` once per HTTP
        # chunk (a stream's every event), the response takes them once per read. `on_body`
        # is the list's own `append` (a C method: no Python frame per event); the parser
        # looks it up once, as it is made. `_ended_at`: how many of them came before the
        # response's end in this read (-1: it did not end), the rest are dropped.
        self._body: list[bytes] = []
        self.on_body = self._body.append
        self._ended_at = -1
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.reused = False
        self.counted = True  # holds one of the pool's connection slots
        self.holder: str | None = None  # the tenant whose request uses it (tenant_share.py)
        self.interim = False  # parsing a 1xx response, which precedes the real one
        self.close_delimited = False  # body ends when the backend closes the connection
        self.peer: Peer | None = None  # who the TLS handshake authenticated (None: plain HTTP)
        self.tls = pool.tls  # the settings it is authenticated with (`HttpPool.retrust`)
        # bytes of the current response read since its last body byte (its head at first,
        # then chunk framing and trailers): at most `MAX_HEAD` in a row
        self.quiet_bytes = 0
        self.extra_chunks = 0  # of the current response: chunks after the first of a read
        self.body_bytes = 0  # of the current response
        self._poller: select.poll | None = None  # `unread()`'s, made at its first call
        self._idle_from: int | None = None  # what its socket had received as it went idle
        self._answered = False  # a response ended on it

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.response.complete:
            # Bytes nobody asked for (after the response ended): the connection is out of
            # step with its requests and no longer trustworthy.
            self._out_of_step()
            return
        response = self.response
        self.quiet_bytes += len(data)  # a body byte in the read starts it over
        error = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            error = UpstreamError("protocol", "unexpected upgrade")
        except httptools.HttpParserError as exc:
            error = UpstreamError("protocol", f"bad HTTP response: {exc}")
        body = self._body
        if body:  # what the read carried of the body, handed on before any failure
            self.quiet_bytes = 0
            if self._ended_at >= 0:  # never appended to an answer that already ended
                del body[self._ended_at :]
                self._ended_at = -1
            if body:
                self.extra_chunks += len(body) - 1
                piece = body[0] if len(body) == 1 else b"".join(body)
                self.body_bytes += len(piece)
                body.clear()
                response._push(piece)
        self._ended_at = -1
        if error is not None:
            response._fail(error)
            self.close()
        if self.quiet_bytes > MAX_HEAD and not response.complete:
            what = (
                "response headers larger than"
                if response.status == 0
                else "chunk framing or trailers: more than"
            )
            response._fail(
                UpstreamError("protocol", f"{what} {MAX_HEAD} bytes without a body byte")
            )
            self.abort()
        elif (
            self.extra_chunks > self.body_bytes // CHUNK_BYTES + FREE_CHUNKS
            and not response.complete
        ):
            response._fail(
                UpstreamError(
                    "protocol",
                    f"chunk framing: more than one chunk for each {CHUNK_BYTES} body bytes",
                )
            )
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete and self.close_delimited:
            # No content-length and not chunked: the close is the end of the body (or the
            # backend died: only the content can tell, see `ended_by_close`).
            response.complete = True
            response.ended_by_close = True
            response._keep_alive = False
            response._wake()
            return
        if (
            self.response is not None
            and not self.response.complete
            and isinstance(exc, ssl.SSLError)
        ):
            # e.g. TLS 1.3: a server that wanted a client certificate says so after the
            # handshake, with an alert, before it reads the request.
            self.response._fail(UpstreamError("tls", ssl_reason(exc)))
            return
        if self.response is not None and not self.response.complete:
            got_bytes = self.response.status != 0
            self.response._fail(
                UpstreamError(
                    "closed",
                    "backend closed the connection mid-response"
                    if got_bytes
                    else "backend closed the connection before answering",
                    sent_nothing=self.reused and not got_bytes,
                )
            )

    def pause_writing(self) -> None:  # request bodies are bounded; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_message_begin(self) -> None:
        response = self.response
        if response is None or response.complete:
            # A second response to one request (in the same read as the first): the
            # connection is out of step; what follows is parsed only to be dropped.
            self._out_of_step()

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is None or response.complete or response.status != 0:
            return  # part of a message after the response, or a trailer: dropped
        response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None or response.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                response._fail(UpstreamError("protocol", "backend switched protocols"))
                self.abort()
                return
            # 100 Continue / 103 Early Hints: the real response follows on this connection.
            self.interim = True
            response.headers.clear()
            return
        if not 200 <= status <= 599:
            # The parser takes any three digits. A status under 100 cannot be relayed (no
            # status line for it: the client's connection dropped with a 500 logged), and
            # 000 would read as "no answer yet" (`status == 0`) until the first-byte
            # timeout; 600 and up is no HTTP status either.
            response._fail(UpstreamError("protocol", f"backend answered status {status:03d}"))
            self.abort()
            return
        has_length = False
        for name, value in response.headers:
            if name in (b"content-length", b"transfer-encoding"):
                has_length = True
            if name in _CODINGS and status not in _NO_BODY and _coded(value, _CODINGS[name]):
                # Relayed as they came, such bytes would reach the client undecodable,
                # labelled JSON or SSE: refused, never decompressed here (a bounded
                # decoder is still a decoder a backend could aim a bomb at).
                response._fail(UpstreamError("encoding", _CODED[name]))
                self.abort()
                return
        response.status = status
        self.extra_chunks = self.body_bytes = 0
        self.close_delimited = not has_length and status not in _NO_BODY
        response._wake()

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or response.complete:
            return
        if self.interim:
            self.interim = False
            return
        response.complete = True
        self._answered = True
        self._ended_at = len(self._body)  # (`data_received` hands on the body before it)
        response._keep_alive = self.parser.should_keep_alive()
        response._wake()

    def went_idle(self) -> None:
        """Note, as it goes back to the pool after a response, what its socket has
        received so far (`unread`)."""
        if self._answered and self.tls is not None and self.transport is not None:
            self._idle_from = received_bytes(self.transport.get_extra_info("socket"))

    def lapsed(self) -> bool:
        """Whether its certificate (or a CA certificate of its chain) expired since its
        handshake: a kept-alive connection is not reused past that (tls.py, `Peer.until`)."""
        peer, tls = self.peer, self.tls
        return peer is not None and tls is not None and tls.clock() >= peer.until

    def unfit(self) -> bool:
        """Whether a request it was handed for must not be written on it: kept alive and
        out of step (`unread`), or lapsed, also a new one leased for a dispatch record
        that took until past its certificate's expiry to write."""
        return (self.reused and self.unread()) or self.lapsed()

    def unread(self) -> bool:
        """Whether bytes (or the backend's close) wait unread on this idle connection.

        The loop reads a socket only between its turns: bytes a backend wrote after a
        complete response (a second response nobody asked for) may still wait in the
        socket when the next request takes the connection, and would be parsed as that
        request's answer (another request's, another tenant's). A connection with bytes
        waiting is out of step: it is not reused. Only a reused connection is asked: a
        new TLS one may hold the server's session tickets, and no earlier answer.

        Over TLS the loop's transport reads the socket into OpenSSL, which keeps a record
        that arrived but for its last bytes where nothing tells (`received_bytes`): a
        connection whose socket received anything since it went idle is out of step too.
        In plain HTTP a byte the kernel received is in the socket (the poll sees it) or was
        read, and handed to `data_received`, which took the connection out of use: the
        `TCP_INFO` query (a system call and a socket object per ask, each way) is asked
        only over TLS."""
        poller = self._poller
        if poller is not None and self._idle_from is None:  # plain HTTP, asked before
            try:
                return bool(poller.poll(0))
            except (OSError, ValueError):
                return True  # cannot tell: not worth the risk
        sock = None if self.transport is None else self.transport.get_extra_info("socket")
        if sock is None:
            return False  # no socket to look at (a test transport)
        if self._idle_from is not None and received_bytes(sock) != self._idle_from:
            return True
        if poller is None:  # registered once per connection, asked before each reuse
            try:
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLIN)
            except (OSError, ValueError):
                return True  # cannot tell: not worth the risk
            self._poller = poller
        try:
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True  # cannot tell: not worth the risk

    def _out_of_step(self) -> None:
        if self.response is not None:
            self.response._keep_alive = False
        self.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Connection:
    """A connection `HttpPool.connect()` handed out and no request has used yet."""

    def __init__(self, pool: HttpPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.peer = conn.peer
        self.tenant = conn.holder  # a reconnect in `request()` holds it for them too

    @property
    def closed(self) -> bool:
        """The backend closed it while it waited (a request on it reconnects)."""
        return self._conn is not None and self._conn.closed

    def release(self) -> None:
        """Give it back unused (no-op once a request took it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if conn.closed:
                self._pool._forget(conn)
            else:
                self._pool._put_idle(conn)


_IDENTITY = b"\r\naccept-encoding: identity"  # on every request (`request_head`)


def request_head(
    host: bytes, method: bytes, path: bytes, headers: Iterable[tuple[bytes, bytes]], length: int
) -> bytes:
    """The request line and header fields of one request to `host` (its `host` field)."""
    lines = [method, b" ", path, b" HTTP/1.1\r\nhost: ", host]
    # The body is relayed and hashed as it comes, never decoded: no content coding
    # (without the field, RFC 9110 reads any coding as acceptable).
    lines += (_IDENTITY, b"\r\ncontent-length: ", str(length).encode(), b"\r\n")
    for name, value in headers:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def ssl_reason(exc: ssl.SSLError) -> str:
    """What a TLS failure says, briefly: the verification message or OpenSSL's reason."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc.reason or exc.strerror or type(exc).__name__).lower().replace("_", " ")


def _coded(value: bytes, accepted: bytes) -> bool:
    """Whether a `content-encoding` or `transfer-encoding` field value names a coding other
    than `accepted` (any case, around spaces and empty list members)."""
    return any(coding.strip(b" \t").lower() not in (b"", accepted) for coding in value.split(b","))
