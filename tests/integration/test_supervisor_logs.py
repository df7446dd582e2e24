"""`serve --workers N` logs through the production JSON format: the supervisor's own lines
(exit codes keyed by worker index) are written, never raised on. Worker programs are
stand-ins (subprocesses: an integration test)."""

from __future__ import annotations

import io
import json
import logging
import signal
import sys
import threading
from pathlib import Path

import structlog

from gateway import access_log
from gateway.logs import configure_logging
from gateway.worker_identity import INDEX_ENV
from gateway.workers import Supervisor
from tests.helpers.waiting import until

# Each worker says it started, then serves until SIGTERM and exits 3 (a failed drain). Its
# handler comes before it says so: the test stops the workers once both have, and a SIGTERM
# between the two (a busy machine) ended a worker with the signal's status, not 3.
WORKER = f"""
import os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})  # as serve's server
with open(sys.argv[1], "a") as starts:
    starts.write(os.environ[{INDEX_ENV!r}] + "\\n")
signal.alarm(120)  # bounded: SIGALRM ends it if SIGTERM never comes
signal.pause()
"""


def test_workers_that_exit_with_errors_are_logged_in_json_and_the_exit_is_1(
    tmp_path: Path,
) -> None:
    starts = tmp_path / "starts"
    starts.touch()
    out = io.BytesIO()  # a stream with a binary buffer, as stderr is in production
    stream = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    configure_logging("json", "info", stream=stream)
    try:
        supervisor = Supervisor(
            [sys.executable, "-c", WORKER, str(starts)],
            2,
            "127.0.0.1",
            0,
            drain_timeout_s=5.0,
            quick_death_s=0.1,
            backoff_s=0.1,
        )

        def stop_once_both_started() -> None:
            try:
                until(lambda: len(starts.read_text().split()) >= 2, "workers started", timeout=60)
            finally:  # whatever happened, the supervisor stops
                supervisor._on_signal(signal.SIGTERM, None)

        watcher = threading.Thread(target=stop_once_both_started, daemon=True)
        watcher.start()
        code = supervisor.run()  # raised TypeError: orjson takes no int dict key
        watcher.join(timeout=5.0)
    finally:
        access_log.install(None)
        structlog.configure(**saved)
        logging.getLogger().handlers[:] = handlers
    assert sorted(starts.read_text().split()) == ["1", "2"]
    assert code == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    (failed,) = [line for line in lines if line["event"] == "workers exited with errors"]
    assert failed["codes"] == {"1": 3, "2": 3}
