"""The simulated backends of one routing-benchmark run, served in this process.

`SimHost` runs one `SimApp` per backend, each on its own port, all on one uvloop event
loop in one background thread (one thread, so simulators never wait on one another for
the GIL; the benchmark's main thread only waits on child processes meanwhile). A sampler
on the same loop reads every engine's running and waiting counts every `sample_s`, the
"requests queued" of the report, and the apps' counters are read once the run is over.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn
import uvloop

from gateway.serving import bind_socket, uvicorn_config
from gateway.sim import SimApp, SimSettings, create_sim_app

__all__ = ["Load", "SimHost"]


@dataclass(slots=True)
class Load:
    """Samples of one backend's engine: (monotonic time, running, waiting)."""

    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if start <= s[0] <= end]


class SimHost:
    """Simulators on real sockets, started and stopped together (a context manager)."""

    def __init__(
        self, backends: Sequence[tuple[str, SimSettings]], host: str, sample_s: float = 0.01
    ) -> None:
        self.apps: dict[str, SimApp] = {name: create_sim_app(s) for name, s in backends}
        self.loads: dict[str, Load] = {name: Load() for name in self.apps}
        self._sockets: dict[str, socket.socket] = {name: bind_socket(host, 0) for name in self.apps}
        self.ports: dict[str, int] = {n: s.getsockname()[1] for n, s in self._sockets.items()}
        self._sample_s = sample_s
        self._servers = [uvicorn.Server(uvicorn_config(app)) for app in self.apps.values()]
        self._thread = threading.Thread(target=self._run, name="sim-host", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread in start()
            self._error = exc

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        sampler = loop.create_task(self._sample())
        try:
            await asyncio.gather(
                *(
                    server.serve(sockets=[self._sockets[name]])
                    for name, server in zip(self.apps, self._servers, strict=True)
                )
            )
        finally:
            sampler.cancel()
            await asyncio.wait((sampler,))

    async def _sample(self) -> None:
        engines = [(self.loads[name].samples, app.engine) for name, app in self.apps.items()]
        while True:
            now = time.monotonic()
            for samples, engine in engines:
                samples.append((now, engine.running, engine.waiting))
            await asyncio.sleep(self._sample_s)

    def start(self, timeout: float = 15.0) -> SimHost:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not all(server.started for server in self._servers):
            if self._error is not None or not self._thread.is_alive():
                self._close_sockets()
                raise RuntimeError("the simulators failed to start") from self._error
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the simulators did not start in {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        for server in self._servers:
            server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            for server in self._servers:
                server.force_exit = True
            self._thread.join(timeout)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in self._sockets.values():
            sock.close()

    def counters(self) -> dict[str, dict[str, Any]]:
        """Per backend: requests started / completed / cancelled, prompt and cached tokens."""
        found: dict[str, dict[str, Any]] = {}
        for name, app in self.apps.items():
            stats, engine = app.stats, app.engine
            found[name] = {
                "started": stats.started,
                "completed": stats.completed,
                "cancelled": stats.cancelled,
                "prompt_tokens": engine.prompt_tokens_total,
                "generated_tokens": engine.generation_tokens_total,
                "prefix_cache_queries": engine.prefix_cache.queries,
                "prefix_cache_hits": engine.prefix_cache.hits,
            }
        return found

    def __enter__(self) -> SimHost:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
