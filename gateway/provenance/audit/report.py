"""What `owngate audit report` shows, as numbers: a verified log folded into figures.

`audit_report` runs the same `verify_log` as `owngate audit verify`; only when the log
verifies does it read the entries again (checking that they still hash to the verified
root) and count them. A log that fails gets a report that holds the failure and no
figures. The result is a plain JSON-ready dict of a documented, stable shape (format
`REPORT_FORMAT`, docs/provenance.md "Auditor report"); `report_html` draws it. The
entries are read in one pass: memory grows with the request ids (to count each request
once) and the buckets, not with the records.

The figures and their definitions: gateway/provenance/audit/figures.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gateway.provenance.audit.figures import (
    BUCKET_SECONDS,
    Cosignatures,
    Invocation,
    bucket_seconds,
    figures,
    iso_time,
    record_seconds,
)
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.verify import LogSummary, verify_log
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.cosignature import CosignatureVerifier, find_cosignature
from gateway.provenance.formats.layout import list_cosigned, read_log_file
from gateway.provenance.formats.merkle import CompactRange, leaf_hash
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.records import Record, parse_record
from gateway.provenance.formats.tiles import TILE_WIDTH

__all__ = ["REPORT_FORMAT", "Invocation", "audit_report", "bucket_seconds", "verification_json"]

REPORT_FORMAT = "owngate-audit-report/1"


def _verified_cosignatures(
    log: LogDirectory, witnesses: Sequence[CosignatureVerifier], now: float
) -> Cosignatures:
    """`cosigned/`, with every cosignature by the `witnesses` that `verify_log` accepted."""
    files = list_cosigned(log.path)
    found: list[tuple[int, str, int]] = []
    for size, path in files:
        data = read_log_file(path)
        for witness in witnesses:
            cosignature = find_cosignature(data, witness, now=now)
            if cosignature is not None:
                found.append((size, str(witness), cosignature.timestamp))
    return Cosignatures(len(files), bool(witnesses), tuple(found))


_CHANGED = "the log changed while the report read it ({}): run the report on a copy"


def _verified_figures(
    log: LogDirectory,
    summary: LogSummary,
    cosigned: Cosignatures,
    run: Invocation,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures of the entries `verify_log` checked, read again in one pass: they must
    still hash to the verified root, and begin and end at the times the buckets were
    chosen from (the first and the last entry's)."""
    ends: list[int] = []
    if summary.size:
        last = summary.size - 1
        for index in (0, last):
            entry = log.bundle(index // TILE_WIDTH, summary.size)[index % TILE_WIDTH]
            ends.append(record_seconds(parse_record(entry).time))
    width = bucket_seconds(min(ends), max(ends)) if ends else BUCKET_SECONDS[0]
    tree = CompactRange()

    def hashed() -> Iterator[tuple[int, Record]]:
        for index, entry in log.entries(summary.size):
            tree.append(leaf_hash(entry))
            yield index, parse_record(entry)

    sizes = [size for size, _ in log.history()]
    totals, found = figures(hashed(), width, sizes, cosigned, run)
    if tree.root() != summary.root:
        raise LogVerificationError(_CHANGED.format("its entries no longer hash to the root"))
    read = [record_seconds(totals[name]) for name in ("first_time", "last_time") if totals[name]]
    if read != ends:
        raise LogVerificationError(_CHANGED.format("its first or last entry changed"))
    return totals, found


def verification_json(summary: LogSummary) -> dict[str, Any]:
    """The verification result, as `owngate audit verify --json` prints it."""
    result: dict[str, Any] = {
        "origin": summary.origin,
        "size": summary.size,
        "root": summary.root.hex(),
        "checkpoints": summary.checkpoints,
        "signed_by": list(summary.signed_by),
        "earlier_checkpoints": summary.earlier_checkpoints,
        "unsigned_entries": summary.unsigned_entries,
        "open_dispatches": summary.open_dispatches,
    }
    witnessed = summary.witnesses
    if witnessed is not None:
        result["witnesses"] = {
            "cosigned_checkpoints": witnessed.cosigned,
            "witnessed_size": witnessed.witnessed_size,
            "min_witnesses": witnessed.min_witnesses,
            "newest_by": witnessed.newest_by,
        }
    return result


def audit_report(
    directory: str | Path,
    verifiers: Sequence[Verifier],
    run: Invocation,
    *,
    origin: str | None = None,
    trusted_checkpoints: Iterable[bytes] = (),
    witnesses: Sequence[CosignatureVerifier] = (),
    min_witnesses: int = 1,
    accept_earlier_keys: bool = False,
    now: float,
) -> dict[str, Any]:
    """The report of a log directory: `verify_log` (same arguments), then its figures.

    `now` (POSIX seconds) is the verifier's clock (cosignatures from the future are
    refused) and the report's date. Never raises for a log that fails verification: the
    report then has `verification.ok` false, the reason and no totals or figures.
    """
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "generated_at": iso_time(int(now)),
        "log": run.logdir,
        "verification": {
            "ok": False,
            "error": None,
            "index": None,
            "command": run.verify(),
            "summary": None,
        },
        "totals": None,
        "figures": {},
    }
    verification = report["verification"]
    try:
        summary = verify_log(
            directory,
            verifiers,
            origin=origin,
            trusted_checkpoints=trusted_checkpoints,
            witnesses=witnesses,
            min_witnesses=min_witnesses,
            now=now,
            accept_earlier_keys=accept_earlier_keys,
        )
        log = LogDirectory(directory)
        cosigned = _verified_cosignatures(log, witnesses, now)
        totals, found = _verified_figures(log, summary, cosigned, run)
    except LogVerificationError as exc:
        verification["error"], verification["index"] = str(exc), exc.index
        return report
    except (MalformedError, SignatureError) as exc:  # a file changed after verify_log
        verification["error"] = _CHANGED.format(exc)
        return report
    verification.update(ok=True, summary=verification_json(summary))
    report["totals"], report["figures"] = totals, found
    return report
