"""The body files an auditor names to `owngate audit open` and `owngate audit receipt
verify --request-body/--response-body`, when they are hostile or huge.

Before, each was read whole (`Path.read_bytes`): a FIFO waited for a writer for ever,
`/dev/zero` or a sparse file of gigabytes died of MemoryError, a directory was a bare
"[Errno 21]". Now a body is hashed in chunks as it is read (`audit.body_file`) and one
that is not a regular file is refused as `--key` or `--checkpoint` are (exit 2, "not a
regular file"), in a real `owngate` process whose address space is capped.
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
from pathlib import Path

import pytest

from gateway.provenance import Receipt, Salts, commit, make_receipt
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.formats.commitments import commit_digest
from gateway.provenance.formats.receipts import attach_countersignature
from gateway.provenance.testing import CountingRandom, seeded_signer
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import owngate_argv

LOG = seeded_signer("gw.test/body-files")
SIDECAR = seeded_signer("gpu.test/body-files")
SALTS = Salts.generate(CountingRandom("body-files"))
ADDRESS_SPACE = 1 << 30  # bytes: the audit fits in far less, a body read whole does not
SPARSE = 3 << 29  # 1.5 GiB, sparse: no disk used, but read_bytes() allocates it all
HANG_GUARD_S = 60  # only a hung audit gets near this: it is a failure, not a measure
BIG = 3 << 20  # a real body longer than the tail body_file keeps in memory


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _owngate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        owngate_argv(*args),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=HANG_GUARD_S,
        preexec_fn=_cap_memory,
        check=False,
    )


def _receipt(tmp_path: Path, request: bytes, response: bytes) -> Path:
    """A receipt countersigned by SIDECAR over `request` and `response`."""
    statement = Statement(
        "req-1",
        "2026-01-01T00:00:00.000Z",
        7,
        str(SIDECAR),
        commit("request", SALTS.request, request),
        commit("response", SALTS.response, response),
    )
    envelope = make_receipt(Receipt("req-1", LOG.name, 0, bytes(32), "gpu", "sha256:x", SALTS), LOG)
    path = tmp_path / "receipt.json"
    path.write_bytes(attach_countersignature(envelope, sign_statement(statement, SIDECAR)))
    return path


def _verify(receipt: Path, flag: str, body: Path) -> subprocess.CompletedProcess[str]:
    argv = ("audit", "receipt", "verify", str(receipt), "--key", LOG.vkey)
    return _owngate(*argv, "--backend-key", f"gpu={SIDECAR.vkey}", flag, str(body))


def _open(body: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`audit open BODY` of a response, with `flags` (default: a commitment nothing opens)."""
    flags = flags or ("--form", "exact", "--commitment", "00" * 32)
    argv = ("audit", "open", str(body), "--kind", "response", "--salt", SALTS.response.hex())
    return _owngate(*argv, *flags)


def _hostile(tmp_path: Path, shape: str) -> Path:
    path = tmp_path / f"body-{shape}"
    if shape == "fifo":
        os.mkfifo(path)  # no writer ever comes
    elif shape == "dev-zero":
        path.symlink_to("/dev/zero")
    elif shape == "directory":
        path.mkdir()
    return path


SHAPES = ["fifo", "dev-zero", "directory"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_body_to_open_that_is_no_regular_file_is_refused(tmp_path: Path, shape: str) -> None:
    done = _open(_hostile(tmp_path, shape))
    assert done.returncode == 2, done.stderr
    assert "MemoryError" not in done.stderr and "Traceback" not in done.stderr
    assert "not a regular file" in done.stderr and f"body-{shape}" in done.stderr


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("flag", ["--request-body", "--response-body"])
def test_a_body_to_verify_that_is_no_regular_file_is_refused(
    tmp_path: Path, shape: str, flag: str
) -> None:
    done = _verify(_receipt(tmp_path, b"{}", b"{}"), flag, _hostile(tmp_path, shape))
    assert done.returncode == 2, done.stderr
    assert "MemoryError" not in done.stderr and "Traceback" not in done.stderr
    assert "not a regular file" in done.stderr and f"body-{shape}" in done.stderr


def _sparse(tmp_path: Path) -> Path:
    path = tmp_path / "sparse-body"
    with path.open("wb") as file:
        file.truncate(SPARSE)
    return path


def test_a_sparse_body_of_gigabytes_is_hashed_not_held(tmp_path: Path) -> None:
    done = _open(_sparse(tmp_path))
    assert "MemoryError" not in done.stderr
    assert done.returncode == 1, done.stderr
    assert "FAILED: the body and salt do not open this response commitment" in done.stderr


@pytest.mark.parametrize("flag", ["--request-body", "--response-body"])
def test_a_sparse_body_of_gigabytes_is_verified_within_the_cap(tmp_path: Path, flag: str) -> None:
    # The receipt commits to these very zeroes: the check passes, in 1 GiB of address space.
    body = _sparse(tmp_path)
    zeroes = hashlib.sha256()
    block = bytes(1 << 20)
    for _ in range(SPARSE // len(block)):  # bounded: 1536 blocks
        zeroes.update(block)
    statement_body = commit("request", SALTS.request, b"{}")
    receipt = _receipt_of_digest(tmp_path, flag, zeroes.digest(), statement_body)
    done = _verify(receipt, flag, body)
    assert "MemoryError" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert "ok: the backend countersigned this" in done.stdout


def _receipt_of_digest(tmp_path: Path, flag: str, digest: bytes, other: str) -> Path:
    request = commit_digest("request", SALTS.request, digest) if flag == "--request-body" else other
    response = commit_digest("response", SALTS.response, digest)
    statement = Statement("req-1", "2026-01-01T00:00:00.000Z", 7, str(SIDECAR), request, response)
    envelope = make_receipt(Receipt("req-1", LOG.name, 0, bytes(32), "gpu", "sha256:x", SALTS), LOG)
    path = tmp_path / "receipt.json"
    path.write_bytes(attach_countersignature(envelope, sign_statement(statement, SIDECAR)))
    return path


def test_a_stream_longer_than_the_kept_tail_opens_less_the_gateways_tail(tmp_path: Path) -> None:
    # Its last line alone is longer than the tail kept in memory: the receipt line after
    # it is still found and taken off, and the byte counts are the file's.
    backend = b"data: " + b"x" * BIG + b"\n\n"
    received = backend + b": owngate-receipt QUJD\n\n"
    path = tmp_path / "stream.sse"
    path.write_bytes(received)
    commitment = commit("response", SALTS.response, backend)
    done = _open(path, "--form", "stream", "--commitment", commitment)
    assert done.returncode == 0, done.stderr
    assert f"its first {len(backend)} of {len(received)} bytes" in done.stdout
    assert "its receipt line" in done.stdout


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("which", ["receipt", "proof", "proof --entry"])
def test_a_receipt_or_proof_that_is_no_regular_file_is_refused(
    tmp_path: Path, shape: str, which: str
) -> None:
    # Each was read bounded, but opened as any file: a FIFO waited for a writer for ever.
    hostile = str(_hostile(tmp_path, shape))
    proof = tmp_path / "proof"
    proof.write_bytes(b"not a proof")
    argv = {
        "receipt": ("receipt", "verify", hostile),
        "proof": ("proof", "verify", hostile),
        "proof --entry": ("proof", "verify", str(proof), "--entry", hostile),
    }[which]
    done = _owngate("audit", *argv, "--key", LOG.vkey)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in done.stderr and f"body-{shape}" in done.stderr


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="no /proc")
def test_a_body_that_says_a_size_it_does_not_have_is_no_empty_body() -> None:
    # /proc's files say 0 bytes and hold more. Before, this one opened the commitment to
    # an empty request: "ok: ... all 0 bytes of it", of a file that held hundreds.
    empty = commit("request", SALTS.request, b"")
    argv = ("audit", "open", "/proc/self/status", "--kind", "request")
    done = _owngate(*argv, "--salt", SALTS.request.hex(), "--commitment", empty)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "changed while it was read" in done.stderr and "/proc/self/status" in done.stderr
    assert "ok:" not in done.stdout
