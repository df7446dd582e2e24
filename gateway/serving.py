"""Run an ASGI app on a real uvicorn server in a background thread.

Used by the demo (gateway + simulators in one process), the tests (real sockets, as
Starlette and httpx do) and the benchmarks. `ServerThread` binds before it returns, so
callers can read the chosen port when they asked for port 0. `DrainingServer` is the
server of `owngate serve`: uvicorn's graceful shutdown, with the app told when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

import uvicorn
import uvloop
from uvicorn.config import STARTUP_FAILURE
from uvicorn.server import logger

from gateway.body_writer import drop
from gateway.config.schema import ListenSettings
from gateway.header_check import install as install_header_check
from gateway.listener import http_protocol

__all__ = [
    "STARTUP_FAILURE",
    "STOP_SIGNALS",
    "BesideServer",
    "CleanExitServer",
    "DrainingServer",
    "ServerThread",
    "bind_socket",
    "run_beside",
    "settle_heap",
    "uvicorn_config",
]

_FORCED_END_S = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a server's drain, its handler's once it runs


def settle_heap() -> None:
    """Before `owngate serve` takes traffic: collect once, then move what the process
    built so far (modules, config, policies, the app: ~58,000 tracked objects) out of the
    cyclic collector's reach (`gc.freeze`).

    With them in the oldest generation, each full collection (every ~3,500 requests of
    the production configuration at c=16) walked them all: ~30 ms on the event loop,
    stalling every request in flight, and about half of what the collector cost per
    request (docs/performance.md, branch perf16b). The collector's thresholds are left
    as CPython sets them: a young collection every ~700 allocations is what bounds the
    memory held by reference cycles a request may leave (an exception kept by the frames
    it was raised through holds them, and they the body: the outcomes
    tests/integration/test_request_cycles.py covers leave none), and a higher one
    multiplied it. Only what exists
    now is frozen: a reference cycle among it that a config reload later drops is never
    collected, a one-time cost of at most the startup assembly (what reloads build is
    not frozen, and is collected as before)."""
    gc.collect()
    gc.freeze()


def bind_socket(
    host: str, port: int, *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    """Bind a listening TCP socket; port 0 picks a free port.

    `reuse_port` sets SO_REUSEPORT: several processes bind the same port and the kernel
    spreads new connections over those listening (`serve --workers`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()  # the caller gets the error, never a half-made socket to leak
        raise
    sock.set_inheritable(True)
    return sock


class CleanExitServer(uvicorn.Server):
    """uvicorn's server, for which a shutdown a signal asked for is the normal end: the
    SIGINT or SIGTERM it handled is not raised again afterwards. uvicorn re-raises it,
    which ends the process with -15 on SIGTERM before the code after `run` (the demo's
    sidecars signing their final checkpoints) runs, and on SIGINT lets asyncio cancel a
    server running beside this one (`run_beside`) in the middle of its shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        # A worker of `serve --workers` starts with them blocked (`gateway.workers`): one
        # sent while it started is pending, and taken now by the handler, not the default.
        # Only this thread's mask changes: a thread started before now keeps them blocked,
        # and so does a process started before now or by such a thread (across exec;
        # `subprocess`'s `restore_signals` resets dispositions, not the mask), which would
        # ignore a stop. None is (tests/integration/test_workers_stop_signals_unblocked.py).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class DrainingServer(CleanExitServer):
    """uvicorn's server with owngate's shutdown.

    On SIGTERM or SIGINT uvicorn stops listening, closes idle keep-alive connections,
    lets busy ones finish their response (then closes them), waits for them up to
    `timeout_graceful_shutdown` and runs the lifespan shutdown. This class adds three
    things: the requests still running when that wait ends are cut as the app cuts them
    (`cancel`) and waited for before the lifespan shutdown (`_end_now`); `on_drain`
    runs when that shutdown begins (the app turns not-ready and
    starts its own deadline, which it keeps shorter than uvicorn's so it can end streams
    cleanly), and, from `CleanExitServer`, a shutdown a signal asked for is the normal
    end (exit 0, not -15).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_drain: Callable[[], None],
        drained: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._drained = drained
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first SIGTERM/SIGINT drains before uvicorn's shutdown begins: listening
        stops, the app turns not-ready, and only once its requests are done (or cut at
        its deadline) does uvicorn close the then idle connections and run the lifespan
        shutdown. Leaving open streams to uvicorn's own shutdown raced with it closing
        their connections. A second signal is uvicorn's: shut down now."""
        if self._drained is None or self._loop is None or self._draining is not None:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            for server in self.servers:
                server.close()  # refuse new connections from now on
            self._on_drain()
            if self._drained is not None:
                await self._drained()
        finally:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (`uvicorn.Server.shutdown`, as of uvicorn 0.54), but the
        requests its graceful timeout (or a forced exit) leaves running are ended as
        `_end_now` ends them, before the lifespan shutdown. uvicorn cancelled them the
        plain way (a tenant's charge in flight cut inside, and lost) and ran the lifespan
        shutdown at once, closing the provenance log before their cut answers and
        completion records were made."""
        self._on_drain()
        logger.info("Shutting down")
        for server in self.servers:
            server.close()  # stop accepting new connections
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        await asyncio.sleep(0.1)
        try:
            await asyncio.wait_for(
                self._wait_tasks_to_complete(), timeout=self.config.timeout_graceful_shutdown
            )
        except TimeoutError:
            logger.error(
                "Cancel %s running task(s), timeout graceful shutdown exceeded",
                len(self.server_state.tasks),
            )
        await self._end_now()

    async def _end_now(self) -> None:
        """Run once uvicorn's shutdown stops waiting for the requests (`shutdown`): its
        graceful timeout passed, or it was forced. uvicorn's forced shutdown (SIGINT once
        its shutdown began) waited neither for the requests still running nor for the
        lifespan shutdown: the end of the event loop
        then cancelled the requests with the provenance log already closed (their
        completion records lost, some answered with uvicorn's plain 500), no final
        checkpoint was signed, and the process exited 0 all the same. Here the requests
        are cancelled at once (the app answers each with the 503 its record says, without
        waiting for a receipt), given `_FORCED_END_S` to end (then their connections are
        dropped, which ends a send waiting on a client that reads nothing, and they get
        `_FORCED_END_S` more, recorded as cut, 503), and the lifespan shutdown runs: their
        records are written and the final checkpoint signed (exit 4 if not).
        A request making its tenant's charge is cancelled once it is made (`cancel`), as
        at the app's own drain deadline: cut inside it, the charge was lost (a Redis
        call never sent; `Admission.release` runs once)."""
        # Here, not at the top: the module serves the simulators and test servers too,
        # which need none of the app; by now the app has long imported it.
        from gateway.api.exchange import cancel

        running = [task for task in self.server_state.tasks if not task.done()]
        for task in running:
            cancel(task)
        if running:
            await asyncio.wait(running, timeout=_FORCED_END_S)
        # A connection still open holds what its client has not read (an answer's tail, a
        # cut's 503 whose send waits for room): dropped now, the sends waiting on it
        # return, so the requests still running end and write their completion records
        # before the log closes, and the loop's end no longer waits on the client. Their
        # records say the gateway's cut (503), not a client that left (499).
        for connection in list(self.server_state.connections):
            drop(connection)
        left = [task for task in running if not task.done()]
        if left:
            await asyncio.wait(left, timeout=_FORCED_END_S)
        await self.lifespan.shutdown()


class BesideServer(uvicorn.Server):
    """A second server on the main server's event loop (the admin API beside the public
    listener, `run_beside`): the signals stay the main server's, which ends it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_beside(
    server: uvicorn.Server,
    sockets: list[socket.socket],
    beside: BesideServer | None = None,
    beside_sockets: list[socket.socket] | None = None,
) -> None:
    """Run `server` on `sockets` (as `server.run` does) with `beside` on the same event
    loop, in this process; `beside` stops once `server` has."""
    if beside is None:
        server.run(sockets=sockets)
        return

    async def both() -> None:
        task = asyncio.create_task(beside.serve(sockets=beside_sockets))
        try:
            await server.serve(sockets=sockets)
        finally:
            beside.should_exit = True
            await task

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())


def uvicorn_config(
    app: Any, listen: ListenSettings | None = None, **overrides: Any
) -> uvicorn.Config:
    """The uvicorn settings owngate uses everywhere: httptools with the connection limits
    of `listen` (`gateway.listener`; defaults when None), uvloop, no websockets, no
    access log, header values checked in one pass (`gateway.header_check`), and no proxy
    headers: the client is the socket's peer, never what an
    `X-Forwarded-For` says (uvicorn would believe it from any peer under
    `FORWARDED_ALLOW_IPS=*`, making a remote client a loopback one to
    `admin.allow_loopback`)."""
    limits = listen if listen is not None else ListenSettings()
    install_header_check()  # header values checked in one pass (gateway/header_check.py)
    options: dict[str, Any] = {
        "http": http_protocol(limits),
        "ws": "none",
        "loop": "uvloop",
        "lifespan": "on",
        "access_log": False,
        "log_config": None,
        "server_header": False,
        "proxy_headers": False,
        "date_header": False,
        "backlog": 2048,
        "timeout_keep_alive": limits.keepalive_timeout_s,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


class ServerThread:
    """A uvicorn server on its own event loop in a daemon thread; `config` goes to
    `uvicorn_config` (`listen=` sets the connection limits).

    >>> with ServerThread(app) as server:   # doctest: +SKIP
    ...     httpx.get(f"{server.url}/healthz")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self._sock = bind_socket(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn_config(app, **config))
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._server.config.is_ssl else "http"
        return f"{scheme}://{host}:{self.port}"

    def _run(self) -> None:
        try:
            # The same event loop as production (uvloop), so tests exercise what runs there.
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread in start()
            self._error = exc

    def start(self, timeout: float = 15.0) -> ServerThread:
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not self._server.started:
            if self._error is not None or not self._thread.is_alive():
                self._sock.close()
                raise RuntimeError(f"server on port {self.port} failed to start") from self._error
            if waited >= timeout:
                self.stop()
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            deadline.wait(0.01)
            waited += 0.01
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
