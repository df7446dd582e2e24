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


def _stale(note: bytes) -> Callable[[Send], None]:
    """A real cosignature of this checkpoint, from an hour ago: a replayed answer."""
    line = COSIGNER.cosign(note.decode().split("\n\n")[0] + "\n", NOW - 3600).line().encode()
    return _said(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(line) + line)(note)


def _silent(note: bytes) -> Callable[[Send], None]:
    return lambda send: None


_ANSWERS: dict[str, Answer | None] = {
    "timeout": _silent,
    "unreachable": None,  # nothing listens
    "bad_answer": _said(b"HTTP/1.1 200 OK\r\nx-long: " + b"v" * 9000 + b"\r\n\r\n"),
    "bad_status": _said(
        b"HTTP/1.1 302 Found\r\nlocation: http://elsewhere/\r\ncontent-length: 0\r\n\r\n"
    ),
    "conflict": _said(b"HTTP/1.1 409 Conflict\r\ncontent-length: 7\r\n\r\n999999\n"),
    "untrusted": _said(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 3\r\n\r\nno\n"),
    "bad_cosignature": _stale,
}


def _closed_port_url() -> str:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/w"


def _fail_once(tmp_path: Path, answer: Answer | None) -> tuple[WitnessStatus, str]:
    """One cosigning attempt against `answer`: the witness's status, the metrics text."""

    async def scenario() -> tuple[WitnessStatus, str]:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, LOG_SIGNER)
        try:
            for n in range(3):
                await log_request(log, n)
            latest = await log.checkpoint()

            async def attempt(url: str) -> tuple[WitnessStatus, str]:
                client = WitnessClient(url, COSIGNER.vkey, timeout=0.5, clock=lambda: NOW)
                cosigning = Cosigning(log, tmp_path, [client])
                status = cosigning.witnesses[0]
                assert not await cosigning.cosign_once(client, status, latest)
                registry = CollectorRegistry()
                registry.register(CosigningCollector(cosigning))
                return status, generate_latest(registry).decode()

            if answer is None:
                return await attempt(_closed_port_url())
            with HostileWitness(answer(latest.note)) as witness:
                return await attempt(witness.url)
        finally:
            await log.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize("reason", list(_ANSWERS))
def test_each_failure_is_counted_under_its_reason(tmp_path: Path, reason: str) -> None:
    status, metrics = _fail_once(tmp_path, _ANSWERS[reason])
    assert status.detail(0.0).get("last_failure") == reason, status.last_error
    counted = {
        line.split('reason="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("owngate_witness_failures_total{")
    }
    assert counted == {r: "1.0" if r == reason else "0.0" for r in REASONS}
