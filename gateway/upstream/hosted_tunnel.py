"""A hosted call's connection on httpx's own transport opens within the connect timeout,
through a proxy's CONNECT too.

LiteLLM 1.108.7 serves some providers (`maritalk/`, `oobabooga/`, `nlp_cloud/`, `petals/`,
`amazon_nova/`, `custom/`) only synchronously, in a worker thread, on its sync httpx
client, whose transport is httpx's (httpcore's), not the counted aiohttp connector
(gateway/upstream/hosted_sockets.py). httpcore gives the TCP connect and the TLS handshake
its connect timeout, LiteLLM's own 5 s (`HTTP_HANDLER_CONNECT_TIMEOUT_SECONDS`) rather than
`limits.connect_timeout_s`; and it reads a proxy's answer to CONNECT with the request's
read timeout, the call's first-byte timeout: a backend `proxy` that accepted the
connection and never answered CONNECT held each attempt until the first-byte timeout
(120 s by default) before it failed over, and the worker thread as long.

`cap_connect(request)` (the watched call's httpx `send`, gateway/upstream/hosted_transport.py)
gives a request's connect timeout `limits.connect_timeout_s` at most, and
`bound_tunnel(transport)` (the transport through the backend's `proxy` made for a client)
has each connection it opens read and write the CONNECT exchange within the time left of
the connect timeout, counted from the TCP connect: past it the attempt fails as a
connect timeout. The TLS handshake through the tunnel has the connect timeout of its own
(httpcore's), so a connection through a proxy opens within twice the connect timeout at
most.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from gateway.upstream.sockets import hosted_connect_timeout

__all__ = ["bound_tunnel", "cap_connect"]

_CONNECT = b"CONNECT "


def cap_connect(request: Any) -> None:
    """Give `request` (an httpx request) a connect timeout of `limits.connect_timeout_s`
    at most."""
    seconds = hosted_connect_timeout()
    timeouts = getattr(request, "extensions", {}).get("timeout")
    if seconds is None or not isinstance(timeouts, dict):
        return
    connect = timeouts.get("connect")
    if connect is None or connect > seconds:
        request.extensions["timeout"] = {**timeouts, "connect": seconds}


def bound_tunnel(
    transport: Any, seconds: Callable[[], float | None] = hosted_connect_timeout
) -> Any:
    """`transport` (an httpx transport through a proxy) whose connections read and write
    a CONNECT exchange within `seconds()` (read as each connection opens: the connect
    timeout) of their TCP connect; returns it."""
    pool: Any = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        return transport  # not httpcore's pool: left as it is
    errors = importlib.import_module(type(pool).__module__.split(".")[0])
    if inspect.iscoroutinefunction(getattr(backend, "connect_tcp", None)):
        pool._network_backend = _AsyncBackend(backend, errors, seconds)
    else:
        pool._network_backend = _Backend(backend, errors, seconds)
    return transport


class _Tunnel:
    """What a connection's CONNECT exchange may take: the time left of the connect
    timeout, from its TCP connect, once a CONNECT was written; none after its TLS."""

    def __init__(self, errors: Any, seconds: float | None) -> None:
        self.by = None if seconds is None else time.monotonic() + seconds
        self.tunnelling = False
        self.errors = errors  # httpcore (its ConnectTimeout, ReadTimeout, WriteTimeout)

    def note(self, buffer: bytes) -> None:
        if buffer.startswith(_CONNECT):
            self.tunnelling = True

    def capped(self, timeout: float | None) -> float | None:
        if not self.tunnelling or self.by is None:
            return timeout
        left = max(self.by - time.monotonic(), 0.001)
        return left if timeout is None else min(timeout, left)

    def failure(self, exc: Exception) -> Exception:
        """A timed-out CONNECT exchange as the connect timeout it is."""
        timeouts = (self.errors.ReadTimeout, self.errors.WriteTimeout)
        if self.tunnelling and isinstance(exc, timeouts):
            timed_out: Exception = self.errors.ConnectTimeout("no answer to CONNECT in time")
            return timed_out
        return exc


class _Stream:
    def __init__(self, stream: Any, tunnel: _Tunnel) -> None:
        self._stream = stream
        self._tunnel = tunnel

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data: bytes = self._stream.read(max_bytes, self._tunnel.capped(timeout))
            return data
        except Exception as exc:
            raise self._tunnel.failure(exc) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._tunnel.note(buffer)
        try:
            self._stream.write(buffer, self._tunnel.capped(timeout))
        except Exception as exc:
            raise self._tunnel.failure(exc) from exc

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        return self._stream.start_tls(ssl_context, server_hostname, timeout)  # its own bound

    def close(self) -> None:
        self._stream.close()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Backend:
    def __init__(self, backend: Any, errors: Any, seconds: Callable[[], float | None]) -> None:
        self._backend = backend
        self._errors = errors
        self._seconds = seconds

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _Stream:
        tunnel = _Tunnel(self._errors, self._seconds())
        return _Stream(self._backend.connect_tcp(*args, **kwargs), tunnel)

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        return self._backend.connect_unix_socket(*args, **kwargs)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _AsyncStream:
    def __init__(self, stream: Any, tunnel: _Tunnel) -> None:
        self._stream = stream
        self._tunnel = tunnel

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data: bytes = await self._stream.read(max_bytes, self._tunnel.capped(timeout))
            return data
        except Exception as exc:
            raise self._tunnel.failure(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._tunnel.note(buffer)
        try:
            await self._stream.write(buffer, self._tunnel.capped(timeout))
        except Exception as exc:
            raise self._tunnel.failure(exc) from exc

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        return await self._stream.start_tls(ssl_context, server_hostname, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _AsyncBackend:
    def __init__(self, backend: Any, errors: Any, seconds: Callable[[], float | None]) -> None:
        self._backend = backend
        self._errors = errors
        self._seconds = seconds

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> _AsyncStream:
        tunnel = _Tunnel(self._errors, self._seconds())
        return _AsyncStream(await self._backend.connect_tcp(*args, **kwargs), tunnel)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        return await self._backend.connect_unix_socket(*args, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
