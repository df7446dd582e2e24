"""What the gateway says about a failing witness: each failed cosigning attempt is counted
under a reason from a fixed set (`owngate_witness_failures_total{witness, reason}`) and
shown as `last_failure` in the readiness detail, beside the escaped `last_error`.

Before, the metric only counted failures: a witness that timed out, one that redirected,
one that flooded, one that replayed an old answer and one that had seen a larger tree
(a rollback or a fork) read the same on a dashboard."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.api.metric_collectors import CosigningCollector
from gateway.provenance import ProvenanceLog
from gateway.provenance.testing import log_request
from gateway.provenance.witness.client import WitnessClient
from gateway.provenance.writer.cosignature_collector import Cosigning, WitnessStatus
from tests.helpers.hostile_witness import HostileWitness
from tests.helpers.witness_rig import COSIGNER, LOG_SIGNER, NOW, ORIGIN

Send = Callable[[bytes], bool]
#: docs/provenance.md's table, in the code's FAILURE_REASONS
REASONS = (
    *("timeout", "unreachable", "tls", "bad_answer", "bad_status", "malformed", "untrusted"),
    *("unknown_log", "conflict", "inconsistent", "unavailable", "bad_cosignature", "log"),
    "store",
)
Answer = Callable[[bytes], Callable[[Send], None]]  # the checkpoint note -> the answer


def _said(data: bytes) -> Answer:
    def answer(send: Send) -> None:
        send(data)

    return lambda note: answer


def _status(head: bytes, body: bytes) -> Answer:
    return _said(b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n%s" % (head, len(body), body))


def _stale(note: bytes) -> Callable[[Send], None]:
    """A real cosignature of this checkpoint, from an hour ago: a replayed answer."""
    line = COSIGNER.cosign(note.decode().split("\n\n")[0] + "\n", NOW - 3600).line().encode()
    return _said(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(line) + line)(note)


def _silent(note: bytes) -> Callable[[Send], None]:
    return lambda send: None


def _many_lines(note: bytes) -> Callable[[Send], None]:
    """10^5 cosignature lines (by another key), chunked: megabytes, refused at 64 KiB."""
    line = b"\xe2\x80\x94 other.example/w " + b"A" * 100 + b"\n"

    def answer(send: Send) -> None:
        send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(1000):  # 100 lines a chunk
            if not send(b"%x\r\n" % (100 * len(line)) + line * 100 + b"\r\n"):
                return

    return answer


# (the attempt, its reason, what the witness does)
_ANSWERS: list[tuple[str, str, Answer | None]] = [
    ("silent", "timeout", _silent),
    ("closed-port", "unreachable", None),  # nothing listens
    ("long-header", "bad_answer", _said(b"HTTP/1.1 200 OK\r\nx-long: " + b"v" * 9000 + b"\r\n")),
    ("gigabyte", "bad_answer", _said(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n")),
    ("10^5-lines", "bad_answer", _many_lines),
    ("redirect", "bad_status", _status(b"302 Found\r\nlocation: http://x/", b"")),
    ("409-huge-size", "conflict", _status(b"409 Conflict", b"9" * 40 + b"\n")),
    ("409-larger-tree", "conflict", _status(b"409 Conflict", b"999999\n")),
    ("403", "untrusted", _status(b"403 Forbidden", b"no\n")),
    ("replayed", "bad_cosignature", _stale),
]


# The client's timeout: short where it is the failure awaited (a silent witness), else one
# that only bounds a hang (it was 0.5 s for every case: on a busy machine an answer the
# test expects counted under another reason could come later than that, as a timeout).
_SILENT_TIMEOUT_S = 0.5
_TIMEOUT_S = 30.0


def _fail_once(
    tmp_path: Path, answer: Answer | None, timeout_s: float
) -> tuple[WitnessStatus, str]:
    """One cosigning attempt against `answer` (None: a port bound, never listening, held
    for the attempt: refused, and nothing else can take the port meanwhile, as one picked
    and released could be by the next server bound): the witness's status, the metrics."""

    async def scenario() -> tuple[WitnessStatus, str]:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, LOG_SIGNER)
        try:
            for n in range(3):
                await log_request(log, n)
            latest = await log.checkpoint()

            async def attempt(url: str) -> tuple[WitnessStatus, str]:
                client = WitnessClient(url, COSIGNER.vkey, timeout=timeout_s, clock=lambda: NOW)
                cosigning = Cosigning(log, tmp_path, [client])
                status = cosigning.witnesses[0]
                assert not await cosigning.cosign_once(client, status, latest)
                registry = CollectorRegistry()
                registry.register(CosigningCollector(cosigning))
                return status, generate_latest(registry).decode()

            if answer is None:
                with socket.socket() as closed:  # no SO_REUSEADDR: nobody else binds it
                    closed.bind(("127.0.0.1", 0))
                    return await attempt(f"http://127.0.0.1:{closed.getsockname()[1]}/w")
            with HostileWitness(answer(latest.note)) as witness:
                return await attempt(witness.url)
        finally:
            await log.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("reason", "answer"), [a[1:] for a in _ANSWERS], ids=[a[0] for a in _ANSWERS]
)
def test_each_failure_is_counted_under_its_reason(
    tmp_path: Path, reason: str, answer: Answer | None
) -> None:
    timeout_s = _SILENT_TIMEOUT_S if reason == "timeout" else _TIMEOUT_S
    status, metrics = _fail_once(tmp_path, answer, timeout_s)
    assert status.detail(0.0).get("last_failure") == reason, status.last_error
    counted = {
        line.split('reason="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("owngate_witness_failures_total{")
    }
    assert counted == {r: "1.0" if r == reason else "0.0" for r in REASONS}
