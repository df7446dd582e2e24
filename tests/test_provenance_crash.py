"""Crash safety: a writer killed with SIGKILL mid-append loses nothing it acknowledged.

A child process appends in a bounded loop and prints each append as it returns; the
parent kills it after some acknowledgements, three times over the same directory. Then the
log is reopened (recovery), closed, and verified, and every acknowledged record is found
at the index its append returned.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from gateway.provenance import LogSettings, ProvenanceLog, verify_log
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.testing import seeded_signer

ORIGIN = "gateway.example/log/crash"

WRITER = """
import asyncio, sys
from gateway.provenance import LogSettings, ProvenanceLog
from gateway.provenance.testing import log_request, seeded_signer

ORIGIN = sys.argv[3]

async def main(path, first):
    settings = LogSettings(group_commit_ms=1, checkpoint_every=50)
    log = await ProvenanceLog.open(path, ORIGIN, seeded_signer(ORIGIN), settings=settings)
    print("open", flush=True)

    async def one(n):
        done = await log_request(log, n)
        print("ack", done.request_id, done.dispatch.index, done.completion.index, flush=True)

    for start in range(first, first + 20000, 8):  # bounded; the parent kills us first
        await asyncio.gather(*(one(n) for n in range(start, start + 8)))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _run_and_kill(path: Path, first: int, acks_wanted: int) -> list[tuple[str, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(first), ORIGIN],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    acks: list[tuple[str, int, int]] = []
    deadline = time.monotonic() + 20
    buffer = b""
    try:
        while len(acks) < acks_wanted and time.monotonic() < deadline:
            ready, _, _ = select.select([child.stdout], [], [], 0.5)
            if not ready:
                assert child.poll() is None, "the writer exited early"
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                words = line.decode().split()
                if words and words[0] == "ack":
                    acks.append((words[1], int(words[2]), int(words[3])))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # Whatever the child printed before dying was acknowledged too.
        rest = buffer + child.stdout.read()
        child.stdout.close()
    for line in rest.split(b"\n"):
        words = line.decode().split()
        if len(words) == 4 and words[0] == "ack":
            acks.append((words[1], int(words[2]), int(words[3])))
    assert child.returncode == -signal.SIGKILL
    assert len(acks) >= acks_wanted, "the writer did not get far enough before the deadline"
    return acks


def test_sigkill_mid_append_loses_no_acknowledged_record(tmp_path: Path) -> None:
    acks: list[tuple[str, int, int]] = []
    for round_number in range(3):
        acks += _run_and_kill(tmp_path, round_number * 100_000, acks_wanted=150)

    async def reopen() -> int:
        log = await ProvenanceLog.open(
            tmp_path, ORIGIN, seeded_signer(ORIGIN), settings=LogSettings()
        )
        size = log.size
        await log.close()
        return size

    size = asyncio.run(reopen())
    summary = verify_log(tmp_path, [seeded_signer(ORIGIN).verifier()])
    assert summary.size == size
    records = dict(LogDirectory(tmp_path).records(size))
    for request_id, dispatch_index, completion_index in acks:
        assert records[dispatch_index].request_id == request_id
        assert records[dispatch_index].type == "dispatch"
        assert records[completion_index].request_id == request_id
        assert records[completion_index].type == "completion"
