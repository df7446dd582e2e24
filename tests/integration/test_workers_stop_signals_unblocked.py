"""Nothing a worker of `serve --workers N` starts keeps SIGTERM and SIGINT blocked.

A worker starts with them blocked (`gateway.workers._prepare_worker`) until its server
handles them, and only the main thread unblocks them then (`CleanExitServer`). A thread
started before that keeps them blocked for its life, and a process started before then,
or later by such a thread, inherits the mask across exec (`subprocess`'s
`restore_signals` resets SIGPIPE's and SIGXFSZ's dispositions, not the mask): it would
ignore the stop it is sent. Nothing does so today; this test is what keeps it so.

Each worker runs with an audit hook (its `sitecustomize`) that reports any process it
starts while the starting thread blocks SIGTERM; once both serve, every thread of each
worker, and every process below it, must have SIGTERM and SIGINT unblocked (SigBlk in
/proc), and the stop drains them as usual (exit 0)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from gateway.worker_identity import INDEX_ENV
from tests.helpers.processes import GatewayProcess, listening_sockets, owngate_argv, worker_pids
from tests.helpers.waiting import until

STOP_BITS = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))  # SigBlk's bits
HOOK = f"""
import os, signal, sys
_SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn",
           "os.system", "os.exec", "pty.spawn")
def _stop_blocked_spawn(event, args):
    if event in _SPAWNS and signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        os.write(2, ("hook: %s with SIGTERM blocked\\n" % event).encode())
if os.environ.get({INDEX_ENV!r}):
    sys.addaudithook(_stop_blocked_spawn)
"""


def _blocking_stop(pid: int, depth: int = 0) -> list[str]:
    """The threads of `pid` and of the processes below it (4 levels at most) whose
    signal mask blocks SIGTERM or SIGINT."""
    found = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        try:
            status = (task / "status").read_text()
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # a thread or process that ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["SigBlk"], 16) & STOP_BITS:
            found.append(f"pid {pid} thread {task.name} ({fields['Name'].strip()})")
        if depth < 4:
            for child in children:
                found += _blocking_stop(int(child), depth + 1)
    return found


def test_no_thread_or_process_of_a_worker_keeps_the_stop_signals_blocked(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gateway = process()  # its gateway.yaml (a simulator), run here with --workers 2
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH")) if p)
    stderr = tmp_path / "stderr.log"

    def said() -> str:
        return stderr.read_text(errors="replace")[-3000:]

    with stderr.open("wb") as err:
        supervisor = subprocess.Popen(
            owngate_argv("serve", "--config", gateway.path.name, "--workers", "2"),
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": path},
        )
    try:
        # Each worker listens once its server runs (after its lifespan startup).
        until(
            lambda: listening_sockets(gateway.port) == 2,
            "both workers serving",
            timeout=90,
            detail=said,
        )
        workers = worker_pids(supervisor.pid)
        assert len(workers) == 2, workers
        blocked = [line for pid in workers for line in _blocking_stop(pid)]
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=30)
    assert not blocked, blocked
    assert "hook:" not in said(), said()
    assert code == 0, said()
