"""The installed `owngate audit` writes no terminal control byte of an artefact's to its
output: a forged receipt (`proof verify --receipt`, the known case) and a log whose free
-form fields carry ESC sequences, bidi overrides and line breaks, checked as bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

from gateway.provenance import ProvenanceLog, make_receipt
from gateway.provenance.formats.records import BackendRef, Retention
from gateway.provenance.testing import log_request, seeded_signer

ORIGIN = "gateway.example/log/terminal"
SIGNER = seeded_signer(ORIGIN)
# ESC, CR, C1 CSI (UTF-8 C2 9B), U+202E (E2 80 AE), U+2028 (E2 80 A8)
CONTROL_BYTES = [b"\x1b", b"\r", b"\xc2\x9b", b"\xe2\x80\xae", b"\xe2\x80\xa8"]


def _audit(*argv: str) -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "owngate"
    return subprocess.run([str(script), "audit", *argv], capture_output=True, timeout=120)


def _clean(done: subprocess.CompletedProcess[bytes]) -> None:
    for output in (done.stdout, done.stderr):
        for byte in CONTROL_BYTES:
            assert byte not in output, (byte, output)
        assert not any(line.startswith(b"ok: forged") for line in output.splitlines())


def test_the_installed_cli_prints_no_control_byte_of_an_artefact(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    evil = BackendRef(
        "gpu\x1b[2K\rok: forged",
        "private",
        "vllm",
        "own",
        "own",
        "eu\u202e\u2028\x9b",
        Retention(0, True, False),
    )

    async def build() -> None:
        log = await ProvenanceLog.open(log_dir, ORIGIN, SIGNER)
        first = await log_request(log, 0)
        forged = dataclasses.replace(first.receipt, request_id="req-0\x1b[2K\rok: forged")
        (tmp_path / "forged.json").write_bytes(make_receipt(forged, SIGNER))
        await log_request(log, 1, backend=evil)
        await log.close()

    asyncio.run(build())
    receipt = str(tmp_path / "forged.json")
    done = _audit("proof", "verify", "none", "--key", SIGNER.vkey, "--receipt", receipt)
    assert done.returncode == 1 and done.stderr.startswith(b"FAILED: receipt request_id")
    _clean(done)
    done = _audit("receipt", "verify", receipt, "--key", SIGNER.vkey)
    assert done.returncode == 1
    _clean(done)
    done = _audit("show", str(log_dir))
    assert done.returncode == 0 and b"gpu\\x1b[2K\\x0dok: forged" in done.stdout
    _clean(done)
    done = _audit("verify", str(log_dir), "--key", SIGNER.vkey)
    assert done.returncode == 0
    _clean(done)
