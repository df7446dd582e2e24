"""`owngate attest` as a process: its exit status 4 when countersignatures it handed out
never reached its log (tested in-process with `relay.shutdown_error` in
test_attest_log_outage.py). The disk fails as it does for root too: the process's file
size limit (RLIMIT_FSIZE) is lowered to 0 once it serves, so every write to a regular file
fails (EFBIG; Python ignores SIGXFSZ), where a chmod would not stop root and no full
tmpfs is at hand. Its output goes to /dev/null and a pipe, which the limit does not
cover.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import write_signing_key
from tests.helpers.gateways import Sim
from tests.helpers.net import free_port
from tests.helpers.processes import owngate_argv
from tests.helpers.provenance import records
from tests.helpers.waiting import until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _health(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    return False


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="prlimit is Linux's")
def test_owngate_attest_exits_4_when_a_countersignature_it_handed_out_is_not_in_its_log(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "gpu.key", "gpu")
    url = f"http://127.0.0.1:{free_port()}"
    argv = owngate_argv("attest", "--listen", url.removeprefix("http://"), "--backend", sim.url)
    argv += ["--key", str(tmp_path / "gpu.key"), "--log", str(tmp_path / "log")]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        until(lambda: process.poll() is not None or _health(url), "the sidecar serving")
        assert process.poll() is None
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (0, 0))  # its disk: full
        answer = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30)
        # handed out before the write was tried: the answer does not wait for the log
        assert answer.status_code == 200 and "x-owngate-attest" in answer.headers
        process.send_signal(signal.SIGTERM)
        _, said = process.communicate(timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == 4, said.decode()
    assert b"1 countersignature(s) handed out are not in its log" in said
    assert b"Traceback" not in said  # the counter file's write failed too: logged
    assert b"counter file not saved" in said
    assert records(tmp_path / "log") == []


def test_a_sidecar_that_cannot_use_its_key_never_says_it_is_countersigning(
    tmp_path: Path,
) -> None:
    """`owngate attest` printed `countersigning ... on http://...` before it opened its
    key and log, then exited 1: whoever reads its output (an operator, a supervisor
    waiting for that line) was told it served. It now says so only once it does."""
    (tmp_path / "not-a-signing-key").write_text("-----BEGIN PRIVATE KEY-----\n")
    (tmp_path / "not-a-signing-key").chmod(0o600)
    argv = owngate_argv("attest", "--listen", f"127.0.0.1:{free_port()}")
    argv += ["--backend", "http://127.0.0.1:9", "--key", str(tmp_path / "not-a-signing-key")]
    argv += ["--log", str(tmp_path / "log")]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr.decode()
    assert b"signer key" in done.stderr
    assert b"countersigning" not in done.stderr
