"""Running the sidecar: the relay (`AttestRelay`) behind its own listener
(`gateway/attest/protocol.py`) on uvloop, plain or TLS.

`serve()` is `owngate attest`: on SIGTERM or SIGINT it stops listening, closes idle
connections, lets running requests finish (up to `DRAIN_S`), then flushes the log and
signs its final checkpoint. `AttestThread` runs the same in a background thread (the
demo, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import threading
from collections.abc import Callable
from types import TracebackType

import uvloop

from gateway.attest.app import AttestRelay
from gateway.attest.listener import SHUTDOWN_TIMEOUT_S, TlsAcceptor
from gateway.attest.protocol import Listener
from gateway.attest.settings import AttestSettings
from gateway.config.schema import ListenSettings
from gateway.listener_limits import ListenerLimits
from gateway.serving import bind_socket, settle_heap

__all__ = ["DRAIN_S", "AttestThread", "serve"]

DRAIN_S = 20.0  # how long running requests may take to finish at shutdown


class _Running:
    """One started sidecar on the running loop."""

    def __init__(
        self, relay: AttestRelay, listener: Listener, server: asyncio.Server | TlsAcceptor
    ) -> None:
        self.relay = relay
        self.listener = listener
        self.server = server

    @classmethod
    async def start(
        cls,
        settings: AttestSettings,
        sock: socket.socket,
        context: ssl.SSLContext | None,
        listen: ListenSettings,
        tls_shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
    ) -> _Running | str:
        """Started, or why it could not start."""
        relay = AttestRelay(settings)
        failure = await relay.open()
        if failure is not None:
            await relay.close()
            return failure
        limits = ListenerLimits.from_config(listen)
        listener = Listener(
            relay,
            limits,
            settings.max_body,
            listen.keepalive_timeout_s,
            write_timeout_s=limits.write_timeout_s,
            max_held_body=settings.max_held_body,
            client_pins=settings.client_pins,
        )
        # A TLS handshake is bounded like a request head, and counts against the cap from
        # the moment its connection is accepted (`TlsAcceptor`).
        server: asyncio.Server | TlsAcceptor
        if context is None:
            server = await asyncio.get_running_loop().create_server(
                listener.protocol, sock=sock, backlog=2048
            )
        else:
            server = TlsAcceptor(
                listener, sock, context, limits.header_timeout_s, tls_shutdown_timeout_s
            )
            server.start()
        return cls(relay, listener, server)

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        self.server.close()
        listener = self.listener
        listener.draining = True  # running requests end with `connection: close`
        listener.close_idle()
        tasks = [c.task for c in listener.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=drain_s)
        for connection in list(listener.connections):
            connection.transport.abort()
        await self.relay.close()


def serve(
    settings: AttestSettings,
    sock: socket.socket,
    context: ssl.SSLContext | None = None,
    listen: ListenSettings | None = None,
    on_ready: Callable[[], None] | None = None,
) -> tuple[int, str] | None:
    """Serve until SIGTERM or SIGINT; None after a clean shutdown, else the exit status
    and why: 1 when it could not start, 4 when it stopped without its final checkpoint or
    with countersignatures it handed out missing from its log (`AttestRelay.close`).
    `on_ready` is called once the key and the log are open and connections are served
    (never when it could not start)."""

    async def main() -> tuple[int, str] | None:
        running = await _Running.start(settings, sock, context, listen or ListenSettings())
        if isinstance(running, str):
            sock.close()  # nothing serves on it
            return 1, running
        # What startup built (modules, the key, the open log) out of the collector's full
        # walks, as `owngate serve` does: each walked it all on the loop, between requests.
        settle_heap()
        if on_ready is not None:
            on_ready()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await running.stop()
        error = running.relay.shutdown_error
        return None if error is None else (4, error)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


class AttestThread:
    """The sidecar on its own event loop in a daemon thread, for the demo and tests:
    bound before `start()` returns (port 0 picks a free one)."""

    def __init__(
        self,
        settings: AttestSettings,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        listen: ListenSettings | None = None,
        tls_shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self._sock = bind_socket(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._settings = settings
        self._context = ssl_context
        self._listen = listen or ListenSettings()
        self._tls_shutdown_timeout_s = tls_shutdown_timeout_s
        self._loop = uvloop.new_event_loop()
        self._running: _Running | None = None
        self._started = threading.Event()
        self._failure: str | None = None
        self._stopped = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name=f"attest:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self._context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def listener(self) -> Listener:
        assert self._running is not None
        return self._running.listener

    @property
    def relay(self) -> AttestRelay:
        assert self._running is not None
        return self._running.relay

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        try:
            running = await _Running.start(
                self._settings,
                self._sock,
                self._context,
                self._listen,
                self._tls_shutdown_timeout_s,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            running = f"owngate attest: {exc!r}"
        if isinstance(running, str):
            self._failure = running
            self._started.set()
            return
        self._running = running
        self._started.set()
        await self._stopped.wait()
        await running.stop(drain_s=5.0)

    def start(self, timeout: float = 15.0) -> AttestThread:
        self._thread.start()
        if not self._started.wait(timeout) or self._failure is not None:
            self._sock.close()
            raise RuntimeError(self._failure or f"sidecar on port {self.port} did not start")
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> AttestThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
