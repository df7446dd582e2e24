"""Rotating a log's signing key through a real gateway process (docs/provenance.md).

Phase A: `owngate serve` with key A. Overlap: restarted with key B and
`previous_signing_key_files: [A]`, so its checkpoints carry both signatures. Phase B:
restarted with B alone. Then: both keys verify the whole log; the old checkpoints verify
with A, the new ones with B, the overlap with each; a verifier holding only B sees the
old entries through the overlap checkpoint (`--accept-earlier-keys`), and old receipts
still verify with A.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.cli.main import main
from gateway.provenance import (
    LogVerificationError,
    SignatureError,
    load_signer,
    load_verifiers,
    make_receipt,
    open_checkpoint,
    verify_log,
    verify_receipt,
    write_signing_key,
)
from tests.helpers.gateways import ADMIN, ADMIN_HEADERS
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess, owngate_argv
from tests.helpers.provenance import run_audit

ORIGIN = "test.owngate/rotated"
REQUEST = json.dumps(
    {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
).encode()  # the bytes each request sends, which `audit open` opens its commitment with


def _serve(gateway: GatewayProcess, requests: int) -> list[bytes]:
    """Start, send `requests` chats, stop (final checkpoint); returns their receipts."""
    gateway.start()
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    receipts = []
    with httpx.Client(base_url=gateway.url, headers=headers) as c:
        for _ in range(requests):
            response = c.post("/v1/chat/completions", content=REQUEST, timeout=10)
            assert response.status_code == 200, response.text
            receipts.append(base64.b64decode(response.headers["x-owngate-receipt"]))
    gateway.stop()
    return receipts


def _reconfigure(gateway: GatewayProcess, **provenance: object) -> None:
    config = yaml.safe_load(gateway.path.read_text())
    config["provenance"] = {"dir": "log", "origin": ORIGIN, **provenance}
    gateway.path.write_text(yaml.safe_dump(config))


def test_rotate_the_signing_key_through_a_gateway(
    process: Callable[..., GatewayProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vkey_a = write_signing_key(tmp_path / "a.key", ORIGIN)
    vkey_b = write_signing_key(tmp_path / "b.key", ORIGIN)
    key_a, key_b = load_verifiers([vkey_a]), load_verifiers([vkey_b])
    gateway = process(provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "a.key"})
    old_receipts = _serve(gateway, 3)
    size_a = max(int(p.name) for p in (tmp_path / "log" / "checkpoints").iterdir())

    _reconfigure(gateway, signing_key_file="b.key", previous_signing_key_files=["a.key"])
    _serve(gateway, 3)
    overlap_end = max(int(p.name) for p in (tmp_path / "log" / "checkpoints").iterdir())
    _reconfigure(gateway, signing_key_file="b.key")
    new_receipts = _serve(gateway, 3)

    logdir = tmp_path / "log"
    summary = verify_log(logdir, key_a + key_b)
    assert summary.size == 18  # 9 requests, dispatch + completion each
    assert len(summary.signed_by) == 2

    history = sorted((int(p.name), p.read_bytes()) for p in (logdir / "checkpoints").iterdir())
    for size, note in history:
        if size <= size_a:  # before the rotation: A only
            open_checkpoint(note, key_a)
            with pytest.raises(SignatureError):
                open_checkpoint(note, key_b)
        elif size <= overlap_end:  # the overlap: each key alone verifies it
            open_checkpoint(note, key_a)
            open_checkpoint(note, key_b)
        else:  # after: B only
            open_checkpoint(note, key_b)
            with pytest.raises(SignatureError):
                open_checkpoint(note, key_a)
    assert any(size_a < size <= overlap_end for size, _ in history), "no overlap checkpoint"

    # Old receipts keep verifying with the old key, new ones with the new key.
    for envelope in old_receipts:
        assert verify_receipt(envelope, key_a).index < size_a
    for envelope in new_receipts:
        verify_receipt(envelope, key_b)

    # A verifier with only B: strict mode refuses the A-only checkpoints by name ...
    with pytest.raises(LogVerificationError, match="no signature by a trusted key"):
        verify_log(logdir, key_b)
    # ... and, told the log rotated, checks their roots and covers their entries with B.
    only_b = verify_log(logdir, key_b, accept_earlier_keys=True)
    assert only_b.size == 18 and only_b.earlier_checkpoints >= 1
    assert run_audit(["verify", str(logdir), "--key", vkey_b, "--accept-earlier-keys"]) == 0
    assert "earlier checkpoint(s) signed by keys not given" in capsys.readouterr().out
    # A verifier with only A can never accept the B-only tail.
    with pytest.raises(LogVerificationError, match="no signature by a trusted key"):
        verify_log(logdir, key_a, accept_earlier_keys=True)


def test_receipts_signed_before_a_rotation_verify_after_it(
    process: Callable[..., GatewayProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the rotation (B alone), a receipt A signed before it still verifies, in the
    admin API (A among `retired_verifier_keys`) as with `owngate audit receipt verify
    --log --key A --key B` and `owngate audit open --receipt --log`; a receipt A signs for
    an entry written after its retirement (whoever kept A) is refused by all three."""
    vkey_a = write_signing_key(tmp_path / "a.key", ORIGIN)
    vkey_b = write_signing_key(tmp_path / "b.key", ORIGIN)
    gateway = process(provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "a.key"})
    old_receipts = _serve(gateway, 2)
    _reconfigure(gateway, signing_key_file="b.key", previous_signing_key_files=["a.key"])
    _serve(gateway, 1)
    _reconfigure(gateway, signing_key_file="b.key")
    new_receipts = _serve(gateway, 2)
    # A, retired, signs what B signed: a receipt of an entry written after the rotation
    late = verify_receipt(new_receipts[-1], load_verifiers([vkey_b]))
    forged = make_receipt(late, load_signer(tmp_path / "a.key"))
    files = {}
    for name, envelope in (("old", old_receipts[0]), ("new", new_receipts[0]), ("late", forged)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_bytes(envelope)

    keys = ["--key", vkey_a, "--key", vkey_b, "--log", str(tmp_path / "log")]
    assert run_audit(["receipt", "verify", str(files["old"]), *keys]) == 0
    assert run_audit(["receipt", "verify", str(files["new"]), *keys]) == 0
    capsys.readouterr()
    assert run_audit(["receipt", "verify", str(files["late"]), *keys]) == 1
    assert "a key retired by a rotation signed it" in capsys.readouterr().err
    # `audit open --receipt --log` applies the same rule before it opens anything
    request = tmp_path / "request.json"
    request.write_bytes(REQUEST)
    assert run_audit(["open", str(request), "--receipt", str(files["old"]), *keys]) == 0
    assert "opens the request commitment" in capsys.readouterr().out
    assert run_audit(["open", str(request), "--receipt", str(files["late"]), *keys]) == 1
    captured = capsys.readouterr()
    assert "a key retired by a rotation signed it" in captured.err
    assert "opens" not in captured.out

    admin_port = free_port()
    config = yaml.safe_load(gateway.path.read_text())
    config["admin"] = {**ADMIN, "listen": {"host": "127.0.0.1", "port": admin_port}}
    gateway.path.write_text(yaml.safe_dump(config))
    _reconfigure(gateway, signing_key_file="b.key", retired_verifier_keys=[vkey_a])
    gateway.start()
    try:
        url = f"http://127.0.0.1:{admin_port}/admin/v1/receipts/verify"

        def verdict(envelope: bytes) -> dict[str, object]:
            body = {"receipt": envelope.decode()}
            answer = httpx.post(url, headers=ADMIN_HEADERS, json=body, timeout=10)
            assert answer.status_code == 200, answer.text
            found: dict[str, object] = answer.json()
            return found

        for envelope in (*old_receipts, *new_receipts):
            assert verdict(envelope)["valid"] is True, verdict(envelope)
        refused = verdict(forged)
        assert refused["valid"] is False, refused
        assert "a key retired by a rotation signed it" in str(refused["problems"])
    finally:
        gateway.stop()


def test_a_rotation_that_renames_the_key_is_refused_before_anything_is_written(
    process: Callable[..., GatewayProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rotation's steps with a new key of another name than the log's: before, the
    gateway signed A+B, then B alone, and `audit verify --key A --key B` failed each
    checkpoint B signed alone (`another log's key signed it`: in a C2SP note the key name
    names the log). Now `serve` refuses each step (exit 3) before the log is touched, and
    `config validate` names the rename."""
    vkey_a = write_signing_key(tmp_path / "a.key", ORIGIN)
    write_signing_key(tmp_path / "b.key", "renamed.example/log")
    gateway = process(provenance={"dir": "log", "origin": ORIGIN, "signing_key_file": "a.key"})
    _serve(gateway, 1)
    logdir = tmp_path / "log"
    before = {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()}
    for step in ({"previous_signing_key_files": ["a.key"]}, {"retired_verifier_keys": [vkey_a]}):
        _reconfigure(gateway, signing_key_file="b.key", **step)
        serve = subprocess.Popen(
            owngate_argv("serve", "--config", gateway.path.name),
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _, err = serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.send_signal(signal.SIGINT)
            serve.communicate(timeout=60)
            raise AssertionError(f"serve started with a renamed key ({step})") from None
        assert serve.returncode == 3, err
        assert b"a key rotation keeps the key's name" in err, err
        assert main(["config", "validate", str(gateway.path)]) == 1
        out = capsys.readouterr()
        assert "a key rotation keeps the key's name" in out.out + out.err
        assert {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()} == before
    assert run_audit(["verify", str(logdir), "--key", vkey_a]) == 0
