"""A stop (SIGTERM to `serve --workers N`) that comes while the workers still start: the
supervisor forwards it, each worker takes it once its server handles signals (it starts
with SIGTERM and SIGINT blocked, `gateway.workers._prepare_worker`), drains at once and
exits 0, and its provenance log verifies, closed with a signed final checkpoint.

Before, a worker still importing or building its app died of the signal's default action
(-15) and the supervisor exited 1, "workers exited with errors": the flake of
test_key_rotation_workers.py, whose stop could come before its second worker served.

The hook (each worker's `sitecustomize`) says the worker started, then holds it there
until the SIGTERM the supervisor forwards is pending: the stop comes at that moment,
every time, without a sleep."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from gateway.provenance import load_verifiers, verify_log, write_signing_key
from gateway.worker_identity import INDEX_ENV
from tests.helpers.processes import GatewayProcess, owngate_argv
from tests.helpers.waiting import until

ORIGIN = "test.owngate/stopped-while-starting"
HOOK = f"""
import os, signal, sys, time
if os.environ.get({INDEX_ENV!r}):
    print("hook: worker started", file=sys.stderr, flush=True)
    give_up = time.monotonic() + 60  # bounded: the test fails on the missing line
    while signal.SIGTERM not in signal.sigpending() and time.monotonic() < give_up:
        time.sleep(0.01)
    if signal.SIGTERM in signal.sigpending():
        print("hook: stop pending", file=sys.stderr, flush=True)
"""


def test_workers_stopped_while_starting_exit_0_with_their_logs_signed(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    single = process(provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"})
    assert single.path == tmp_path / "gateway.yaml"  # the fixture's config (a simulator)
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH")) if p)
    stderr = tmp_path / "stderr.log"

    def said() -> str:
        return stderr.read_text(errors="replace")

    with stderr.open("wb") as err:
        supervisor = subprocess.Popen(
            owngate_argv("serve", "--config", "gateway.yaml", "--workers", "2"),
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": path},
        )
    try:
        until(lambda: said().count("hook: worker started") == 2, "both workers started", timeout=60)
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=30)
    assert code == 0, said()[-3000:]
    assert said().count("hook: stop pending") == 2, said()[-3000:]  # the stop came then
    assert "workers exited with errors" not in said()
    keys = load_verifiers([vkey])
    for worker in (1, 2):
        summary = verify_log(tmp_path / "log" / f"worker-{worker}", keys)
        assert summary.origin == f"{ORIGIN}/worker-{worker}"
        assert summary.signed_by and summary.unsigned_entries == 0, summary
