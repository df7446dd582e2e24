"""Run an ASGI app on a real uvicorn server in a background thread.

Used by the demo (gateway + simulators in one process), the tests (real sockets, as
Starlette and httpx do) and the benchmarks. `ServerThread` binds before it returns, so
callers can read the chosen port when they asked for port 0.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Any

import uvicorn
import uvloop

__all__ = ["ServerThread", "bind_socket", "uvicorn_config"]


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket; port 0 picks a free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app: Any, **overrides: Any) -> uvicorn.Config:
    """The uvicorn settings owngate uses everywhere: httptools, uvloop, no access log."""
    options: dict[str, Any] = {
        "http": "httptools",
        "loop": "uvloop",
        "lifespan": "on",
        "access_log": False,
        "log_config": None,
        "server_header": False,
        "date_header": False,
        "backlog": 2048,
        "timeout_keep_alive": 30,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


class ServerThread:
    """A uvicorn server on its own event loop in a daemon thread.

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
        return f"http://{host}:{self.port}"

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
