"""Witness cosignatures obtained by the gateway, and checked by `owngate audit verify`.

Layers: `ProvenanceLog.consistency_proof` against the Merkle module; `Cosigning` following
a real log and a real witness app on a uvicorn socket (cosigned files, a witness that
goes away and comes back, a 409 after a restart); `verify_log` with witness keys (good,
tampered, missing, too few, rollback); and the gateway itself as `owngate serve` next to
a real `owngate witness serve` process.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.provenance import (
    LogDirectory,
    LogSettings,
    LogVerificationError,
    ProvenanceLog,
    load_signer,
    verify_log,
    write_signing_key,
)
from gateway.provenance.formats.cosignature import Cosigner, verify_cosignature
from gateway.provenance.formats.merkle import consistency_proof, verify_consistency
from gateway.provenance.formats.tiles import TileReader
from gateway.provenance.testing import log_request, seeded_signer
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.client import WitnessClient
from gateway.provenance.witness.witness import Witness
from gateway.provenance.writer.cosignature_collector import (
    Cosigning,
    cosigned_path,
    list_cosigned,
    merge_cosigned,
)
from gateway.serving import ServerThread
from tests.helpers.cosigned_rig import LOG_SIGNER, ORIGIN, W1, W2, copy_log, witnessed_log
from tests.helpers.gateways import ADMIN_HEADERS, readiness
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.provenance import run_audit
from tests.helpers.waiting import until, until_async

__all__ = ["witnessed_log"]  # a fixture, used by name

DEADLINE_S = 20.0


# --- the log's consistency proofs --------------------------------------------------------


def test_consistency_proof_is_read_from_the_signed_tiles(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, LOG_SIGNER)
        roots = {}
        for n in range(300):  # past one full tile of 256
            await log_request(log, n)
            if n in (2, 130, 299):
                signed = await log.checkpoint()
                roots[signed.checkpoint.size] = signed.checkpoint.root
        for old in roots:
            for new in roots:
                if old <= new:
                    proof = await log.consistency_proof(old, new)
                    assert proof == consistency_proof(old, new, TileReader(tmp_path, new).node)
                    verify_consistency(old, new, proof, roots[old], roots[new])
        for old, new in ((0, 6), (7, 6), (6, log.size + 1)):
            with pytest.raises(ValueError, match="no consistency proof"):
                await log.consistency_proof(old, new)
        await log.close()

    asyncio.run(scenario())


def test_merge_keeps_every_witness_line_once() -> None:
    note = "o\n1\nAAAA\n\n\u2014 o abc\n".encode()
    one, two = "\u2014 w1 xyz\n".encode(), "\u2014 w2 uvw\n".encode()
    assert merge_cosigned(note, None, note + one) == note + one
    assert merge_cosigned(note, note + one, note + two) == note + one + two
    assert merge_cosigned(note, note + one + two, note + one) == note + one + two
    assert merge_cosigned(note, b"another note\n\n" + one, note + two) == note + two


# --- Cosigning against a real witness on a socket ----------------------------------------


class _WitnessServer:
    """A witness app on a uvicorn socket; `stop()` and `start()` keep its state file."""

    def __init__(self, state: Path, cosigner: Cosigner = W1) -> None:
        self.state, self.cosigner = state, cosigner
        self.port = free_port()
        self._thread: ServerThread | None = None
        self._witness: Witness | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> _WitnessServer:
        new = not self.state.exists()  # the first start makes the state; a restart keeps it
        self._witness = Witness.open(self.state, self.cosigner, [LOG_SIGNER.verifier()], new=new)
        self._thread = ServerThread(create_witness_app(self._witness), port=self.port).start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._witness is not None:
            self._witness.close()
            self._witness = None


@pytest.fixture
def witness_server(tmp_path: Path) -> Iterator[_WitnessServer]:
    server = _WitnessServer(tmp_path / "witness.json").start()
    yield server
    server.stop()


def test_cosigning_follows_the_log_survives_an_outage_and_verifies(
    tmp_path: Path, witness_server: _WitnessServer
) -> None:
    logdir = tmp_path / "log"

    async def scenario() -> Cosigning:
        settings = LogSettings(checkpoint_interval_ms=50)
        log = await ProvenanceLog.open(logdir, ORIGIN, LOG_SIGNER, settings=settings)
        client = WitnessClient(witness_server.url, W1.vkey, timeout=2)
        cosigning = Cosigning(log, logdir, [client], retry_min_s=0.05, retry_max_s=0.2)
        task = asyncio.create_task(cosigning.run())
        status = cosigning.witnesses[0]
        try:
            for n in range(5):
                await log_request(log, n)
            await until_async(
                lambda: status.cosigned_size == log.size, "first cosignature", timeout=DEADLINE_S
            )
            assert cosigning.status()["state"] == "ok"

            await asyncio.to_thread(witness_server.stop)
            for n in range(5, 10):  # appends never wait for the witness
                await log_request(log, n)
            await until_async(
                lambda: status.consecutive_failures >= 2, "failed retries", timeout=DEADLINE_S
            )
            assert cosigning.degraded and status.last_error
            assert cosigning.status()["witnesses"][str(W1)]["state"] == "degraded"

            await asyncio.to_thread(witness_server.start)
            await until_async(
                lambda: status.cosigned_size == log.size, "resumed cosigning", timeout=DEADLINE_S
            )
            assert not cosigning.degraded and status.failures >= 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await log.close()
        return cosigning

    asyncio.run(scenario())
    files = list_cosigned(logdir)
    assert [size for size, _ in files] == sorted({size for size, _ in files})
    assert files[-1][0] == 20  # 10 requests, two records each
    for _, path in files:
        verify_cosignature(path.read_bytes(), W1.vkey, now=time.time())
    summary = verify_log(logdir, [LOG_SIGNER.verifier()], witnesses=[W1.vkey])
    assert summary.witnesses is not None
    assert summary.witnesses.witnessed_size == 20
    assert summary.witnesses.newest_by == {str(W1): 20}


def test_a_restarted_gateway_learns_the_witness_size_from_its_409(
    tmp_path: Path, witness_server: _WitnessServer
) -> None:
    logdir = tmp_path / "log"

    async def run_once(first: int) -> int:
        log = await ProvenanceLog.open(logdir, ORIGIN, LOG_SIGNER)
        # One attempt, whose answer is awaited: the timeout only bounds a hang (2 s left a
        # busy machine's signing and state write little room, with no retry after it).
        client = WitnessClient(witness_server.url, W1.vkey, timeout=30)
        cosigning = Cosigning(log, logdir, [client], retry_min_s=0.05)
        for n in range(first, first + 3):
            await log_request(log, n)
        latest = await log.checkpoint()
        assert await cosigning.cosign_once(client, cosigning.witnesses[0], latest)
        await log.close()
        return client.old_size

    assert asyncio.run(run_once(0)) == 6
    assert asyncio.run(run_once(3)) == 12  # started from 0, was told 6, proved 6 -> 12
    assert [size for size, _ in list_cosigned(logdir)] == [6, 12]


# --- verify_log with witness keys --------------------------------------------------------


def test_verify_reports_what_is_witnessed(witnessed_log: Path) -> None:
    keys = [LOG_SIGNER.verifier()]
    one = verify_log(witnessed_log, keys, witnesses=[W1.vkey])
    assert one.witnesses is not None
    assert (one.witnesses.cosigned, one.witnesses.witnessed_size) == (2, 8)
    assert one.size == 10 and one.witnesses.newest_by == {str(W1): 8}
    both = verify_log(witnessed_log, keys, witnesses=[W1.vkey, W2.vkey], min_witnesses=2)
    assert both.witnesses is not None and both.witnesses.witnessed_size == 8
    assert verify_log(witnessed_log, keys).witnesses is None  # no witness keys: not checked


def test_a_tampered_cosignature_fails_with_the_file_and_witness(
    witnessed_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = copy_log(witnessed_log, tmp_path)
    path = cosigned_path(copy, 4)
    data = bytearray(path.read_bytes())
    data[-10] = ord("A") if data[-10] != ord("A") else ord("B")  # inside the witness's base64
    path.write_bytes(bytes(data))
    with pytest.raises(LogVerificationError, match=f"cosigned/{4:020d}: invalid cosignature"):
        verify_log(copy, [LOG_SIGNER.verifier()], witnesses=[W1.vkey])
    code = run_audit(["verify", str(copy), "--key", LOG_SIGNER.vkey, "--witness-key", W1.vkey])
    err = capsys.readouterr().err
    assert code == 1
    assert f"FAILED: cosigned/{4:020d}: invalid cosignature by witness {W1}" in err


def test_missing_or_too_few_cosignatures_fail(witnessed_log: Path, tmp_path: Path) -> None:
    keys = [LOG_SIGNER.verifier()]
    w3 = Cosigner(seeded_signer("witness.example/w3", seed=3))
    with pytest.raises(LogVerificationError, match=r"at least 2 of the 2 .*the most any has is 1"):
        verify_log(witnessed_log, keys, witnesses=[W1.vkey, w3.vkey], min_witnesses=2)
    with pytest.raises(ValueError, match="min_witnesses"):
        verify_log(witnessed_log, keys, witnesses=[W1.vkey], min_witnesses=2)
    copy = copy_log(witnessed_log, tmp_path)
    shutil.rmtree(copy / "cosigned")
    with pytest.raises(LogVerificationError, match="cosigned/ is empty or missing"):
        verify_log(copy, keys, witnesses=[W1.vkey])


def test_a_cosigned_checkpoint_the_log_no_longer_has_is_a_rollback_or_fork(
    witnessed_log: Path, tmp_path: Path
) -> None:
    keys = [LOG_SIGNER.verifier()]
    copy = copy_log(witnessed_log, tmp_path)
    (copy / "checkpoints" / f"{10:020d}").unlink()  # drop the newest: the log "stopped" at 8
    shutil.copy(copy / "checkpoints" / f"{8:020d}", copy / "checkpoint")
    w1 = Witness.open(tmp_path / "w.json", W1, [LOG_SIGNER.verifier()], new=True)
    try:
        note = (witnessed_log / "checkpoints" / f"{10:020d}").read_bytes()
        cosigned_path(copy, 10).write_bytes(note + w1.add_checkpoint(0, [], note))
    finally:
        w1.close()
    with pytest.raises(LogVerificationError, match="rollback: a witness cosigned size 10"):
        verify_log(copy, keys, witnesses=[W1.vkey])


# --- the gateway with a real `owngate witness serve` process -----------------------------


class _WitnessProcess:
    def __init__(self, tmp_path: Path, log_vkey: str) -> None:
        self.key = tmp_path / "witness.key"
        write_signing_key(self.key, "witness.test/w1")
        self.vkey = Cosigner(load_signer(self.key)).vkey
        self.log_vkey = log_vkey
        self.state = tmp_path / "witness-state.json"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> _WitnessProcess:
        if not self.state.exists():  # a new witness: its state is made on purpose
            subprocess.run(
                [sys.executable, "-m", "gateway", "witness", "init", "--state", str(self.state)],
                check=True,
                capture_output=True,
                timeout=DEADLINE_S,
            )
        argv = ["witness", "serve", "--key", str(self.key), "--log", self.log_vkey]
        argv += ["--state", str(self.state), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

        def listening() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self._stderr()
            try:
                httpx.get(self.url + "/", timeout=1)
            except httpx.TransportError:
                return False
            return True

        until(listening, "the witness to listen", timeout=DEADLINE_S)
        return self

    def _stderr(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.communicate(timeout=15)
        self.proc = None


def _chat(gateway: GatewayProcess, count: int) -> list[int]:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}) as c:
        return [
            c.post("/v1/chat/completions", json=body, timeout=10).status_code for _ in range(count)
        ]


def _witness_state(gateway: GatewayProcess) -> tuple[int, dict[str, object]]:
    answer = httpx.get(f"{gateway.url}/readyz", timeout=5)
    witnesses = readiness(gateway.url)["witnesses"]
    (detail,) = witnesses["witnesses"].values()
    return answer.status_code, detail


def test_gateway_gets_cosignatures_from_a_witness_process(
    process: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    origin = "test.owngate/witnessed"
    log_vkey = write_signing_key(tmp_path / "log.key", origin)
    witness = _WitnessProcess(tmp_path, log_vkey).start()
    try:
        gateway = process(
            provenance={
                "dir": "log",
                "origin": origin,
                "signing_key_file": "log.key",
                "checkpoint_interval_ms": 100,
                "witnesses": [{"url": witness.url, "vkey": witness.vkey, "timeout_s": 2}],
                "witness_retry_max_s": 0.5,
            }
        ).start()
        assert set(_chat(gateway, 5)) == {200}
        until(
            lambda: _witness_state(gateway)[1]["cosigned_size"] == 10,
            "cosigned size 10",
            timeout=DEADLINE_S,
        )

        witness.stop()  # the witness goes away: requests are still served
        assert set(_chat(gateway, 5)) == {200}
        until(
            lambda: _witness_state(gateway)[1]["state"] == "degraded",
            "degraded witness",
            timeout=DEADLINE_S,
        )
        status, detail = _witness_state(gateway)
        assert status == 200  # still ready: a witness never gates traffic
        assert detail["failures"] and detail["last_error"]
        metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=5).text
        assert 'owngate_witness_up{witness="witness.test/w1+' in metrics
        assert "owngate_witness_failures_total" in metrics

        witness.start()  # back: the gateway catches up with one consistency proof
        until(
            lambda: _witness_state(gateway)[1]["cosigned_size"] == 20,
            "cosigning resumed",
            timeout=DEADLINE_S,
        )
        assert _witness_state(gateway)[1]["state"] == "ok"
        gateway.stop()
    finally:
        witness.stop()

    logdir = str(tmp_path / "log")
    assert run_audit(["verify", logdir, "--key", log_vkey, "--witness-key", witness.vkey]) == 0
    assert [size for size, _ in list_cosigned(tmp_path / "log")][-1] == 20
    prove = ["audit", "prove", logdir, _first_request(tmp_path), "--cosigned"]
    proof = subprocess.run(
        [sys.executable, "-m", "gateway", *prove],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert witness.vkey.split("+")[0].encode() in proof  # the witness line rides along


def _first_request(tmp_path: Path) -> str:
    (entry, *_) = LogDirectory(tmp_path / "log").bundle(0, 20)
    request_id: str = orjson.loads(entry)["request_id"]
    return request_id
