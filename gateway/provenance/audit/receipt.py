"""Checking a receipt against a log: that the log holds the record it names, under a
signed checkpoint (what `owngate audit receipt verify --log` and the admin API's
`POST /admin/v1/receipts/verify` both do).

The receipt's own signature is `formats.receipts.verify_receipt`; this module takes the
receipt it returned and the log directory, and raises a `ProvenanceError` naming what
does not hold: the checkpoint's signature or origin, an entry the checkpoint does not
cover yet (or no longer: a rollback), an entry that is not the receipt's record (or
says another request, backend or policy than the receipt), a proof that does not reach
the checkpoint's root. `receipt_commitment` gives the commitment a receipt's salt opens,
from records so proved, and whether the answer was countersigned (`owngate audit open
--receipt`), `check_stream_end` that an error event taken off a stream to open it is the
gateway's, on a stream its record says broke off; `check_countersignature_in_log`
that the backend's countersignature a receipt carries is the one the log recorded for
its answer, `uncountersigned_error` that a receipt of an attested backend carrying none
is of an error answer, which no backend countersigns; each judges the one completion of
the receipt's dispatch, and fails on a log holding two. `read_receipt` reads a receipt
file within verify_receipt's cap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ErrorCode
from gateway.provenance.audit.pinned import sent_nothing
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import LogVerificationError, SignatureError
from gateway.provenance.formats.attestation import Statement, statement_of_records
from gateway.provenance.formats.checkpoint import open_checkpoint
from gateway.provenance.formats.merkle import inclusion_proof, leaf_hash, verify_inclusion
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.receipts import MAX_RECEIPT_BYTES, Receipt
from gateway.provenance.formats.records import Record, parse_record
from gateway.provenance.formats.stream_body import gateway_error_problem, stripped_error_event
from gateway.provenance.formats.tiles import TILE_WIDTH, TileReader
from gateway.small_files import read_file_head

__all__ = [
    "LoggedCommitment",
    "ReceiptInclusion",
    "check_claims",
    "check_countersignature_in_log",
    "check_receipt_in_log",
    "check_stream_end",
    "completion_that_sent_nothing",
    "read_receipt",
    "receipt_commitment",
    "uncountersigned_error",
]


@dataclass(frozen=True, slots=True)
class ReceiptInclusion:
    """The receipt's record, proved in the checkpoint of `size` entries with `root`."""

    size: int
    root: bytes
    entry: bytes  # the record the receipt names, as the log holds it


def read_receipt(path: str | Path) -> bytes:
    """A receipt file (a client's), read no further than `verify_receipt` takes: one byte
    past MAX_RECEIPT_BYTES, which it refuses unparsed. A FIFO, device or directory is an
    OSError ("not a regular file"): a FIFO waited for a writer for ever."""
    return read_file_head(Path(path), MAX_RECEIPT_BYTES + 1)


def check_receipt_in_log(
    log: LogDirectory, receipt: Receipt, verifiers: Iterable[Verifier]
) -> ReceiptInclusion:
    """Check that `log`'s latest checkpoint, signed by one of `verifiers` for the
    receipt's log, covers the receipt's entry, and that the entry is its record."""
    signed = open_checkpoint(log.latest_note(), verifiers, origin=receipt.log)
    size = signed.checkpoint.size
    if receipt.index >= size:
        raise LogVerificationError(
            f"the log's signed checkpoint covers {size} entries; the receipt's entry "
            f"{receipt.index} is missing (rollback or not yet checkpointed)"
        )
    entry = log.bundle(receipt.index // TILE_WIDTH, size)[receipt.index % TILE_WIDTH]
    if leaf_hash(entry) != receipt.dispatch_hash:
        raise LogVerificationError(
            f"entry {receipt.index} of the log is not the record the receipt names"
        )
    check_claims(parse_record(entry), receipt)
    _prove(log, receipt.index, receipt.dispatch_hash, size, signed.checkpoint.root)
    return ReceiptInclusion(size, signed.checkpoint.root, entry)


@dataclass(frozen=True, slots=True)
class LoggedCommitment:
    """A commitment the log holds for a receipt's request, proved in its checkpoint."""

    commitment: str
    # A response the completion record says the backend countersigned: a whole answer,
    # which opens only with the bytes received less the gateway's receipt line
    # (`formats.stream_body.countersigned_body`), never in the forms of a broken stream.
    countersigned: bool = False
    # A response's completion record: its index and status (`check_stream_end`).
    completion: int | None = None
    status: int | None = None


def check_stream_end(logged: LoggedCommitment | None, received: bytes, opened: bytes) -> None:
    """A stream's response commitment opened with `opened`, one of
    `committed_bodies(received)`. The gateway's error event, which the commitment does not
    cover, may have been taken off to reach it only where the gateway writes one: the
    OpenAI error object alone, on a stream its completion says broke off (a status of 400
    or more), of a code of the gateway's whose status is the completion's
    (`upstream_error` on a 502). Else the client received what the signed log does not
    say: an error on a stream it says ended, another failure than the one it says (a
    `rate_limit_exceeded` on a 502), or an event of the gateway's own (content an SDK
    reads) that no commitment covers. `logged` None (a commitment given without its
    receipt and log): no completion to hold the event to, so none is taken off."""
    data = stripped_error_event(received, opened)
    if data is None:
        return
    problem = gateway_error_problem(data)
    if problem is not None:
        raise LogVerificationError(
            f"the stream as received ends in an event shaped as the gateway's error event, "
            f"but {problem}: it is not the gateway's error event, and the response "
            "commitment does not cover it"
        )
    if logged is None:
        raise LogVerificationError(
            "the commitment opens only with the stream's last event (an OpenAI error object) "
            "taken off as the gateway's error event, which the commitment does not cover; "
            "whether it is the gateway's (written only on a stream its completion record "
            "says broke off, with a code of that status) only that record tells: open it "
            "with --receipt RECEIPT --log LOGDIR --key VKEY instead of --salt/--commitment"
        )
    if logged.status is None or logged.status < 400:
        raise LogVerificationError(
            f"the stream as received ends in the gateway's error event, but entry "
            f"{logged.completion}, its completion, says status {logged.status}: a stream "
            "that did not break off, which the gateway ends with no error event"
        )
    code = json.loads(data)["error"]["code"]  # gateway_error_problem: a str
    status = _CODE_STATUS.get(code)
    if status != logged.status:
        said = "a code the gateway has not" if status is None else f"code {code} ({status})"
        raise LogVerificationError(
            f"the stream as received ends in an error event of {said}, but entry "
            f"{logged.completion}, its completion, says status {logged.status}: the "
            "client was told of another failure than the log says"
        )


# The status each of the gateway's error codes goes with (`gateway.errors`): its error
# event says the code, the completion record the status.
_CODE_STATUS = {code.value: code.status for code in ErrorCode}


def receipt_commitment(
    log: LogDirectory, receipt: Receipt, kind: str, verifiers: Iterable[Verifier]
) -> LoggedCommitment:
    """The commitment the receipt's salt of `kind` ("request" or "response") opens: the
    request commitment of the record the receipt names, or the response commitment of
    the completion record linking to it (and whether that completion accepted the
    backend's countersignature), each proved in the latest signed checkpoint."""
    proved = check_receipt_in_log(log, receipt, verifiers)
    dispatch = parse_record(proved.entry)
    if kind == "request":
        found = dispatch.data.get("request_commitment")
        if not isinstance(found, str):
            raise LogVerificationError(f"entry {receipt.index} holds no request commitment")
        return LoggedCommitment(found)
    completion = _completion(log, receipt, proved)
    found = None if completion is None else completion[1].data.get("response_commitment")
    if completion is not None and found:
        index, record = completion
        countersigned = statement_of_records(dispatch.data, record.data) is not None
        return LoggedCommitment(str(found), countersigned, index, record.data["status"])
    raise LogVerificationError(
        f"the log holds no response commitment for entry {receipt.index} of request "
        f"{receipt.request_id!r} (a completion with one, linking to it)"
    )


def check_countersignature_in_log(
    log: LogDirectory, receipt: Receipt, statement: Statement, proved: ReceiptInclusion
) -> int:
    """The index of the completion record, proved in the same checkpoint, that accepted
    exactly `statement` (the backend's countersignature the receipt carries, already
    verified) for the receipt's dispatch: the request commitment is the dispatch's, the
    response commitment the completion's (the one `audit open --receipt` opens with the
    client's bytes), and the counter, time and key the ones the log recorded. The
    countersignature travels beside the log's signature in a receipt, unsigned by the
    log, so without this a receipt could carry a statement about another answer."""
    dispatch = parse_record(proved.entry)
    if dispatch.data.get("request_commitment") != statement.request_commitment:
        raise LogVerificationError(
            f"the countersigned request commitment differs from entry {receipt.index}'s"
        )
    completion = _completion(log, receipt, proved)
    if completion is not None:
        index, record = completion
        logged = statement_of_records(dispatch.data, record.data)
        if logged is not None and logged[0] == statement:
            return index
    if completion is None:
        raise LogVerificationError(
            f"the log's checkpoint of size {proved.size} holds no completion of entry "
            f"{receipt.index} yet, so the countersignature cannot be checked against it "
            "(the completion is written after the answer: verify again after the next "
            "checkpoint)"
        )
    raise LogVerificationError(
        f"the log holds no completion of entry {receipt.index} that accepted the receipt's "
        f"countersignature (counter {statement.counter}): the log says the backend "
        "countersigned another answer, or none"
    )


def uncountersigned_error(
    log: LogDirectory, receipt: Receipt, proved: ReceiptInclusion
) -> tuple[int, int]:
    """The index and status of the completion of the receipt's dispatch, proved in the
    same checkpoint, for a receipt of an attested backend that carries no
    countersignature: only answers below 400 are countersigned, so one of an error status
    that accepted none needs none (as `audit verify --backend-key` holds it). Raise
    otherwise: an answer below 400, or one whose countersignature the log accepted and
    the receipt lacks, or no completion yet."""
    dispatch = parse_record(proved.entry)
    completion = _completion(log, receipt, proved)
    if completion is not None:
        index, record = completion
        status = record.data["status"]
        if status < 400 or statement_of_records(dispatch.data, record.data) is not None:
            raise SignatureError(
                f"backend {receipt.backend} is attested, but the receipt carries no "
                f"countersignature (entry {index}, its completion, says status {status}"
                + (")" if status < 400 else " and holds an accepted one)")
            )
        return index, status
    raise LogVerificationError(
        f"backend {receipt.backend} is attested, but the receipt carries no countersignature, "
        f"and the log's checkpoint of size {proved.size} holds no completion of entry "
        f"{receipt.index} yet to say the answer was an error (verify again after the next "
        "checkpoint)"
    )


def completion_that_sent_nothing(
    log: LogDirectory, receipt: Receipt, proved: ReceiptInclusion, backend: str
) -> int | None:
    """The index of the completion of the receipt's dispatch, proved in the same
    checkpoint, when it says the attempt on `backend` sent nothing (its connection or its
    certificate refused: `sent_nothing`), else None. Such a dispatch names no key, and is
    no request sent over plain HTTP (`owngate audit receipt verify --backend-pin`)."""
    completion = _completion(log, receipt, proved)
    if completion is None or not sent_nothing(completion[1].data, backend):
        return None
    return completion[0]


def _completion(
    log: LogDirectory, receipt: Receipt, proved: ReceiptInclusion
) -> tuple[int, Record] | None:
    """The completion of the receipt's dispatch in the checkpoint `proved` reached, proved
    there from the bytes it was parsed from; None when there is none yet. A dispatch has
    one completion (`audit.links`, as `verify_log` holds it): a second fails, else a check
    took whichever suited it (an error status needing no countersignature before the
    countersigned answer)."""
    link = {"index": receipt.index, "hash": receipt.dispatch_hash.hex()}
    found: tuple[int, bytes, Record] | None = None
    for index, entry, record in log.find_request_entries(receipt.request_id, proved.size):
        if record.type != "completion" or record.data["dispatch"]["index"] != receipt.index:
            continue
        if found is not None:
            raise LogVerificationError(
                f"entries {found[0]} and {index} both complete entry {receipt.index}, the "
                "receipt's dispatch: a dispatch has one completion (audit verify refuses "
                "this log)"
            )
        if record.data["dispatch"] != link:
            raise LogVerificationError(
                f"entry {index} completes entry {receipt.index}, the receipt's dispatch, "
                "with another hash than its record's"
            )
        found = (index, entry, record)
    if found is None:
        return None
    index, entry, record = found
    _prove(log, index, leaf_hash(entry), proved.size, proved.root)  # the bytes judged
    return index, record


def _prove(log: LogDirectory, index: int, leaf: bytes, size: int, root: bytes) -> None:
    """Raise unless the leaf at `index` is in the tree (`size`, `root`), by the log's tiles."""
    proof = inclusion_proof(index, size, TileReader(log.path, size).node)
    verify_inclusion(leaf, index, size, proof, root)


def check_claims(record: Record, receipt: Receipt) -> None:
    """The receipt's claims are its record's: the request, a dispatch to its backend (a
    refusal when the receipt names none) and the policy digest. The log signs both, so a
    gateway could sign a receipt whose `dispatch_hash` names one record and whose claims
    say another's (`receipt verify --log` and `proof verify --receipt` both check)."""
    kind = "refusal" if receipt.backend == "" else "dispatch"
    found = {
        "request": (record.request_id, receipt.request_id),
        "record type": (record.type, kind),
        "backend": (
            record.data["backend"]["id"] if record.type == "dispatch" else "",
            receipt.backend,
        ),
        "policy digest": (record.data.get("policy", {}).get("digest"), receipt.policy_digest),
    }
    for what, (logged, claimed) in found.items():
        if logged != claimed:
            raise LogVerificationError(
                f"entry {receipt.index} is the receipt's record, but its {what} is "
                f"{logged!r}, not the receipt's {claimed!r}"
            )
