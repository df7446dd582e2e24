"""The cross-check of a sidecar's log against the gateway's (`audit verify --backend-key
--attest-log`) counts every answer on its own: a request id the gateway's log names twice
needs two statements in the sidecar's log, and a sidecar log missing one of them fails."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.cli.audit_flags import backend_keys
from gateway.cli.main import main
from gateway.provenance import (
    BackendRef,
    LogVerificationError,
    ProvenanceLog,
    Salts,
    Signer,
    commit,
    verify_log,
)
from gateway.provenance.audit.attested import check_attestations, cross_check
from gateway.provenance.formats.attestation import (
    Attestation,
    Statement,
    check_countersignature,
    sign_statement,
)
from gateway.provenance.formats.records import completion_record, dispatch_record
from gateway.provenance.testing import (
    EXAMPLE_BACKEND,
    EXAMPLE_POLICY,
    CountingRandom,
    seeded_signer,
)

GATEWAY = seeded_signer("gw.test/cross")
SIDECAR = seeded_signer("gpu.test/attest")
BACKEND = EXAMPLE_BACKEND.id
REQUEST, RESPONSE = b'{"model":"m","messages":[]}', b'{"choices":[]}'
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _statement(counter: int, request_id: str, salts: Salts, signer: Signer = SIDECAR) -> Statement:
    return Statement(
        request_id,
        "2026-01-01T00:00:00.000Z",
        counter,
        str(signer),
        commit("request", salts.request, REQUEST),
        commit("response", salts.response, RESPONSE),
    )


async def _gateway_log(
    path: Path,
    answers: list[tuple[str, Statement, Salts]],
    backend: BackendRef = EXAMPLE_BACKEND,
    *,
    status: int = 200,
    signer: Signer = SIDECAR,
) -> None:
    """Each answer dispatched and completed with `status`: countersigned below 400, else
    without a countersignature (the client left, the gateway recorded why)."""
    log = await ProvenanceLog.open(path, GATEWAY.name, GATEWAY)
    try:
        for number, (request_id, statement, salts) in enumerate(answers):
            moment = EPOCH + timedelta(seconds=number)
            dispatch = await log.append(
                dispatch_record(
                    request_id=request_id,
                    time=moment,
                    tenant="acme-app",
                    model="m",
                    policy=EXAMPLE_POLICY,
                    trace=[],
                    backend=backend,
                    fallback_reason=None,
                    request_commitment=statement.request_commitment,
                )
            )
            counter = check_countersignature(
                sign_statement(statement, signer),
                signer.verifier(),
                request_id=request_id,
                request_commitment=statement.request_commitment,
                response_commitment=commit("response", salts.response, RESPONSE),
            )
            await log.append(
                completion_record(
                    request_id=request_id,
                    time=moment,
                    dispatch=dispatch,
                    status=status,
                    error=None if status < 400 else "client_gone",
                    usage=None,
                    latency_ms=1,
                    response_commitment=statement.response_commitment,
                    attestation=Attestation.accepted(counter) if status < 400 else None,
                )
            )
    finally:
        await log.close()


async def _sidecar_log(path: Path, statements: list[Statement]) -> None:
    log = await ProvenanceLog.open(path, SIDECAR.name, SIDECAR)
    try:
        for statement in statements:
            await log.append(statement.record())
    finally:
        await log.close()


@pytest.fixture
def answers() -> list[tuple[str, Statement, Salts]]:
    """Two accepted answers under one request id (each its own countersignature), and
    one under another."""
    made = []
    for counter, request_id in enumerate(("req-1", "req-1", "req-2")):
        salts = Salts.generate(CountingRandom(f"answer/{counter}"))
        made.append((request_id, _statement(counter, request_id, salts), salts))
    return made


def _cross_check(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]], logged: list[Statement]
) -> int:
    asyncio.run(_gateway_log(tmp_path / "log", answers))
    asyncio.run(_sidecar_log(tmp_path / "sidecar", logged))
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    summary = check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )
    assert summary.answers == {BACKEND: 3}
    return cross_check(summary, tmp_path / "sidecar", BACKEND, SIDECAR.verifier())


def test_every_answer_of_a_repeated_request_id_needs_its_own_statement(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]]
) -> None:
    statements = [statement for _, statement, _ in answers]
    assert _cross_check(tmp_path / "whole", answers, statements) == 3
    for hidden in (0, 1):
        kept = [s for s in statements if s.counter != hidden]
        with pytest.raises(LogVerificationError) as caught:
            _cross_check(tmp_path / f"hidden-{hidden}", answers, kept)
        said = str(caught.value)
        assert (
            f"the gateway's log records request 'req-1' as countersigned by backend {BACKEND} "
            f"(counter {hidden}), but the sidecar's log" in said
        )
        assert "an entry is missing from the sidecar's log (1 in all)" in said


def test_one_key_given_for_two_backends_is_refused(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]]
) -> None:
    """A statement names its key, not its backend: with one key for backends A and B, a
    gateway's log could say B served what A's sidecar countersigned, and pass."""
    other = dataclasses.replace(EXAMPLE_BACKEND, id="gpu-other")
    asyncio.run(_gateway_log(tmp_path / "log", answers, other))  # A's statements, "B" named
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    keys = {BACKEND: SIDECAR.verifier(), "gpu-other": SIDECAR.verifier()}
    with pytest.raises(ValueError, match=f"backends {BACKEND} and gpu-other are given one key"):
        check_attestations(tmp_path / "log", verified.size, keys, root=verified.root)
    vkey = SIDECAR.verifier().vkey
    with pytest.raises(ValueError, match="are given one key"):
        backend_keys([f"{BACKEND}={vkey}", f"gpu-other={vkey}"], [])


def test_one_public_key_under_two_names_does_not_let_one_backend_pass_for_the_other(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]]
) -> None:
    """The same public key under another name is another key id: the statement names the
    key it was signed under (`name+hexid`, inside what is signed), so A's statements do
    not pass as B's, whose key id differs, though the key's bytes are the same."""
    other = dataclasses.replace(EXAMPLE_BACKEND, id="gpu-other")
    asyncio.run(_gateway_log(tmp_path / "log", answers, other))  # A's statements, "B" named
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    renamed = Signer.from_seed("gpu.test/renamed", hashlib.sha256(b"gpu.test/attest/1").digest())
    assert renamed.verifier().vkey.split("+", 2)[2] == SIDECAR.verifier().vkey.split("+", 2)[2]
    keys = {BACKEND: SIDECAR.verifier(), "gpu-other": renamed.verifier()}
    with pytest.raises(LogVerificationError, match="not by backend gpu-other's key"):
        check_attestations(tmp_path / "log", verified.size, keys, root=verified.root)


def test_a_backend_given_two_keys_is_refused() -> None:
    """`--backend-key ID=K1 --backend-key ID=K2` is ambiguous: the last one would win."""
    first, second = SIDECAR.verifier().vkey, seeded_signer("gpu.test/attest", 2).verifier().vkey
    with pytest.raises(ValueError, match=f"--backend-key {BACKEND} is given twice"):
        backend_keys([f"{BACKEND}={first}", f"{BACKEND}={second}"], [])
    assert list(backend_keys([f"{BACKEND}={first}"], [])) == [BACKEND]


def test_a_statement_over_a_request_the_gateway_did_not_dispatch_is_caught(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]]
) -> None:
    """A request the gateway dispatched but holds no countersignature for (the client
    left: 499) may have a statement in the sidecar's log, counted; but only over the
    request the gateway dispatched. One over another body under that request id (a
    client that knows its own id and salts sending something else straight to a
    sidecar without mutual TLS, a body changed on the way) is a request that did not
    come through the gateway."""
    asyncio.run(_gateway_log(tmp_path / "log", answers, status=499))
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    summary = check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )
    assert summary.answers == {BACKEND: 0}
    statements = [statement for _, statement, _ in answers]
    asyncio.run(_sidecar_log(tmp_path / "same", statements))
    assert cross_check(summary, tmp_path / "same", BACKEND, SIDECAR.verifier()) == 3
    assert summary.unaccepted == {BACKEND: 3}
    other = dataclasses.replace(statements[2], request_commitment="ab" * 32)
    asyncio.run(_sidecar_log(tmp_path / "other", [*statements[:2], other]))
    with pytest.raises(LogVerificationError) as caught:
        cross_check(summary, tmp_path / "other", BACKEND, SIDECAR.verifier())
    assert (
        "the sidecar countersigned request 'req-2' (counter 2) over a request body the "
        f"gateway's log never dispatched to backend {BACKEND}" in str(caught.value)
    )


def test_the_gateways_own_key_is_no_backend_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend "countersigned" with the gateway's own log key is the gateway's word
    twice: whoever holds the log key writes both. An auditor given the same key for the
    log and a backend (a copy-paste slip, or a gateway operator who set it up so) would
    read its log as two-party statements."""
    salts = Salts.generate(CountingRandom("own"))
    forged = [("req-1", _statement(0, "req-1", salts, GATEWAY), salts)]
    asyncio.run(_gateway_log(tmp_path / "log", forged, signer=GATEWAY))
    vkey = GATEWAY.verifier().vkey
    base = ["audit", "verify", str(tmp_path / "log"), "--key", vkey]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, "--backend-key", f"{BACKEND}={vkey}"]) == 2
    said = capsys.readouterr().err
    assert f"--backend-key {BACKEND} is a key of the log itself" in said
    # The same key under another name (a name is the holder's to choose).
    renamed = Signer.from_seed("gpu.test/renamed", hashlib.sha256(b"gw.test/cross/1").digest())
    assert main([*base, "--backend-key", f"{BACKEND}={renamed.verifier().vkey}"]) == 2


def test_a_backend_key_under_an_id_the_log_does_not_use_is_pointed_out(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--backend-key` holds the answers of one backend id to the rule: under a mistyped
    id (or one the log spells otherwise) it checks nothing and the audit passes. It
    still passes, but says so, and names the private backends it took no key for."""
    asyncio.run(_gateway_log(tmp_path / "log", answers))
    vkey = SIDECAR.verifier().vkey
    argv = ["audit", "verify", str(tmp_path / "log"), "--key", GATEWAY.verifier().vkey]
    assert main([*argv, "--backend-key", f"vllm-eu1={vkey}"]) == 0
    said = capsys.readouterr().out
    assert (
        "ok: backend vllm-eu1: 0 answer(s) countersigned by its key (the log dispatched "
        "nothing to it: is the id right?)" in said
    )
    assert (
        "note: answers of private backends given no --backend-key, the gateway's word "
        f"alone: {BACKEND!r} (3)" in said
    )
    assert main([*argv, "--backend-key", f"{BACKEND}={vkey}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attested"]["unkeyed"] == {}


def test_a_backend_key_whose_base64_holds_a_plus_is_read_whole() -> None:
    """A verifier key is `name+hexid+base64`, and standard base64 has `+` in it too."""
    plus = seeded_signer("gpu.test/attest", 2).verifier()
    assert "+" in plus.vkey.split("+", 2)[2]
    keys = backend_keys([f"{BACKEND}={plus.vkey}"], [GATEWAY.verifier()])
    assert {backend: key.vkey for backend, key in keys.items()} == {BACKEND: plus.vkey}
    with pytest.raises(ValueError, match="is a key of the log itself"):
        backend_keys([f"{BACKEND}={plus.vkey}"], [plus])


def test_a_rolled_back_sidecar_log_is_caught_against_a_checkpoint_seen_before(
    tmp_path: Path, answers: list[tuple[str, Statement, Salts]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The sidecar countersigned a request that bypassed the gateway after the last answer
    the gateway's log carries; its log is then rolled back to before that statement (its
    newer checkpoints and entries removed). Nothing in the gateway's log binds that tail,
    so the cross-check alone passes; a checkpoint of the sidecar's log seen before (an
    earlier audit, a monitor) must still be in it, and the rollback is caught."""
    asyncio.run(_gateway_log(tmp_path / "log", answers))
    statements = [statement for _, statement, _ in answers]
    salts = Salts.generate(CountingRandom("bypass"))
    bypass = _statement(3, "req-bypass", salts)
    asyncio.run(_sidecar_log(tmp_path / "sidecar", [*statements, bypass]))
    seen = (tmp_path / "sidecar" / "checkpoint").read_bytes()  # size 4, the auditor saved it
    (tmp_path / "seen.checkpoint").write_bytes(seen)
    asyncio.run(_sidecar_log(tmp_path / "rolled", statements))  # the same log, cut at 3
    verified = verify_log(tmp_path / "log", [GATEWAY.verifier()])
    summary = check_attestations(
        tmp_path / "log", verified.size, {BACKEND: SIDECAR.verifier()}, root=verified.root
    )
    with pytest.raises(LogVerificationError, match="did not come through this gateway"):
        cross_check(summary, tmp_path / "sidecar", BACKEND, SIDECAR.verifier())
    # the gap: the rolled-back log agrees with every statement the gateway's log carries
    assert cross_check(summary, tmp_path / "rolled", BACKEND, SIDECAR.verifier()) == 3
    with pytest.raises(LogVerificationError) as caught:
        cross_check(
            summary, tmp_path / "rolled", BACKEND, SIDECAR.verifier(), trusted_checkpoints=[seen]
        )
    assert f"the sidecar log of backend {BACKEND}: rollback: " in str(caught.value)
    vkey = SIDECAR.verifier().vkey
    argv = ["audit", "verify", str(tmp_path / "log"), "--key", GATEWAY.verifier().vkey]
    argv += ["--backend-key", f"{BACKEND}={vkey}", "--attest-log", str(tmp_path / "rolled")]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--attest-checkpoint", str(tmp_path / "seen.checkpoint")]) == 1
    assert "rollback: the log's newest checkpoint has size 3" in capsys.readouterr().err
    named = f"{BACKEND}={tmp_path / 'seen.checkpoint'}"
    assert main([*argv, "--attest-checkpoint", named]) == 1
    # a checkpoint the log still covers passes; one for a sidecar log not given is a usage error
    (tmp_path / "old.checkpoint").write_bytes((tmp_path / "rolled" / "checkpoint").read_bytes())
    assert main([*argv, "--attest-checkpoint", str(tmp_path / "old.checkpoint")]) == 0
    capsys.readouterr()
    no_log = [*argv[:-2], "--attest-checkpoint", str(tmp_path / "seen.checkpoint")]
    assert main(no_log) == 2
    assert "needs its --attest-log" in capsys.readouterr().err
