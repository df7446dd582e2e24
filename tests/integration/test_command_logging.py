"""Every long-running `owngate` command configures its logging before it serves.

`owngate attest`, `witness serve` and `sim` never did (only `serve` and the demo), so their
processes ran structlog's default configuration, whose console renderer prints a
traceback with each exception's message and escapes nothing, and the stdlib's
last-resort handler, which does the same for uvicorn's lines: a relay fault in the
sidecar logged the whole relayed request. These tests run each command as its own
process, as an operator does (a test process that configured logging itself could not
see it: tests/unit/test_attest_failure_log.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import write_signing_key
from gateway.provenance.witness.state import WitnessState
from tests.helpers.net import free_port
from tests.helpers.processes import ServerProcess

CANARY = "CANARY-7f3a"

# The sidecar whose relay fails on every POST with a message quoting the request's body
# (a bug's message can), and answers GETs itself (its readiness probe needs no backend).
FAILING_SIDECAR = """
import sys

from gateway.attest.app import AttestRelay


async def relay(self, conn, request):
    if request.method == b"GET":
        conn.respond(200, b"{}", b"application/json")
        return
    raise ValueError(f"cannot relay {request.body!r}")


AttestRelay.__call__ = relay
from gateway.cli.main import main

sys.exit(main(sys.argv[1:]))
"""

# The command runs up to where it would serve; there it logs a failure whose message is
# the canary, through structlog and through the stdlib (as uvicorn does), and exits 0.
LOGS_INSTEAD_OF_SERVING = """
import logging
import sys

import uvicorn

import gateway.attest
from gateway.logs import get_logger

CANARY = {canary!r}


def logs_a_failure(*_args, **_kwargs):
    try:
        raise ValueError(f"cannot handle {{CANARY}}")
    except ValueError as exc:
        get_logger("owngate.test").error("failed", exc_info=exc)
        logging.getLogger("uvicorn.error").error("Exception in ASGI application", exc_info=exc)


gateway.attest.serve = logs_a_failure
uvicorn.Server.run = logs_a_failure
from gateway.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


def _log_lines(text: str) -> list[dict[str, object]]:
    """The JSON lines of a command's output (it prints a few plain lines of its own)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_relay_fault_in_the_sidecar_process_is_logged_without_the_request(
    tmp_path: Path,
) -> None:
    key = tmp_path / "backend.key"
    write_signing_key(key, "backend.test/attest")
    port = free_port()
    argv = [sys.executable, "-c", FAILING_SIDECAR, "attest", "--listen", f"127.0.0.1:{port}"]
    argv += ["--backend", "http://127.0.0.1:9", "--key", str(key), "--log", str(tmp_path / "log")]
    sidecar = ServerProcess("attest", argv, tmp_path, port).wait_ready("/health")
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": CANARY}]}
        answer = httpx.post(f"{sidecar.url}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"]["code"] == "internal_error"
    finally:
        sidecar.proc.send_signal(signal.SIGTERM)
        assert sidecar.proc.wait(timeout=30) == 0, sidecar.output()
    out = sidecar.log.read_text("utf-8")
    assert CANARY not in out, out[-1500:]
    [failed] = [line for line in _log_lines(out) if line["event"] == "relay failed"]
    assert failed["reason"] == "ValueError" and failed["level"] == "error"
    assert "in relay" in str(failed["exception"])  # where it happened, for the operator


def _witness_argv(tmp_path: Path) -> list[str]:
    witness_key, log_key = tmp_path / "witness.key", tmp_path / "log.key"
    write_signing_key(witness_key, "witness.test/w1")
    vkey = write_signing_key(log_key, "gateway.test/log")
    state = str(tmp_path / "state.json")
    WitnessState.open(Path(state), new=True).close()  # `owngate witness init`
    return ["witness", "serve", "--key", str(witness_key), "--log", vkey, "--state", state]


def _attest_argv(tmp_path: Path) -> list[str]:
    key = tmp_path / "backend.key"
    write_signing_key(key, "backend.test/attest")
    return [
        "attest",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--backend",
        "http://127.0.0.1:9",
        "--key",
        str(key),
        "--log",
        str(tmp_path / "log"),
    ]


def _sim_argv(_tmp_path: Path) -> list[str]:
    return ["sim", "--port", str(free_port())]


COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "attest": _attest_argv,
    "witness serve": _witness_argv,
    "sim": _sim_argv,
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_long_running_command_logs_failures_without_their_messages(
    tmp_path: Path, command: str, fmt: str
) -> None:
    script = LOGS_INSTEAD_OF_SERVING.format(canary=CANARY)
    flags = [] if fmt == "json" else ["--log-format", fmt]  # json: the default
    argv = [sys.executable, "-c", script, *COMMANDS[command](tmp_path), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
    out = done.stdout + done.stderr
    assert CANARY not in out, out[-1500:]
    assert "failed" in out and "Exception in ASGI application" in out
    if fmt == "json":
        events = {str(line["event"]) for line in _log_lines(out)}
        assert {"failed", "Exception in ASGI application"} <= events, out[-1500:]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_log_format_from_the_environment_is_a_usage_error(
    tmp_path: Path, command: str
) -> None:
    prefix = "OWNGATE_" + command.split()[0].upper() + "_"
    argv = [sys.executable, "-m", "gateway", *COMMANDS[command](tmp_path)]
    env = {**os.environ, prefix + "LOG_FORMAT": "yaml"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 2, done.stderr[-1500:]
    assert "--log-format" in done.stderr
