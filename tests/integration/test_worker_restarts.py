"""`serve --workers N` when the workers disagree on the config. The supervisor, with
stand-in worker programs: a worker that can no longer start (gateway.yaml turned invalid
after the others started: their reloads refuse it and they keep serving) must not stop
the workers that serve. The merged metrics show workers enforcing different policy sets,
and a worker whose provenance log cannot be written; a dead worker's snapshot leaves them."""

from __future__ import annotations

import argparse
import ast
import io
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from gateway import access_log
from gateway.api.fleet import merge_expositions
from gateway.api.recorder_log import NEW_LOG_ORIGIN_ENV
from gateway.logs import configure_logging
from gateway.serving import bind_socket
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV
from gateway.workers import Supervisor
from tests.helpers.waiting import until

# Worker 1 serves until SIGTERM; worker 2 dies at once, as `serve` does on an invalid file.
WORKER = f"""
import os, signal, sys, time
index = os.environ[{INDEX_ENV!r}]
with open(sys.argv[1], "a") as starts:
    starts.write(index + "\\n")
if index == "2":
    sys.exit(2)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})  # as serve's server
for _ in range(1200):  # bounded: 120 s
    time.sleep(0.1)
sys.exit(1)
"""


def test_a_worker_that_cannot_start_does_not_stop_the_others(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    starts.touch()
    supervisor = Supervisor(
        [sys.executable, "-c", WORKER, str(starts)],
        2,
        "127.0.0.1",
        0,
        drain_timeout_s=5.0,
        quick_death_s=1.0,
        backoff_s=0.1,  # the fifth quick death of worker 2 comes 3 s after worker 1 started
    )
    enough = threading.Event()

    def watch() -> None:  # stop once worker 2 was started past the 5 quick deaths allowed
        for _ in range(600):  # bounded: 60 s
            if starts.read_text().split().count("2") >= 6 or enough.is_set():
                break
            enough.wait(0.1)
        supervisor._on_signal(signal.SIGTERM, None)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = supervisor.run()
    enough.set()
    watcher.join(timeout=5.0)
    started = starts.read_text().split()
    assert started.count("2") >= 6, f"the supervisor gave up: exit {code}, starts {started}"
    assert started.count("1") == 1  # never stopped nor restarted
    # Worker 2 died 5 times in a row right after starting: exit 1, whether the SIGTERM
    # found it starting (it then exits 2) or waiting out its backoff.
    assert code == 1


def test_workers_that_all_keep_dying_at_start_stop_the_supervisor(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    starts.touch()
    always_dies = WORKER.replace('if index == "2":', "if True:")
    supervisor = Supervisor(
        [sys.executable, "-c", always_dies, str(starts)],
        2,
        "127.0.0.1",
        0,
        drain_timeout_s=5.0,
        quick_death_s=5.0,  # every death is quick, however slow the machine
        backoff_s=0.05,
    )
    stopped = threading.Event()

    def bound() -> None:  # never hang the suite: stop it after 60 s whatever happens
        if not stopped.wait(60.0):
            supervisor._on_signal(signal.SIGTERM, None)

    threading.Thread(target=bound, daemon=True).start()
    code = supervisor.run()
    stopped.set()
    assert code == 1
    assert len(starts.read_text().split()) <= 10  # it gave up; it was not stopped at 60 s


def test_a_restarted_worker_is_not_told_again_to_start_a_new_log(tmp_path: Path) -> None:
    """`serve --workers N --new-log-origin` (or OWNGATE_NEW_LOG_ORIGIN=1) leaves the
    recorded log behind once: each worker's first start. Before, every worker restarted
    for the supervisor's whole life got the flag too, and could leave behind the log its
    own first start began."""
    seen = tmp_path / "seen"
    seen.touch()
    program = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # before it says it started\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # as serve's server\n"
        "with open(sys.argv[1], 'a') as seen:\n"
        f"    seen.write(repr((sys.argv[2:], os.environ.get({NEW_LOG_ORIGIN_ENV!r}))) + '\\n')\n"
        "if len(open(sys.argv[1]).read().splitlines()) == 1:\n"
        "    sys.exit(3)  # the first start dies (as a worker the log refused would)\n"
        "signal.alarm(60)  # bounded: SIGALRM ends it if no SIGTERM comes\n"
        "signal.pause()\n"
    )
    supervisor = Supervisor(
        [sys.executable, "-c", program, str(seen)],
        1,
        "127.0.0.1",
        0,
        5.0,
        environ={**os.environ, NEW_LOG_ORIGIN_ENV: "1"},
        first_start_flags=["--new-log-origin"],
        backoff_s=0.05,
    )
    done = threading.Event()

    def stop_once_restarted() -> None:
        for _ in range(300):  # bounded: 30 s
            if len(seen.read_text().splitlines()) >= 2 or done.is_set():
                break
            done.wait(0.1)
        supervisor._on_signal(signal.SIGTERM, None)

    threading.Thread(target=stop_once_restarted, daemon=True).start()
    code = supervisor.run()
    done.set()
    starts = [ast.literal_eval(line) for line in seen.read_text().splitlines()]
    assert len(starts) == 2, starts
    (first, first_env), (again, again_env) = starts
    assert "--new-log-origin" in first
    assert "--new-log-origin" not in again
    assert first_env is None and again_env is None  # the variable says it no more
    assert code == 0


def test_workers_enforcing_different_policy_sets_show_in_the_merged_metrics() -> None:
    """A worker whose policy reload failed keeps its set: `/metrics` on any worker shows
    one `owngate_policy_info` series per set, so an alert can see the workers disagree."""
    one = (
        "# TYPE owngate_policy_info gauge\n"
        'owngate_policy_info{id="p",version="2",digest="sha256:bb"} 1\n'
    )
    two = one.replace('version="2",digest="sha256:bb"', 'version="1",digest="sha256:aa"')
    merged = [
        (s.labels["version"], s.value)
        for f in text_string_to_metric_families(merge_expositions([one, two, one]).decode())
        for s in f.samples
    ]
    assert sorted(merged) == [("1", 1.0), ("2", 1.0)]


def test_a_worker_whose_log_cannot_be_written_shows_whichever_worker_is_scraped() -> None:
    """Each worker writes its own provenance log: one that cannot refuses its share of
    the requests, so the merged `owngate_provenance_ready` is 0 on every worker's
    `/metrics`, not only on that worker's (it was the scraped worker's own reading)."""
    ready = "# TYPE owngate_provenance_ready gauge\nowngate_provenance_ready 1.0\n"
    failing = ready.replace(" 1.0", " 0.0")
    for texts in ([ready, failing, ready], [failing, ready], [ready, ready, failing]):
        (family,) = text_string_to_metric_families(merge_expositions(texts).decode())
        assert [sample.value for sample in family.samples] == [0.0]
    (family,) = text_string_to_metric_families(merge_expositions([ready, ready]).decode())
    assert [sample.value for sample in family.samples] == [1.0]


def test_workers_never_join_a_port_another_gateway_serves() -> None:
    """SO_REUSEPORT would let a second `serve --workers` (a new deployment started while
    the old one still runs, with its older policy) join the port: the kernel would split
    the clients between the two configs. It must fail as a plain bind does."""
    serving = bind_socket("127.0.0.1", 0, reuse_port=True)  # the other gateway's worker
    port = serving.getsockname()[1]
    try:
        with pytest.raises(OSError, match="in use"):
            Supervisor([sys.executable, "-c", "pass"], 2, "127.0.0.1", port, 5.0)
    finally:
        serving.close()


def test_a_worker_ignores_sighup_until_its_app_handles_it(tmp_path: Path) -> None:
    """SIGHUP's default action ends a process: the supervisor forwards every reload to
    the workers, and one still starting (imports, the log, the first backend probe) was
    killed by it, a restart that counts as a quick death. It must be ignored until the
    app's own handler replaces the disposition."""
    seen = tmp_path / "seen"
    program = (
        "import signal, sys, time\n"
        "ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # before it says it started\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # as serve's server\n"
        "open(sys.argv[1], 'w').write(str(ignored))\n"
        "for _ in range(600):\n"
        "    time.sleep(0.1)\n"
    )
    supervisor = Supervisor([sys.executable, "-c", program, str(seen)], 1, "127.0.0.1", 0, 5.0)

    def stop_once_seen() -> None:
        for _ in range(300):  # bounded: 30 s
            if seen.exists() and seen.read_text():
                break
            threading.Event().wait(0.1)
        supervisor._on_signal(signal.SIGTERM, None)

    threading.Thread(target=stop_once_seen, daemon=True).start()
    assert supervisor.run() == 0
    assert seen.read_text() == "True"


def test_serve_ignores_sighup_before_it_loads_the_config(tmp_path: Path) -> None:
    """A single `owngate serve` too: a reload asked for while it starts must not end it."""
    from gateway.cli import serve

    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        args = argparse.Namespace(
            config=str(tmp_path / "missing.yaml"), workers=1, host=None, port=-1
        )
        assert serve.run(args) == serve.EXIT_NOT_STARTED  # stops at the config
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_dead_workers_snapshot_leaves_the_merged_metrics(tmp_path: Path) -> None:
    """Worker 2 publishes a snapshot (3 requests in flight, its log ready), dies, and
    then cannot start again. Before, its last snapshot stayed in the runtime directory and
    every scrape of worker 1 added its 3 requests in flight, for as long as it was down."""
    starts = tmp_path / "starts"
    starts.touch()
    program = (
        "import os, pathlib, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # as serve's server\n"
        f"index = os.environ[{INDEX_ENV!r}]\n"
        "with open(sys.argv[1], 'a') as starts:\n"
        "    starts.write(index + '\\n')\n"
        "if index == '2':\n"
        "    if open(sys.argv[1]).read().split().count('2') == 1:\n"
        f"        runtime = pathlib.Path(os.environ[{RUNTIME_ENV!r}])\n"
        "        (runtime / 'worker-2.prom').write_text(sys.argv[2])\n"
        "    sys.exit(3)  # it dies; then it cannot start again (its log refuses it, say)\n"
        "signal.alarm(60)  # bounded: SIGALRM ends it if no SIGTERM comes\n"
        "signal.pause()\n"
    )
    snapshot = (
        "# TYPE owngate_backend_inflight gauge\n"
        'owngate_backend_inflight{backend="gpu"} 3\n'
        "# TYPE owngate_provenance_ready gauge\n"
        "owngate_provenance_ready 1\n"
    )
    supervisor = Supervisor(
        [sys.executable, "-c", program, str(starts), snapshot],
        2,
        "127.0.0.1",
        0,
        drain_timeout_s=5.0,
        backoff_s=0.05,
    )
    merged: list[list[str]] = []
    done = threading.Event()

    def look_once_restarted() -> None:  # what a scrape of worker 1 would merge
        for _ in range(300):  # bounded: 30 s
            if starts.read_text().split().count("2") >= 2 or done.is_set():
                break
            done.wait(0.1)
        merged.append(sorted(p.name for p in supervisor._runtime.glob("worker-*.prom")))
        supervisor._on_signal(signal.SIGTERM, None)

    threading.Thread(target=look_once_restarted, daemon=True).start()
    supervisor.run()
    done.set()
    assert starts.read_text().split().count("2") >= 2
    assert merged == [[]]  # worker 1 wrote none; worker 2's last one is gone


def test_signals_are_handled_while_a_dead_worker_waits_out_its_backoff(tmp_path: Path) -> None:
    """Worker 2 keeps dying at start; worker 1 serves. A SIGHUP (a reload) the supervisor
    gets while worker 2 waits out its backoff (5 s here) reaches worker 1 at once. Before,
    the supervisor slept through each backoff: the reload waited for worker 2's next start,
    and so would a SIGTERM or the restart of worker 1 had it died meanwhile."""
    seen = tmp_path / "seen"
    seen.touch()
    program = (
        "import os, signal, sys\n"
        f"index = os.environ[{INDEX_ENV!r}]\n"
        "def say(what):\n"
        "    with open(sys.argv[1], 'a') as seen:\n"
        "        seen.write(what + '\\n')\n"
        "if index == '2':\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # as serve's server\n"
        "signal.signal(signal.SIGHUP, lambda *_: say('hup'))\n"
        "say('1')\n"
        "signal.alarm(60)  # bounded: SIGALRM ends it if no SIGTERM comes\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    out = io.BytesIO()
    stream = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    configure_logging("json", "info", stream=stream)
    dead: list[object] = []
    reloaded: list[object] = []
    try:
        supervisor = Supervisor(
            [sys.executable, "-c", program, str(seen)],
            2,
            "127.0.0.1",
            0,
            drain_timeout_s=5.0,
            quick_death_s=60.0,  # every death of worker 2 is quick
            backoff_s=2.5,  # its first backoff: 5 s
        )

        def reload_during_the_backoff() -> None:
            try:
                until(lambda: "1" in seen.read_text().split(), "worker 1 serving", timeout=30)
                until(lambda: b"worker died" in out.getvalue(), "worker 2 dead", timeout=30)
                dead.append(supervisor._workers[2])  # the one that died, until restarted
                supervisor._on_signal(signal.SIGHUP, None)
                until(lambda: "hup" in seen.read_text().split(), "worker 1 reloading", timeout=30)
                reloaded.append(supervisor._workers[2])
            finally:
                supervisor._on_signal(signal.SIGTERM, None)

        watcher = threading.Thread(target=reload_during_the_backoff, daemon=True)
        watcher.start()
        supervisor.run()
        watcher.join(timeout=5.0)
    finally:
        access_log.install(None)
        structlog.configure(**saved)
        logging.getLogger().handlers[:] = handlers
    assert len(dead) == 1 and len(reloaded) == 1
    assert reloaded[0] is dead[0]  # worker 1 reloaded before worker 2 was started again


# A supervisor in its own process (signals reach it as they reach `serve --workers 2`):
# worker 1 serves until SIGTERM and notes each SIGHUP; worker 2 dies at every start, so it
# spends 5 s in its first backoff (backoff_s 2.5, doubled) before it is started again.
SUPERVISOR_OF_ONE_DYING = """
import sys
from gateway.workers import Supervisor
worker = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
supervisor = Supervisor(worker, 2, "127.0.0.1", 0, 5.0, quick_death_s=60.0, backoff_s=2.5)
sys.exit(supervisor.run())
"""
ONE_SERVES_ONE_DIES = (
    "import os, signal, sys\n"
    f"index = os.environ[{INDEX_ENV!r}]\n"
    "def say(what):\n"
    "    with open(sys.argv[1], 'a') as seen:\n"
    "        seen.write(what + '\\n')\n"
    "if index == '2':\n"
    "    say('2')\n"
    "    sys.exit(3)\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # as serve's server\n"
    "signal.signal(signal.SIGHUP, lambda *_: say('hup'))\n"
    "say('1')\n"
    "signal.alarm(60)  # bounded: SIGALRM ends it if no SIGTERM comes\n"
    "while True:\n"
    "    signal.pause()\n"
)


@pytest.mark.parametrize(
    "signals",
    [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGHUP, signal.SIGTERM)],
    ids=["sigterm", "sigint", "sighup-then-sigterm"],
)
def test_a_stop_asked_while_a_worker_waits_out_its_backoff_is_a_clean_exit(
    tmp_path: Path, signals: tuple[signal.Signals, ...]
) -> None:
    """A signal reaching the supervisor while a dead worker waits out its restart backoff:
    SIGTERM and SIGINT stop it with exit 0, as at any other time (the worker in backoff
    has nothing to drain; its death was said when it happened), and a SIGHUP reloads the
    living workers and leaves the supervisor running. Before, the stop waited on the dead
    worker too, found its exit code 3 and exited 1, as if the drain had failed."""
    seen = tmp_path / "seen"
    seen.touch()
    out = tmp_path / "out"
    with out.open("wb") as sink:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR_OF_ONE_DYING, ONE_SERVES_ONE_DIES, str(seen)],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        until(lambda: "1" in seen.read_text().split(), "worker 1 serving", timeout=30)
        until(lambda: b"worker died" in out.read_bytes(), "worker 2 dead", timeout=30)
        for sig in signals:
            supervisor.send_signal(sig)
            if sig == signal.SIGHUP:
                until(lambda: "hup" in seen.read_text().split(), "worker 1 reloaded", timeout=30)
                assert supervisor.poll() is None  # a reload, not a stop
        code = supervisor.wait(timeout=60)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert seen.read_text().split().count("2") == 1  # it came within worker 2's backoff
    assert code == 0, out.read_text(errors="replace")


# As above, with a short backoff: worker 2 dies at every start, five quick deaths in a
# row within seconds; the backoff after the fifth is 5 s (0.2 s doubled, capped).
SUPERVISOR_OF_ONE_THAT_KEEPS_DYING = """
import sys
from gateway.workers import Supervisor
worker = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
supervisor = Supervisor(worker, 2, "127.0.0.1", 0, 5.0, quick_death_s=1.0, backoff_s=0.2)
sys.exit(supervisor.run())
"""


def test_a_stop_while_a_worker_that_keeps_dying_at_start_waits_out_its_backoff_exits_1(
    tmp_path: Path,
) -> None:
    """Exit 1 means, with --workers N, also a worker that died 5 times in a row right
    after starting (docs/deploy.md, `owngate serve --help`): one that never served and
    whose log may never have been opened. A SIGTERM that found such a worker waiting out
    its backoff exited 0 ("stopped after draining; the final checkpoint is signed"), and
    1 only when it found it starting: the exit code hid it by chance. A worker in an
    earlier backoff (fewer deaths) still has nothing to drain and is not counted."""
    seen = tmp_path / "seen"
    seen.touch()
    out = tmp_path / "out"
    with out.open("wb") as sink:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SUPERVISOR_OF_ONE_THAT_KEEPS_DYING,
                ONE_SERVES_ONE_DIES,
                str(seen),
            ],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        until(lambda: "1" in seen.read_text().split(), "worker 1 serving", timeout=30)
        until(lambda: b"others keep serving" in out.read_bytes(), "worker 2 kept dying", timeout=60)
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=60)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert seen.read_text().split().count("2") >= 5
    assert code == 1, out.read_text(errors="replace")
