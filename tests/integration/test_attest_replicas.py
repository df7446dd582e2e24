"""Two-party receipts with gateway replicas (issue 15, layer 3): DESIGN.md runs one
provenance log per replica, and a sidecar serves them all. `owngate audit verify LOG
--replica-log OTHER` checks the replicas' logs as one: a sidecar's log cross-checked against
them all (a statement one replica holds is not traffic that bypassed the gateway), and
a countersignature replayed from one replica's log into another's (a compromised replica
claiming an answer another replica relayed, or a sidecar signing one counter twice for
two replicas) is caught, which auditing each log alone cannot see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import load_signer
from tests.helpers.attest import CHAT, Sidecar, rewrite_log, served_chats, start_sidecar
from tests.helpers.gateways import Gateway, Sim, backend, logged_gateway
from tests.helpers.provenance import records, run_audit


@pytest.fixture
def sidecar(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Sidecar]:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    started = start_sidecar(tmp_path, "gpu", sim.url)
    yield started
    started.process.kill()


def _replica(
    start_gateway: Callable[..., Gateway], directory: Path, sidecar: Sidecar
) -> tuple[Gateway, str]:
    """A gateway replica with its own log (origin and key) in `directory`; its log's vkey."""
    directory.mkdir()
    attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
    gateway = logged_gateway(start_gateway, directory, [attested], f"gw.test/{directory.name}")
    return gateway, load_signer(directory / "log.key").vkey


def _audit(log: Path, *extra: str) -> int:
    return run_audit(["verify", str(log), *extra])


def test_the_sidecar_log_agrees_with_the_replicas_logs_together(
    start_gateway: Callable[..., Gateway],
    sidecar: Sidecar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, a_key = _replica(start_gateway, tmp_path / "a", sidecar)
    b, b_key = _replica(start_gateway, tmp_path / "b", sidecar)
    served_chats(a, tmp_path / "a" / "log", 2)
    served_chats(b, tmp_path / "b" / "log", 3)
    bypass = httpx.post(f"{sidecar.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert bypass.status_code == 200 and "x-owngate-attest" in bypass.headers
    assert sidecar.stop() == 0
    keys = ["--key", a_key, "--key", b_key, "--backend-key", f"gpu={sidecar.vkey}"]
    replicas = ["--replica-log", str(tmp_path / "b" / "log")]

    # Together, a statement neither replica dispatched is still traffic past the gateway.
    capsys.readouterr()
    assert _audit(tmp_path / "a" / "log", *keys, *replicas, "--attest-log", str(sidecar.log)) == 1
    said = capsys.readouterr().err
    assert "the sidecar countersigned request 'attest-" in said
    assert "which the gateway's log never dispatched to backend gpu" in said

    # The sidecar's log without that statement (as its key's holder can write it).
    clean = tmp_path / "clean"
    rewrite_log(
        sidecar.log,
        clean,
        sidecar.key_file,
        "gpu",
        lambda entries: [r for r in entries if not r["request_id"].startswith("attest-")],
    )
    sidecar_log = ["--attest-log", str(clean)]
    # One replica's log alone: the other's statements look like traffic past the gateway.
    assert _audit(tmp_path / "a" / "log", *keys, *sidecar_log) == 1
    assert "which the gateway's log never dispatched to backend gpu" in capsys.readouterr().err

    assert _audit(tmp_path / "a" / "log", *keys, *replicas, *sidecar_log) == 0
    said = capsys.readouterr().out
    assert "ok: replica log 'gw.test/b': " in said
    assert (
        "backend gpu: 5 answer(s) countersigned by its key; its sidecar's log (5 entries) "
        "agrees" in said
    )


def test_a_countersignature_replayed_into_another_replicas_log_is_caught(
    start_gateway: Callable[..., Gateway],
    sidecar: Sidecar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Replica b's holder copies an answer replica a relayed (dispatch and completion,
    countersignature and all) into its own log: each log alone verifies, and the copy is
    even in the sidecar's log. Audited together, the counter is used twice."""
    a, a_key = _replica(start_gateway, tmp_path / "a", sidecar)
    b, b_key = _replica(start_gateway, tmp_path / "b", sidecar)
    (taken, _) = served_chats(a, tmp_path / "a" / "log", 2)
    served_chats(b, tmp_path / "b" / "log", 1)
    assert sidecar.stop() == 0

    def claim(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        theirs = [r for r in records(tmp_path / "a" / "log") if r["request_id"] == taken]
        return entries + [copy.deepcopy(r) for r in theirs]

    forged = tmp_path / "b-forged"
    rewrite_log(tmp_path / "b" / "log", forged, tmp_path / "b" / "log.key", "gw.test/b", claim)
    keys = ["--key", a_key, "--key", b_key, "--backend-key", f"gpu={sidecar.vkey}"]
    assert _audit(forged, *keys) == 0  # alone, the copy passes
    assert _audit(tmp_path / "a" / "log", *keys) == 0
    capsys.readouterr()
    assert _audit(tmp_path / "a" / "log", *keys, "--replica-log", str(forged)) == 1
    said = capsys.readouterr().err
    assert f"counter 0 of key {'+'.join(sidecar.vkey.split('+')[:2])} was already used" in said
    assert "a replayed countersignature" in said
    assert f"replica log {forged}: entry " in said


def test_a_log_given_as_its_own_replica_is_a_usage_error(
    start_gateway: Callable[..., Gateway],
    sidecar: Sidecar,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, a_key = _replica(start_gateway, tmp_path / "a", sidecar)
    served_chats(a, tmp_path / "a" / "log", 1)
    log = str(tmp_path / "a" / "log")
    keys = ["--key", a_key, "--backend-key", f"gpu={sidecar.vkey}"]
    capsys.readouterr()
    assert _audit(tmp_path / "a" / "log", *keys, "--replica-log", log) == 2
    assert "the log 'gw.test/a' is given twice" in capsys.readouterr().err
    assert _audit(tmp_path / "a" / "log", "--key", a_key, "--replica-log", log) == 2
    assert "--replica-log needs the sidecar's --backend-key" in capsys.readouterr().err
