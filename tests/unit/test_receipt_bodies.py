"""`owngate audit receipt verify --request-body --response-body`: a client, who holds
its receipt and its own bytes but not the gateway's log, checks that the backend's
countersignature is over exactly the request it sent and the answer it got."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import Receipt, Salts, commit, make_receipt
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.formats.receipts import attach_countersignature
from gateway.provenance.testing import CountingRandom, seeded_signer

LOG = seeded_signer("gw.test/bodies")
SIDECAR = seeded_signer("gpu.test/bodies")
SALTS = Salts.generate(CountingRandom("bodies"))
REQUEST = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
RESPONSE = b'{"choices":[{"message":{"content":"hello"}}]}'


@pytest.fixture
def receipt(tmp_path: Path) -> Path:
    """A receipt for req-1 at backend gpu, countersigned over REQUEST and RESPONSE."""
    statement = Statement(
        "req-1",
        "2026-01-01T00:00:00.000Z",
        7,
        str(SIDECAR),
        commit("request", SALTS.request, REQUEST),
        commit("response", SALTS.response, RESPONSE),
    )
    envelope = make_receipt(Receipt("req-1", LOG.name, 0, bytes(32), "gpu", "sha256:x", SALTS), LOG)
    path = tmp_path / "receipt.json"
    path.write_bytes(attach_countersignature(envelope, sign_statement(statement, SIDECAR)))
    (tmp_path / "request.json").write_bytes(REQUEST)
    (tmp_path / "response.json").write_bytes(RESPONSE)
    (tmp_path / "other.json").write_bytes(RESPONSE.replace(b"hello", b"HELLO"))
    return path


def _verify(receipt: Path, *extra: str) -> int:
    argv = ["audit", "receipt", "verify", str(receipt), "--key", LOG.vkey]
    return main([*argv, "--backend-key", f"gpu={SIDECAR.vkey}", *extra])


def test_the_countersigned_commitments_open_with_the_clients_own_bytes(
    receipt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies = receipt.parent
    argv = ["--request-body", str(bodies / "request.json")]
    argv += ["--response-body", str(bodies / "response.json")]
    assert _verify(receipt, *argv) == 0
    said = capsys.readouterr().out
    assert "ok: the backend countersigned this request body" in said
    assert "ok: the backend countersigned this response body" in said


@pytest.mark.parametrize(
    ("flag", "body", "kind"),
    [
        ("--response-body", "other.json", "response"),
        ("--request-body", "response.json", "request"),
    ],
)
def test_bytes_the_backend_did_not_countersign_fail(
    receipt: Path, capsys: pytest.CaptureFixture[str], flag: str, body: str, kind: str
) -> None:
    """A gateway that handed the client other bytes than the backend served (or sent the
    backend another request) cannot show the client a countersignature over them."""
    assert _verify(receipt, flag, str(receipt.parent / body)) == 1
    assert f"FAILED: the body and salt do not open this {kind} commitment" in (
        capsys.readouterr().err
    )


def test_bodies_need_a_countersignature_to_check(
    receipt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["audit", "receipt", "verify", str(receipt), "--key", LOG.vkey]
    assert main([*argv, "--response-body", str(receipt.parent / "response.json")]) == 2
    assert "--backend-key" in capsys.readouterr().err
