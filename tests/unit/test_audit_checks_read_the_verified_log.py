"""`audit verify --backend-pin` and `--backend-key` read the log's records again after
`verify_log` verified it: what they read must be what was verified. The log directory is
the audited operator's, who may swap an entry bundle between the two readings; the checks
then judged records no signature covers (a dispatch over plain HTTP read as one over a
pinned key, an answer of an attested backend read as another backend's). Now the records
read again must hash to the verified root, else the audit fails, as `audit report`'s
second reading does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.canonical import canonical_json
from gateway.provenance import LogVerificationError, verify_log
from gateway.provenance.audit.attested import check_attestations
from gateway.provenance.audit.pinned import check_pins
from gateway.provenance.audit.verify import LogSummary
from gateway.provenance.formats.tiles import decode_bundle, encode_bundle, entries_path
from gateway.provenance.testing import EXAMPLE_BACKEND, seeded_signer, write_requests

ORIGIN = "gateway.example/log/reread"
SIGNER = seeded_signer(ORIGIN)
SIDECAR = seeded_signer("gpu.example/attest")
PIN = "sha256//" + "A" * 43 + "="
BACKEND = EXAMPLE_BACKEND.id  # every request of the log is dispatched to it, over plain HTTP


def _logged(path: Path) -> LogSummary:
    """A log of 3 requests to BACKEND, none over TLS, none countersigned; verified."""

    write_requests(path, ORIGIN, SIGNER, 3)
    return verify_log(path, [SIGNER.verifier()])


def _swap_dispatches(path: Path, size: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the entry bundle with every dispatch record changed by `change`, as the
    operator could between the audit's two readings (the tiles and checkpoints kept)."""
    bundle = path / entries_path(0, size)
    entries = decode_bundle(bundle.read_bytes())
    swapped = []
    for entry in entries:
        record = orjson.loads(entry)
        if record["type"] == "dispatch":
            change(record)
        swapped.append(canonical_json(record))
    bundle.write_bytes(encode_bundle(swapped))


def _over_the_pinned_key(record: dict[str, Any]) -> None:
    record["backend"]["peer"] = {"spki_sha256": PIN, "attested": False}


def _to_another_backend(record: dict[str, Any]) -> None:
    record["backend"]["id"] = "gpu-elsewhere-1"


def test_a_pin_check_reads_only_the_records_that_were_verified(tmp_path: Path) -> None:
    verified = _logged(tmp_path / "log")
    pins = {BACKEND: frozenset({PIN})}
    with pytest.raises(LogVerificationError, match=r"carries no backend\.peer"):
        check_pins(tmp_path / "log", verified.size, pins, root=verified.root)
    _swap_dispatches(tmp_path / "log", verified.size, _over_the_pinned_key)
    with pytest.raises(LogVerificationError, match="changed since it was verified"):
        check_pins(tmp_path / "log", verified.size, pins, root=verified.root)


def test_a_countersignature_check_reads_only_the_records_that_were_verified(
    tmp_path: Path,
) -> None:
    verified = _logged(tmp_path / "log")
    keys = {BACKEND: SIDECAR.verifier()}
    with pytest.raises(LogVerificationError, match="carries no countersignature"):
        check_attestations(tmp_path / "log", verified.size, keys, root=verified.root)
    _swap_dispatches(tmp_path / "log", verified.size, _to_another_backend)
    with pytest.raises(LogVerificationError, match="changed since it was verified"):
        check_attestations(tmp_path / "log", verified.size, keys, root=verified.root)


def test_the_verified_log_itself_passes_its_checks_again(tmp_path: Path) -> None:
    """The checks of a log that did not change are not disturbed by the second reading."""
    verified = _logged(tmp_path / "log")
    summary = check_pins(
        tmp_path / "log", verified.size, {"other": frozenset({PIN})}, root=verified.root
    )
    assert summary.dispatches == {"other": 0}
    found = check_attestations(
        tmp_path / "log", verified.size, {"other": SIDECAR.verifier()}, root=verified.root
    )
    assert found.unkeyed == {BACKEND: 3}
