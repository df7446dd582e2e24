"""`owngate serve` restarted on an emptied log directory refuses to fork its log.

The attack: a gateway's log directory is deleted (or emptied, or its volume swapped) and
the gateway restarted under the same origin and key. Before the high-water file it
started a new, empty log under that origin: two logs with different contents under one
origin, and an auditor holding a checkpoint of the first could never be shown
consistency. Now it exits 3 naming the directory, the origin, the size already signed and
the way on; only an explicit new origin with `--new-log-origin` starts over
(docs/provenance.md, "Starting over").
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.provenance import Checkpoint, load_signer, verify_log, write_signing_key
from gateway.provenance.writer.recovery import note_text
from gateway.tenants import hash_api_key
from tests.helpers.gateways import Sim, backend
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess

ORIGIN = "test.owngate/log/fork"
KEY = "og-fork-test-key-0123456789abcdef"
ASK = orjson.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


def _config(sim: Sim, origin: str) -> dict[str, object]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {"dir": "log", "origin": origin, "signing_key_file": "log.key"},
    }


def _served(gateway: GatewayProcess) -> None:
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", content=ASK, headers=HEADERS)
    assert answer.status_code == 200, answer.text
    assert "x-owngate-receipt" in answer.headers


def test_a_restart_on_an_emptied_log_directory_refuses_to_fork_the_log(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    log = tmp_path / "log"
    gateway = GatewayProcess(_config(sim, ORIGIN), tmp_path)
    try:
        gateway.start()
        _served(gateway)
        _served(gateway)
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
        signed = Checkpoint.parse(note_text((log / "checkpoint").read_bytes(), log)).size
        assert signed >= 4  # two dispatches and their completions
        shutil.rmtree(log)

        with pytest.raises(AssertionError, match="gateway exited 3"):
            gateway.start()
        printed = gateway.output()
        for named in (str(log), ORIGIN, f"size {signed}", "--new-log-origin"):
            assert named in printed, printed
        assert not (log / "checkpoint").exists()  # nothing was signed under the origin

        # Starting over is the operator's explicit act: a new origin, and the flag.
        renamed = _config(sim, f"{ORIGIN}-2")
        with pytest.raises(AssertionError, match="gateway exited 3"):
            GatewayProcess(renamed, tmp_path).start()
        gateway = GatewayProcess(renamed, tmp_path, "--new-log-origin").start()
        _served(gateway)
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    finally:
        gateway.stop(signal.SIGKILL)
    summary = verify_log(log, [load_signer(tmp_path / "log.key").verifier()])
    assert summary.origin == f"{ORIGIN}-2"


def test_a_restart_checks_every_tile_and_entry_bundle_the_log_signed(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    # A full tile cut in half on disk: the restarted gateway used to sign on top of it, and
    # `audit verify` then failed the log ("tile/0/000 holds 128 hashes, not 256"). Now the
    # tile is rewritten from the entry bundles, which hash to the signed root; an entry
    # bundle that does not is refused by name, and nothing is signed.
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    verifier = load_signer(tmp_path / "log.key").verifier()
    log = tmp_path / "log"
    gateway = GatewayProcess(_config(sim, ORIGIN), tmp_path)
    try:
        gateway.start()
        with httpx.Client(timeout=30) as http:
            for _ in range(130):  # a dispatch and a completion each: a full tile and more
                answer = http.post(
                    f"{gateway.url}/v1/chat/completions", content=ASK, headers=HEADERS
                )
                assert answer.status_code == 200, answer.text
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
        tile = log / "tile/0/000"
        whole = tile.read_bytes()
        tile.write_bytes(whole[: len(whole) // 2])

        gateway.start()
        _served(gateway)
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
        assert "provenance tiles rewritten" in gateway.output()
        assert tile.read_bytes() == whole
        verify_log(log, [verifier])

        bundle = log / "tile/entries/000"
        bundle.write_bytes(bundle.read_bytes()[:-1])
        served = (log / "checkpoint").read_bytes()
        with pytest.raises(AssertionError, match="gateway exited 3"):
            gateway.start()
        printed = gateway.output()
        for named in ("tile/entries/000 is cut short", "--new-log-origin"):
            assert named in printed, printed
        assert (log / "checkpoint").read_bytes() == served  # nothing was signed on top
    finally:
        gateway.stop(signal.SIGKILL)
