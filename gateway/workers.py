"""`owngate serve --workers N`: N gateway processes on one host, sharing one port.

The supervisor (the process `serve --workers N` runs in) reserves the port with
SO_REUSEPORT, bound but never listening, so it takes no connection itself, and starts N
workers: each is `owngate serve` with the same config, `OWNGATE_WORKER_INDEX` (1..N) and
`OWNGATE_WORKER_RUNTIME_DIR` in its environment, and binds the same port with
SO_REUSEPORT; the kernel spreads new connections over the workers listening. The
supervisor

- restarts a worker that dies (after a backoff that grows while it keeps dying at once,
  waited out in its watch loop, so signals and the other workers are seen meanwhile;
  `_MAX_QUICK_DEATHS` deaths in a row right after starting stop everything with exit 1,
  as a config that cannot start would, unless another worker is up and serving: then the
  config was valid once and the running workers keep serving it, as a reload that fails
  keeps it, while the dead one is retried every 5 s);
- passes `--new-log-origin` to each worker's first start only (a restarted worker opens
  the log its first start began, never leaves it behind again);
- forwards SIGHUP (config and policy reload) to every worker;
- on SIGTERM or SIGINT forwards SIGTERM, waits for every worker to drain
  (`limits.drain_timeout_s`, plus a margin) and exits 0 when all of them exited 0 (a
  worker dead in its restart backoff has nothing to drain and is not counted, unless it
  died 5 times in a row right after starting: then 1; see `_prepare_worker`).

What differs in a worker (its config changed by `gateway.worker_identity.for_worker`):

- provenance: its own log in `<provenance.dir>/worker-<i>` with the origin
  `<provenance.origin>/worker-<i>`, signed with the configured key, and its own
  high-water file beside the configured directory (`<dir>.high-water-worker-<i>`, or
  `<high_water_file>-worker-<i>`); an auditor verifies each directory on its own
  (`owngate audit verify DIR/worker-<i> --key VKEY`);
- metrics: every worker publishes snapshots in the runtime dir and `/metrics` on any of
  them serves the sum over all (`gateway.api.fleet`);
- tenant limits with `state: memory` are split over the workers: worker i of N enforces
  its part (`TenantLimits.part`: limit / N, rounded down, one more for the first
  `limit % N`), so together they admit at most the limit; a limit smaller than N is
  refused at start (and by each worker at a reload); `state: redis` shares whole limits
  across workers, as across replicas. The supervisor says so at start, in a warning
  naming the tenants with limits (`start_warnings`), as it does when `admin.listen` is
  set: no worker opens it;
- a tenant's share of each private backend's pool (`limits.tenant_share_of_backend`) is
  split over the workers, whatever the state (pools are each worker's own): worker i
  holds a tenant to its part (`share_cap`), and a share smaller than N is refused at
  start (`config_share_unsplittable`) and by each worker at a reload;
- a worker started again after it died gets `OWNGATE_WORKER_RESTARTED=1`: with `state:
  memory` its part of each tenant limit starts spent (the dead one's ledger died with it).

A dead worker's metrics snapshot is removed before it restarts: a worker that stays
down must not leave its last in-flight counts and readiness in every scrape.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from gateway.api.recorder_log import NEW_LOG_ORIGIN_ENV
from gateway.config.schema import GatewaySettings
from gateway.logs import get_logger
from gateway.serving import STOP_SIGNALS, bind_socket
from gateway.state.memory import RESTARTED_ENV, WORKERS_ENV, unsplittable
from gateway.tenants import tenant_limits
from gateway.upstream.tenant_share import config_share_unsplittable
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV

__all__ = ["Supervisor", "start_warnings", "supervise"]

_QUICK_DEATH_S = 5.0  # a worker dead this soon after starting did not really start
_MAX_QUICK_DEATHS = 5
_STOP_MARGIN_S = 15.0  # past the drain deadline: the app's cut, the final checkpoint
_PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclasses.dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    quick_deaths: int = 0
    restart_at: float | None = None  # dead, to be started again then (its backoff)


class Supervisor:
    """Starts, watches and stops the workers (see the module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        host: str,
        port: int,
        drain_timeout_s: float,
        *,
        environ: Mapping[str, str] | None = None,
        first_start_flags: Sequence[str] = (),
        quick_death_s: float = _QUICK_DEATH_S,
        backoff_s: float = 0.2,
    ) -> None:
        self._argv = list(argv)  # `owngate serve ...` without --host/--port/--workers
        self.count = count
        self.host = host
        if port != 0:
            # SO_REUSEPORT lets any process of this user join the port, a gateway already
            # serving on it included (an old deployment left running, with its own older
            # config): the kernel would split the traffic between the two. A plain bind
            # fails while anything listens there; it must, before the port is shared.
            bind_socket(host, port, listen=False).close()
        self._reserved = bind_socket(host, port, reuse_port=True, listen=False)
        self.port: int = self._reserved.getsockname()[1]
        self._drain_timeout_s = drain_timeout_s
        self._quick_death_s = quick_death_s  # a worker dead this soon did not really start
        self._backoff_s = backoff_s  # the first wait before restarting one; doubles, to 5 s
        self._env = dict(os.environ if environ is None else environ)
        # Flags for a worker's first start only: `--new-log-origin` is a one-time act
        # (leave the recorded log behind); a restarted worker must not repeat it.
        self._first_start_flags = list(first_start_flags)
        self._env.pop(NEW_LOG_ORIGIN_ENV, None)  # the flag says it, at the first start only
        self._runtime = Path(tempfile.mkdtemp(prefix="owngate-workers-"))
        self._workers: dict[int, _Worker] = {}
        self._signals: list[int] = []
        self._log = get_logger("owngate.workers")

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT (then drain and stop); the exit code."""
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            self._log.info("starting workers", workers=self.count, port=self.port)
            for index in range(1, self.count + 1):
                self._workers[index] = self._start(index, first=True)
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._reserved.close()
            shutil.rmtree(self._runtime, ignore_errors=True)

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        self._signals.append(sig)  # handled by the loop, outside the signal handler

    def _start(self, index: int, quick_deaths: int = 0, *, first: bool = False) -> _Worker:
        env = dict(self._env)
        env[INDEX_ENV] = str(index)
        env[RUNTIME_ENV] = str(self._runtime)
        env[WORKERS_ENV] = str(self.count)  # shown by each worker's memory state
        if first:
            env.pop(RESTARTED_ENV, None)
        else:  # its memory state starts each tenant's part spent (the dead one's died)
            env[RESTARTED_ENV] = "1"
        argv = [*self._argv, "--host", self.host, "--port", str(self.port), "--workers", "1"]
        if first:
            argv += self._first_start_flags
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=_prepare_worker)
        return _Worker(index, proc, time.monotonic(), quick_deaths)

    def _watch(self) -> int:
        while True:
            while self._signals:
                sig = self._signals.pop(0)
                if sig == signal.SIGHUP:
                    self._forward(signal.SIGHUP)
                else:
                    return self._stop()
            now = time.monotonic()
            for index, worker in list(self._workers.items()):
                if worker.restart_at is not None:  # waiting out its backoff: signals and
                    if now >= worker.restart_at:  # the other workers are watched meanwhile
                        self._workers[index] = self._start(index, worker.quick_deaths)
                    continue
                code = worker.proc.poll()
                if code is None:
                    continue
                delay = self._died(worker, code)
                if delay is None:
                    self._stop()
                    return 1
                worker.restart_at = now + delay
                if delay == 0:
                    self._workers[index] = self._start(index, worker.quick_deaths)
            time.sleep(0.1)

    def _died(self, worker: _Worker, code: int) -> float | None:
        """The backoff before `worker`, dead with `code`, starts again (0: at once); None
        when it keeps dying at start and no other worker serves: stop everything. Before,
        the supervisor slept through the backoff (up to 5 s, each time a worker that
        cannot start was retried): no signal was handled and no other dead worker
        restarted meanwhile."""
        # Its snapshot (gateway.api.fleet) says what it held when it last wrote: requests
        # in flight that died with it, a log it may not open again. Every scrape would
        # add them for as long as it stays down.
        with contextlib.suppress(FileNotFoundError):
            (self._runtime / f"worker-{worker.index}.prom").unlink()
        lived = time.monotonic() - worker.started
        quick = worker.quick_deaths + 1 if lived < self._quick_death_s else 0
        if quick >= _MAX_QUICK_DEATHS:
            if not self._others_serving(worker.index):
                self._log.error(
                    "worker keeps dying at start; stopping", worker=worker.index, code=code
                )
                return None
            # gateway.yaml turned invalid after the others started (or the worker cannot
            # start for a reason of its own): stopping them would turn a config mistake,
            # which their reloads refuse, into an outage.
            self._log.error(
                "worker keeps dying at start; the others keep serving, retrying it",
                worker=worker.index,
                code=code,
            )
        self._log.warning("worker died; restarting it", worker=worker.index, code=code)
        worker.quick_deaths = quick
        return min(self._backoff_s * 2 ** min(quick, 10), 5.0) if quick else 0.0

    def _others_serving(self, index: int) -> bool:
        """Whether a worker other than `index` is alive and has outlived a quick death."""
        now = time.monotonic()
        return any(
            other.index != index
            and other.proc.poll() is None
            and now - other.started >= self._quick_death_s
            for other in self._workers.values()
        )

    def _forward(self, sig: int) -> None:
        for worker in self._workers.values():
            if worker.proc.poll() is None:
                worker.proc.send_signal(sig)

    def _stop(self) -> int:
        """SIGTERM every worker, wait for their drains; 0 if every one exited 0.

        A worker waiting out its restart backoff is dead already: it has nothing to
        drain, and its exit code is not this stop's (before, a SIGTERM or SIGINT that
        came during a backoff made the supervisor exit 1, as if a drain had failed);
        except that one that died `_MAX_QUICK_DEATHS` times in a row right after
        starting never served (its log may never have opened): exit 1 says so, as when
        the stop finds it starting (docs/deploy.md, "Exit codes"), not 0 by chance."""
        stopping = {i: w for i, w in self._workers.items() if w.restart_at is None}
        self._log.info("stopping workers", workers=len(stopping))
        self._forward(signal.SIGTERM)
        deadline = time.monotonic() + self._drain_timeout_s + _STOP_MARGIN_S
        codes: dict[int, int] = {
            index: worker.proc.returncode or 1
            for index, worker in self._workers.items()
            if worker.restart_at is not None and worker.quick_deaths >= _MAX_QUICK_DEATHS
        }
        for index, worker in stopping.items():
            try:
                codes[index] = worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                codes[index] = worker.proc.wait()
                self._log.error("worker did not stop in time; killed", worker=index)
        failed = {i: c for i, c in codes.items() if c != 0}
        if failed:
            self._log.error("workers exited with errors", codes=failed)
        return 1 if failed else 0


def _prepare_worker() -> None:
    """In a new worker, before it runs: SIGTERM it if the supervisor dies (Linux), so a
    killed supervisor never leaves workers holding the port; ignore SIGHUP until its
    app handles it (a signal's default action ends the process: a reload the supervisor
    forwards while a worker starts would kill it). The app's first look at the config
    file after start reloads it, so no reload asked for meanwhile is lost. And block
    SIGTERM and SIGINT until its server handles them (`CleanExitServer`: nothing may start
    before then): a stop while it starts drains it once it serves (before, it died -15)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # kept across exec, unlike a handler
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the mask is kept too
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(
    config_path: str,
    count: int,
    host: str,
    port: int,
    config: GatewaySettings,
    first_start_flags: Sequence[str] = (),
) -> int:
    """`serve --workers N` in the supervisor process; `first_start_flags` go to each
    worker's first start, not to a restart."""
    argv = [sys.executable, "-m", "gateway", "serve", "--config", config_path]
    log = get_logger("owngate.workers")
    if config.state.backend == "memory":  # each worker would refuse it: say so once
        split = unsplittable(((t.id, tenant_limits(t)) for t in config.tenants), count)
        for problem in split:
            print(f"error: {problem}", file=sys.stderr)
        if split:
            return 1
    # Each worker's pools hold a tenant to its part of its share, whatever the state
    for problem in config_share_unsplittable(config, count):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    for level, event, fields in start_warnings(config, count):
        getattr(log, level)(event, **fields)
    try:
        supervisor = Supervisor(
            argv,
            count,
            host,
            port,
            config.limits.drain_timeout_s,
            first_start_flags=first_start_flags,
        )
    except OSError as exc:
        print(f"error: cannot bind {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return supervisor.run()


def start_warnings(config: GatewaySettings, count: int) -> list[tuple[str, str, dict[str, object]]]:
    """What `serve --workers N` says at start, as (level, event, fields): that tenant
    limits are split over the workers with `state: memory` (each admits its part, so a
    client whose requests all reach one worker, on one kept-alive connection, gets that
    part), a warning naming the tenants with limits (ids are config, never input), or a
    note when none has any (a reload may add some: they are split too); and that the
    admin API `serve` would open (`admin.listen` with some admin access) is not."""
    said: list[tuple[str, str, dict[str, object]]] = []
    if count < 2:
        return said
    if config.state.backend == "memory":
        limited = [
            tenant.id
            for tenant in config.tenants
            if tenant.limits.requests_per_minute is not None
            or tenant.limits.tokens_per_minute is not None
            or tenant.limits.concurrent_requests is not None
        ]
        said.append(
            (
                "warning" if limited else "info",
                "tenant limits are split over the workers with state: memory; each worker "
                "admits its part (limit / workers), so a client reaching one worker gets "
                "that part (state: redis shares whole limits across workers)",
                {"workers": count, "tenants_with_limits": limited[:20], "more": len(limited[20:])},
            )
        )
    admin = config.admin
    if admin.listen is not None and (admin.tokens or admin.token_hashes or admin.allow_loopback):
        said.append(
            (
                "warning",
                "admin.listen is not opened under serve --workers (each worker holds its "
                "own state); run the admin API with one process",
                {"workers": count},
            )
        )
    return said
