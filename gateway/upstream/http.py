"""A small keep-alive HTTP/1.1 client for the private-backend hot path.

Why not httpx or aiohttp: the gateway relays bytes and adds well under a millisecond;
a general client costs more per request than everything else in the gateway combined.
This one does exactly what pass-through needs: one request per connection at a time,
`httptools` parsing, body chunks handed over as they arrive (no buffering beyond the
flow-control watermark), first-byte and read timeouts, and `abort()` to cancel the
upstream work when the client goes away.

A backend is trusted to serve, not to be well-behaved: `read()` stops at a byte limit
(also when `content-length` announces more) and at a deadline (a body that drips one
byte at a time resets the read timeout forever), dropping the connection either way; a
byte that arrives after the response is complete is never handed to anyone, and the
connection it came on is closed, never reused.

An https backend is authenticated on every new connection before a request byte is
written (`gateway.upstream.tls.BackendTLS`: its CA, name, pins, certificate facts); a
certificate refused is `UpstreamError("tls")`, never a reason to retry in plain HTTP.
`connect()` hands out a connection with its authenticated `peer`, so the caller can record
who it is talking to before `request(connection=...)` sends on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import AsyncGenerator, Iterable
from typing import Literal, cast
from urllib.parse import urlsplit

import httptools

from gateway.upstream.tls import BackendTLS, Peer, TLSRejectedError, system_tls

__all__ = ["DEFAULT_MAX_BODY", "Connection", "HttpPool", "UpstreamError", "UpstreamResponse"]

_HIGH_WATER = 256 * 1024
_TIMER_SLACK_S = 0.001  # how early a loop may run a timer (uvloop: millisecond ticks)

# busy: this gateway already has max_connections open to the backend (not a backend fault)
# too_large: the answer passed the byte limit of `read()` (the connection was dropped)
# tls: the handshake failed, or the certificate is not one this backend may present
FailureKind = Literal["connect", "timeout", "closed", "protocol", "busy", "too_large", "tls"]

DEFAULT_MAX_BODY = 16 * 1024 * 1024  # `read()`'s limit unless the pool is given another


class UpstreamError(Exception):
    """A backend could not be reached, timed out, or broke the connection."""

    def __init__(self, kind: FailureKind, detail: str, *, sent_nothing: bool = False) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: FailureKind = kind
        self.detail = detail
        # True when the failure happened before any response byte arrived on a
        # connection that was reused: the server closed it while idle.
        self.sent_nothing = sent_nothing


class _Connection(asyncio.Protocol):
    """One TCP connection; parses responses and feeds the current `UpstreamResponse`."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.reused = False
        self.counted = True  # holds one of the pool's connection slots
        self.interim = False  # parsing a 1xx response, which precedes the real one
        self.close_delimited = False  # body ends when the backend closes the connection
        self.peer: Peer | None = None  # who the TLS handshake authenticated (None: plain HTTP)

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
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.response._fail(UpstreamError("protocol", "unexpected upgrade"))
            self.close()
        except httptools.HttpParserError as exc:
            self.response._fail(UpstreamError("protocol", f"bad HTTP response: {exc}"))
            self.close()

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
            self.response._fail(UpstreamError("tls", _ssl_reason(exc)))
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
        if response is None or response.complete:
            return  # part of a message after the response: dropped
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
        response.status = status
        has_length = any(
            name in (b"content-length", b"transfer-encoding") for name, _ in response.headers
        )
        self.close_delimited = not has_length and status not in (204, 304)
        response._wake()

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            return  # never appended to an answer that already ended
        response._push(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or response.complete:
            return
        if self.interim:
            self.interim = False
            return
        response.complete = True
        response._keep_alive = self.parser.should_keep_alive()
        response._wake()

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


class UpstreamResponse:
    """The response of one upstream request; body bytes arrive as `chunks()` yields."""

    def __init__(self, conn: _Connection, read_timeout: float) -> None:
        self._conn = conn
        self._read_timeout = read_timeout
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        # The body had no length and no chunked framing: it ended when the backend closed
        # the connection, which a backend that died mid-answer does too.
        self.ended_by_close = False
        self._keep_alive = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        # One timer per response, not one per read: a read sets `_due`, and the timer is
        # moved only when that comes sooner than it fires (`_wait`, `_check_due`).
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # event-loop time the current read gives up
        self._due_what = ""
        self._error: UpstreamError | None = None
        self._released = False
        self.sent_at = 0.0  # event-loop time the request went out

    @property
    def response_deadline(self) -> float | None:
        """When a whole answer must have ended (event-loop time; None: no deadline)."""
        timeout = self._conn.pool.response_timeout
        return None if timeout is None else self.sent_at + timeout

    @property
    def stream_deadline(self) -> float | None:
        """When a stream must have ended (event-loop time; None: no deadline)."""
        timeout = self._conn.pool.stream_timeout
        return None if timeout is None else self.sent_at + timeout

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # fed by the connection
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _push(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    async def _wait(self, timeout: float, what: str) -> None:
        """Wait for bytes, the end or an error, at most `timeout` seconds (then `timeout`).
        A stream's reads come one after another, each with its own deadline; arming and
        cancelling a timer for each would cost more than the read, so the response keeps
        one timer, armed at the earliest deadline still pending and moved on when it fires
        early (`_check_due`)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        due = self._due = loop.time() + timeout
        self._due_what = what
        timer = self._timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._check_due)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_due(self) -> None:
        """The timer: fail a read that is past its deadline, or move on to it."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits now: the next read arms the timer again
        loop = waiter.get_loop()
        # Timers may fire up to the loop's clock resolution early (1 ms on uvloop).
        if loop.time() + _TIMER_SLACK_S >= self._due:
            waiter.set_exception(UpstreamError("timeout", self._due_what))
        else:
            self._timer = loop.call_at(self._due, self._check_due)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait_headers(self, timeout: float) -> None:
        while self.status == 0 and self._error is None:
            try:
                await self._wait(timeout, "no response from backend in time")
            except UpstreamError:
                self.abort()
                raise
        if self.status == 0 and self._error is not None:
            self.abort()
            raise self._error

    async def chunks(self, deadline: float | None = None) -> AsyncGenerator[bytes, None]:
        """Yield body bytes as they arrive; raises `UpstreamError` if the body breaks off,
        or (`timeout`) if it has not ended by `deadline` (event-loop time), however
        steadily it arrives."""
        chunks = self._chunks
        loop = asyncio.get_running_loop()
        while True:
            if deadline is not None and not self.complete and loop.time() >= deadline:
                self.abort()
                raise UpstreamError("timeout", "the answer did not end in time")
            if chunks:
                data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
                chunks.clear()
                self._buffered = 0
                if self._paused and self._conn.transport:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield data
                continue
            if self.complete:
                self.release()
                return
            if self._error is not None:
                self.abort()
                raise self._error
            wait, what = self._read_timeout, "backend stopped sending mid-response"
            if deadline is not None and deadline - loop.time() < wait:
                wait, what = deadline - loop.time(), "the answer did not end in time"
            try:
                await self._wait(wait, what)
            except UpstreamError:
                self.abort()
                raise

    async def read(self, limit: int | None = None, *, deadline: float | None = None) -> bytes:
        """The whole body, of at most `limit` bytes (default: the pool's `max_body`), by
        `deadline` (event-loop time; default: `response_deadline`). Past the limit the
        connection is dropped at once, without reading on (`UpstreamError("too_large")`),
        also when `content-length` announces more; past the deadline, it is dropped too
        (`UpstreamError("timeout")`)."""
        if limit is None:
            limit = self._conn.pool.max_body
        if deadline is None:
            deadline = self.response_deadline
        announced = self.header(b"content-length")
        if announced is not None and announced.isdigit() and int(announced) > limit:
            self.abort()
            raise UpstreamError("too_large", f"the backend announced more than {limit} bytes")
        if self.complete and self._error is None and not self._paused:
            # The whole answer came with its head (the common case for short answers):
            # no generator, no wait.
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            if len(data) > limit:
                self.abort()
                raise UpstreamError("too_large", f"the answer is over {limit} bytes")
            self.release()
            return data
        parts: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.chunks(deadline)) as chunks:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    self.abort()
                    raise UpstreamError("too_large", f"the answer is over {limit} bytes")
                parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Return the connection to the pool if the exchange finished cleanly."""
        if self._released:
            return
        self._released = True
        self._disarm()
        conn = self._conn
        conn.response = None
        if self.complete and self._keep_alive and not conn.closed:
            conn.pool._put_idle(conn)
        else:
            conn.close()
            conn.pool._forget(conn)

    def abort(self) -> None:
        """Drop the connection: the backend sees a disconnect and stops work on it."""
        if self._released:
            return
        self._released = True
        self._disarm()
        self._conn.response = None
        self._conn.abort()
        self._conn.pool._forget(self._conn)
        self._fail(UpstreamError("closed", "request cancelled"))


class Connection:
    """A connection `HttpPool.connect()` handed out and no request has used yet."""

    def __init__(self, pool: HttpPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.peer = conn.peer

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


def _ssl_reason(exc: ssl.SSLError) -> str:
    """What a TLS failure says, briefly: the verification message or OpenSSL's reason."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc.reason or exc.strerror or type(exc).__name__).lower().replace("_", " ")


class HttpPool:
    """Keep-alive connections to one backend origin (`host:port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: BackendTLS | bool = False,
        connect_timeout: float,
        first_byte_timeout: float,
        read_timeout: float,
        max_connections: int,
        max_body: int = DEFAULT_MAX_BODY,
        response_timeout: float | None = None,
        stream_timeout: float | None = None,
    ) -> None:
        """`max_body` bounds what `read()` takes in; `response_timeout` is how long a
        whole answer read with `read()` may take from the request being sent;
        `stream_timeout` the same for a stream (`UpstreamResponse.stream_deadline`).
        `tls`: how to authenticate the backend (True: the system's roots and `host`)."""
        self.host = host
        self.port = port
        literal = f"[{host}]" if ":" in host else host
        self._host_header = f"{literal}:{port}".encode("ascii")
        self.tls = tls if isinstance(tls, BackendTLS) else (system_tls(host) if tls else None)
        self._connect_timeout = connect_timeout
        self._first_byte_timeout = first_byte_timeout
        self._read_timeout = read_timeout
        self.max_body = max_body
        self.response_timeout = response_timeout
        self.stream_timeout = stream_timeout
        self._idle: collections.deque[_Connection] = collections.deque()
        self._limit = asyncio.Semaphore(max_connections)
        self._open = 0

    @classmethod
    def for_url(
        cls,
        base_url: str,
        *,
        connect_timeout: float,
        first_byte_timeout: float,
        read_timeout: float,
        max_connections: int,
        max_body: int = DEFAULT_MAX_BODY,
        response_timeout: float | None = None,
        stream_timeout: float | None = None,
        tls: BackendTLS | None = None,
    ) -> tuple[HttpPool, bytes]:
        """A pool for an `http(s)://host[:port][/prefix]` URL, and the path prefix; an
        https URL is authenticated with `tls` (default: the system's roots)."""
        parts = urlsplit(base_url)
        if parts.hostname is None or parts.scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        secure = parts.scheme == "https"
        if tls is not None and not secure:
            raise ValueError(f"TLS settings for a plain-HTTP URL: {base_url!r}")
        pool = cls(
            parts.hostname,
            parts.port or (443 if secure else 80),
            tls=(tls or True) if secure else False,
            connect_timeout=connect_timeout,
            first_byte_timeout=first_byte_timeout,
            read_timeout=read_timeout,
            max_connections=max_connections,
            max_body=max_body,
            response_timeout=response_timeout,
            stream_timeout=stream_timeout,
        )
        return pool, parts.path.rstrip("/").encode()

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def saturated(self) -> bool:
        """Every connection slot is taken: a new request waits for one (up to the
        connect timeout), then fails as `busy`."""
        return self._limit.locked()

    @property
    def first_byte_timeout(self) -> float:
        return self._first_byte_timeout

    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        first_byte_timeout: float | None = None,
        *,
        connection: Connection | None = None,
    ) -> UpstreamResponse:
        """Send a request; returns once the status line and headers have arrived (within
        `first_byte_timeout`, default the pool's, else `UpstreamError("timeout")`).

        On `connection` (from `connect()`): the request goes to the peer it authenticated,
        also if a stale pooled connection makes it reconnect (else `UpstreamError("tls")`)."""
        head = self._head(method, path, headers, len(body))
        wait = self._first_byte_timeout if first_byte_timeout is None else first_byte_timeout
        for attempt in range(2):
            if attempt == 0 and connection is not None:
                if connection._conn is None:
                    raise ValueError("this connection was used or released already")
                conn = connection._conn
            elif attempt == 0:
                conn = await self._acquire()
            else:
                conn = await self._connect()
                if connection is not None and conn.peer != connection.peer:
                    conn.abort()
                    self._forget(conn)
                    raise UpstreamError(
                        "tls", "the backend presented another certificate on reconnecting"
                    )
            if connection is not None:
                connection._conn = None  # consumed: the response owns it now
            if conn.closed:  # closed while it waited (a leased one, for its dispatch record)
                self._forget(conn)
                if attempt == 0:
                    continue
                raise UpstreamError("closed", "backend closed the connection before answering")
            response = UpstreamResponse(conn, self._read_timeout)
            conn.response = response
            response.sent_at = asyncio.get_running_loop().time()
            assert conn.transport is not None
            conn.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.transport.write(body)
            try:
                await response._wait_headers(wait)
            except UpstreamError as exc:
                # A reused connection the server had already closed: retry once, fresh.
                if exc.sent_nothing and attempt == 0:
                    continue
                raise
            except BaseException:
                response.abort()  # cancelled: the backend must stop working on it
                raise
            return response
        raise AssertionError("unreachable")

    async def connect(self) -> Connection:
        """A connection to send the next request on, its TLS peer already authenticated
        (`Connection.peer`), so the caller can record who it is before sending. Hand it to
        `request(connection=...)`, or back with `Connection.release()`."""
        return Connection(self, await self._acquire())

    def _head(
        self, method: bytes, path: bytes, headers: Iterable[tuple[bytes, bytes]], length: int
    ) -> bytes:
        lines = [method, b" ", path, b" HTTP/1.1\r\nhost: ", self._host_header]
        lines += (b"\r\ncontent-length: ", str(length).encode(), b"\r\n")
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _acquire(self) -> _Connection:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
            self._forget(conn)
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._limit.acquire()
        except TimeoutError as exc:
            raise UpstreamError("busy", "too many open connections to the backend") from exc
        self._open += 1
        tls = self.tls
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=None if tls is None else tls.context,
                    server_hostname=None if tls is None else tls.server_name,
                )
        except TimeoutError as exc:
            self._release_slot()
            raise UpstreamError("connect", "connect timed out") from exc
        except ssl.SSLError as exc:  # before OSError, its base class
            self._release_slot()
            raise UpstreamError("tls", _ssl_reason(exc)) from exc
        except OSError as exc:
            self._release_slot()
            raise UpstreamError("connect", exc.strerror or type(exc).__name__) from exc
        except BaseException:
            self._release_slot()  # cancelled (client gone, shutdown): give the slot back
            raise
        if tls is not None:
            assert conn.transport is not None
            try:  # before a byte of any request is written
                conn.peer = tls.check(conn.transport.get_extra_info("ssl_object"))
            except TLSRejectedError as exc:
                conn.abort()
                self._forget(conn)
                raise UpstreamError("tls", str(exc)) from exc
        return conn

    def _release_slot(self) -> None:
        self._open -= 1
        self._limit.release()

    def _put_idle(self, conn: _Connection) -> None:
        self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        if conn.counted:
            conn.counted = False
            self._release_slot()

    async def close(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            conn.close()
            self._forget(conn)
