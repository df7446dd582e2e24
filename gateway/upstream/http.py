"""A small keep-alive HTTP/1.1 client for the private-backend hot path.

Why not httpx or aiohttp: the gateway relays bytes and adds well under a millisecond;
a general client costs more per request than everything else in the gateway combined.
This one does exactly what pass-through needs: one request per connection at a time,
`httptools` parsing, body chunks handed over as they arrive (no buffering beyond the
flow-control watermark), first-byte and read timeouts, and `abort()` to cancel the
upstream work when the client goes away.

A backend is trusted to serve, not to be well-behaved: `read()` stops at a byte limit
(also when `content-length` announces more) and at a deadline (a body that drips one
byte at a time resets the read timeout forever), dropping the connection either way; the
status line and headers stop at `MAX_HEAD` bytes (httptools gathers a header line whole
before handing it over, so without a limit one endless header would grow until the
first-byte timeout), and so do the bytes between two body bytes (chunk framing, and a
chunked body's trailer fields, which are never kept: bytes that keep arriving without a
body byte would otherwise be read until the read timeout, and trailers kept); a final
status outside 200-599 (the parser takes any three digits) fails the attempt, and so does
an answer in a coding the client did not ask for (every request says `accept-encoding:
identity`; a `content-encoding` other than identity, or a transfer coding other than
chunked, is `UpstreamError("encoding")`: the bytes would reach the gateway's client
undecodable, labelled JSON or SSE, and nothing is decompressed here); a byte
that arrives after the response is complete is never handed to anyone, and the
connection it came on is closed, never reused (also when it is still unread in the
socket as the next request takes the connection: `unread`).

An https backend is authenticated on every new connection (dial.py) before a request
byte is written (`gateway.upstream.tls.BackendTLS`: its CA, name, pins, certificate
facts); a certificate refused is `UpstreamError("tls")`, never a reason to retry in plain
HTTP.
`connect()` hands out a connection with its authenticated `peer`, so the caller can record
who it is talking to before `request(connection=...)` sends on it.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from gateway.upstream.connection import MAX_HEAD, Connection, _Connection, request_head
from gateway.upstream.dial import dial, peer_of
from gateway.upstream.failures import UpstreamError
from gateway.upstream.response import UpstreamResponse
from gateway.upstream.sockets import BackendSockets
from gateway.upstream.tenant_share import TenantShare
from gateway.upstream.tls import BackendTLS, system_tls

__all__ = [
    "DEFAULT_MAX_BODY",
    "MAX_HEAD",
    "Connection",
    "HttpPool",
    "UpstreamError",
    "UpstreamResponse",
]

DEFAULT_MAX_BODY = 16 * 1024 * 1024  # `read()`'s limit unless the pool is given another
_RETRUSTED_TRIES = 3  # connections made again when reloads replace the TLS settings meanwhile
_RETIRED = "the connection pool was closed (its config retired, or the gateway stopping)"


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
        sockets: BackendSockets | None = None,
        tenant_cap: int | None = None,
    ) -> None:
        """`max_body` bounds what `read()` takes in; `response_timeout` is how long a
        whole answer read with `read()` may take from the request being sent;
        `stream_timeout` the same for a stream (`UpstreamResponse.stream_deadline`).
        `tls`: how to authenticate the backend (True: the system's roots and `host`).
        `sockets`: the count of open backend connections this pool shares with the
        process's other pools (gateway/upstream/sockets.py), None: counted alone.
        `tenant_cap`: how many connections one tenant may hold (tenant_share.py)."""
        self.host = host
        self.port = port
        literal = f"[{host}]" if ":" in host else host
        self._host_header = f"{literal}:{port}".encode("ascii")
        self.tls = tls if isinstance(tls, BackendTLS) else (system_tls(host) if tls else None)
        # After `retrust`: the settings the pool was built with, which the requests still
        # using it were decided under; a new connection must satisfy them too.
        self._built_with: BackendTLS | None = None
        # The pools this one replaced at a reload (`succeed`), still used by requests that
        # began before it: each `retrust` of this pool is theirs too.
        self._predecessors: weakref.WeakSet[HttpPool] = weakref.WeakSet()
        self._connect_timeout = connect_timeout
        self._first_byte_timeout = first_byte_timeout
        self._read_timeout = read_timeout
        self.max_body = max_body
        self.response_timeout = response_timeout
        self.stream_timeout = stream_timeout
        self._idle: collections.deque[_Connection] = collections.deque()
        self._limit = asyncio.Semaphore(max_connections)
        self._open = 0
        self._sockets = BackendSockets(max_connections) if sockets is None else sockets
        self.share = TenantShare(tenant_cap)
        self.closed = False  # `close()`d: opens no connection, pools none

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
        sockets: BackendSockets | None = None,
        tenant_cap: int | None = None,
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
            sockets=sockets,
            tenant_cap=tenant_cap,
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
        withdrawn: Callable[[], str | None] | None = None,
        tenant: str | None = None,
    ) -> UpstreamResponse:
        """Send a request; returns once the status line and headers have arrived (within
        `first_byte_timeout`, default the pool's, else `UpstreamError("timeout")`).

        On `connection` (from `connect()`): the request goes to the peer it authenticated,
        also if a stale pooled connection makes it reconnect (else `UpstreamError("tls")`).
        `withdrawn` (a reload moved the backend, say) is asked before that reconnect and
        again right before the request is written: a reason it gives is
        `UpstreamError("retired", reason)`, with nothing written and no connection made
        after it said so: the retry comes after a wait (the stale connection's close, the
        connect itself) that a reload may land in. The connection is held for `tenant`
        (that of `connection` on it), within its share (tenant_share.py)."""
        head = request_head(self._host_header, method, path, headers, len(body))
        wait = self._first_byte_timeout if first_byte_timeout is None else first_byte_timeout
        if connection is not None:
            tenant = connection.tenant
        for attempt in range(2):
            if attempt == 0 and connection is not None:
                if connection._conn is None:
                    raise ValueError("this connection was used or released already")
                conn = connection._conn
            elif attempt == 0:
                conn = await self.share.take(tenant, self._acquire)
            else:
                gone = None if withdrawn is None else withdrawn()
                if gone is not None:  # no handshake at an address given up either
                    raise UpstreamError("retired", gone)
                conn = await self.share.take(tenant, self._connect)
                if connection is not None and conn.peer != connection.peer:
                    # A key the settings accept (a replica behind the same name, a renewed
                    # certificate), only not the one the request's record names: the
                    # leased connection was lost, which opens no breaker at once as a
                    # refused certificate ("tls") does.
                    conn.abort()
                    self._forget(conn)
                    raise UpstreamError(
                        "closed", "the backend presented another certificate on reconnecting"
                    )
            if connection is not None:
                connection._conn = None  # consumed: the response owns it now
            if attempt == 0 and not conn.closed and conn.unfit():
                conn.abort()  # out of step, or its certificate expired since it was made
            if conn.closed:  # closed while it waited (a leased one, for its dispatch record)
                self._forget(conn)
                if attempt == 0:
                    continue
                raise UpstreamError("closed", "backend closed the connection before answering")
            gone = None if withdrawn is None else withdrawn()
            if gone is not None:  # the gateway's doing (no breaker verdict): nothing written
                conn.abort()
                self._forget(conn)
                raise UpstreamError("retired", gone)
            response = UpstreamResponse(conn, self._read_timeout)
            conn.response, conn.quiet_bytes = response, 0
            response.sent_at = response.loop.time()
            assert conn.transport is not None
            if body:  # one writev, and the body is not copied behind its head
                conn.transport.writelines((head, body))
            else:
                conn.transport.write(head)
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

    async def connect(self, tenant: str | None = None) -> Connection:
        """A connection to send the next request on, its TLS peer already authenticated
        (`Connection.peer`), so the caller can record who it is before sending. Hand it to
        `request(connection=...)`, or back with `Connection.release()`. Held for `tenant`
        within its share (tenant_share.py), else `UpstreamError("busy")`."""
        return Connection(self, await self.share.take(tenant, self._acquire))

    async def _acquire(self) -> _Connection:
        self._refuse_if_closed()
        idle = self._idle
        while idle:
            conn = idle.pop()
            self._sockets.taken(conn)
            if conn.lapsed():  # its certificate expired while it was kept alive
                conn.close()
            if not conn.closed:
                conn.reused = True
                return conn
            self._forget(conn)
        return await self._connect()

    async def _connect(self) -> _Connection:
        """A new connection, authenticated under the settings current when it is handed
        out: one made while a reload replaced them (`retrust`) is dropped and made again,
        since the backend did nothing wrong (a `tls` failure would open its breaker)."""
        for _ in range(_RETRUSTED_TRIES):
            self._refuse_if_closed()
            tls = self.tls
            conn = await self._connect_under(tls)
            if tls is self.tls and not self.closed:
                return conn
            conn.abort()  # authenticated under settings a reload retired meanwhile, or closed
            self._forget(conn)
        raise UpstreamError("connect", "the backend's TLS settings kept changing while connecting")

    async def _connect_under(self, tls: BackendTLS | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._limit.acquire()
        except TimeoutError as exc:
            raise UpstreamError("busy", "too many open connections to the backend") from exc
        try:
            self._sockets.make_room()  # idle ones of any pool, at the process's share
        except BaseException:  # a hosted connector failing (hosted_sockets.py): the slot back
            self._limit.release()
            raise
        self._open += 1
        self._sockets.open += 1
        try:
            conn = await dial(
                loop, lambda: _Connection(self), self.host, self.port, tls, self._connect_timeout
            )
        except BaseException:  # failed, or cancelled (client gone, shutdown): the slot back
            self._release_slot()
            raise
        if tls is not None:
            try:  # before a byte of any request is written
                conn.peer = peer_of(conn, tls, self._built_with)
            except BaseException:  # refused, or whatever else: the slot is given back
                conn.abort()
                self._forget(conn)
                raise
        conn.tls = tls
        conn.loop = loop
        return conn

    def retrust(self, tls: BackendTLS) -> None:
        """Authenticate new connections with `tls` from now on (a reload replaced this
        backend's TLS settings or files), and close the idle ones, which were
        authenticated under the old. A connection a request holds now finishes that
        request; none is handed out again. A new connection must also pass the pins and
        certificate facts the pool was built with (the requests still using it were
        decided under them): only what both the old and the new settings accept. The
        same for the pools this one replaced (`succeed`), each with its own."""
        for pool in (self, *self._predecessors):
            pool._take(tls)

    def _take(self, tls: BackendTLS) -> None:
        if self._built_with is None:
            self._built_with = self.tls
        self.tls = tls
        while self._idle:
            conn = self._idle.pop()
            self._sockets.taken(conn)
            conn.close()
            self._forget(conn)

    @property
    def lineage(self) -> tuple[HttpPool, ...]:
        """This pool and the pools it replaced (`succeed`) that are still in use."""
        return (self, *self._predecessors)

    def succeed(self, predecessor: HttpPool) -> None:
        """This pool replaces `predecessor` (a reload rebuilt the backend, at the same
        origin), whose requests still running finish on it: every later `retrust` of
        this pool retrusts `predecessor` too, and the pools it replaced, so settings a
        later reload withdraws are withdrawn from all of them, not only from the pool that
        reload retired. Held weakly, and each directly (a pool in between that no request
        uses any more may go while an older one is still in use)."""
        self._predecessors.update(predecessor.lineage)
        self._predecessors.discard(self)

    def _release_slot(self) -> None:
        self._open -= 1
        self._sockets.open -= 1
        self._limit.release()

    def _refuse_if_closed(self) -> None:
        if self.closed:  # the gateway's doing, not the backend's: no breaker verdict
            raise UpstreamError("retired", _RETIRED)

    def _put_idle(self, conn: _Connection) -> None:
        self.share.give_back(conn)
        # authenticated under settings a reload replaced, or for a pool closed since
        if conn.tls is not self.tls or self.closed:
            conn.close()
            self._forget(conn)
            return
        conn.went_idle()
        self._idle.append(conn)
        self._sockets.idle(self, conn)

    def drop_idle(self, conn: _Connection) -> None:
        """Close `conn`, one of this pool's idle connections (`BackendSockets`)."""
        self._idle.remove(conn)
        conn.close()
        self._forget(conn)

    def _forget(self, conn: _Connection) -> None:
        self.share.give_back(conn)
        if conn.counted:
            conn.counted = False
            self._release_slot()

    async def close(self) -> None:
        """Close the idle connections and open no more (its config was retired, or the
        gateway stops): a request still running past `limits.drain_timeout_s` that asks
        for a connection gets `UpstreamError("retired")`, a connection whose handshake is
        under way is dropped, and one a request holds is closed when that request ends."""
        self.closed = True
        while self._idle:
            conn = self._idle.pop()
            self._sockets.taken(conn)
            conn.close()
            self._forget(conn)
