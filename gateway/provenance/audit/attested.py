"""Two-party checks: every answer a log says an attested backend served carries that
backend's countersignature over the same commitments, and the backend's own log agrees.

Run after `verify_log` (the records are then known to be the signed log's). For each
completion record of an answer (status below 400: the gateway always commits to what it
relayed then, so one without a response commitment claims an answer it cannot show)
whose dispatch names a backend given with `backend_keys`, the statement is rebuilt from
the two records (request id, the dispatch's request commitment, the completion's response
commitment, and the attestation's counter, time and key) and its signature checked with that
backend's key: so a gateway that names the wrong backend, changes a commitment, or
copies another request's countersignature is caught, and a counter used twice by one key
is a replay. A completion of an error status (a stream whose client left as its end went
out, 499, or that a drain cut, 503) may carry the countersignature the gateway accepted
for it too: that is a claim about the backend as well, checked the same way, though no
error needs one. `cross_check` then compares the sidecar's own log (`owngate attest --log`,
verified with the same backend key) with those statements, both ways: a statement for a
request the gateway never dispatched to that backend, or for one more often than it
dispatched it there (a client that knows its request id, sending it straight to a
sidecar without mutual TLS), or over a request body it did not dispatch there under that
id (the statement's request commitment is no dispatch's), is traffic that bypassed the
gateway; one for a request it dispatched, over that body, but holds no accepted
countersignature for (the client left before the end, or the gateway refused it and
recorded why) is counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.verify import verify_log
from gateway.provenance.errors import LogVerificationError, MalformedError, SignatureError
from gateway.provenance.formats.attestation import (
    ATTESTATION_PAYLOAD_TYPE,
    Statement,
    one_key_per_backend,
    statement_of_records,
)
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.receipts import pae
from gateway.provenance.formats.records import Record

__all__ = ["AttestedSummary", "check_attestations", "cross_check"]


@dataclass(slots=True)
class AttestedSummary:
    """What the two-party checks found: statements per backend id, and those per key."""

    answers: dict[str, int] = field(default_factory=dict)  # backend id -> countersigned
    # key -> counter -> statement: the counter is unique per key (a counter used twice is a
    # replay), a request id is not (one the log names twice needs two statements)
    statements: dict[str, dict[int, Statement]] = field(default_factory=dict)
    # backend id -> request id -> the request commitment of each dispatch there
    dispatched: dict[str, dict[str, list[str | None]]] = field(default_factory=dict)
    cross_checked: dict[str, int] = field(default_factory=dict)  # backend id -> entries
    # backend id -> statements its sidecar logged for requests the gateway dispatched to it
    # but holds no accepted countersignature for (the client left before the end, or the
    # gateway refused it: its record says which)
    unaccepted: dict[str, int] = field(default_factory=dict)
    # private backend id -> answers, for the backends given no key: the gateway's word
    # alone (an id mistyped in --backend-key, or a backend the log names otherwise)
    unkeyed: dict[str, int] = field(default_factory=dict)
    # the other replicas' logs checked with this one: (origin, entries) of each
    replicas: list[tuple[str, int]] = field(default_factory=list)


def _fail(reason: str, index: int | None = None) -> LogVerificationError:
    return LogVerificationError(reason if index is None else f"entry {index}: {reason}")


def check_attestations(
    directory: str | Path,
    size: int,
    backend_keys: Mapping[str, Verifier],
    summary: AttestedSummary | None = None,
    *,
    root: bytes,
) -> AttestedSummary:
    """Check the attestations of a log `verify_log` found of `size` entries with `root`;
    raises LogVerificationError naming the first record that fails (or when the records
    read here no longer hash to `root`: `LogDirectory.verified_records`), ValueError when
    two backends are given one key.

    `summary`: what the logs of the other replicas of the same gateway already showed
    (one log per replica, the same sidecars behind them all): this log's statements are
    added to it, so a counter one replica's log already holds is a replay here too, and
    `cross_check` then compares a sidecar's log with all of them at once."""
    one_key_per_backend(backend_keys)
    if summary is None:
        summary = AttestedSummary({backend: 0 for backend in backend_keys})
        summary.dispatched = {backend: {} for backend in backend_keys}
    # (key, counter) -> the request id of the statement that used it, in every log so far
    counters = {
        (key, counter): statement.request_id
        for key, statements in summary.statements.items()
        for counter, statement in statements.items()
    }
    records = LogDirectory(directory).verified_records(size, root)
    for index, dispatch, completion in _completions(records, summary):
        backend = dispatch.data["backend"]["id"]
        answer = completion.data["status"] < 400
        verifier = backend_keys.get(backend)
        if verifier is None:
            if answer and dispatch.data["backend"]["tier"] == "private":
                summary.unkeyed[backend] = summary.unkeyed.get(backend, 0) + 1
            continue
        who = f"request {completion.request_id!r} (backend {backend})"
        try:
            rebuilt = statement_of_records(dispatch.data, completion.data)
        except MalformedError as exc:
            raise _fail(f"{who}: its attestation is malformed: {exc}", index) from exc
        if rebuilt is None and not answer:
            continue  # an error the backend did not countersign: no claim about it
        if rebuilt is None:
            given = completion.data.get("attestation")
            why = "none" if given is None else f"the gateway recorded failure {given['failure']}"
            raise _fail(
                f"{who}: the log says backend {backend} served it, but the record carries no "
                f"countersignature by {verifier} ({why}): not a two-party statement",
                index,
            )
        statement, signature = rebuilt
        if statement.key != str(verifier):
            raise _fail(
                f"{who}: countersigned by key {statement.key}, not by backend {backend}'s key "
                f"{verifier}: the record names a backend other than the one that signed",
                index,
            )
        try:
            verifier.verify(pae(ATTESTATION_PAYLOAD_TYPE, statement.payload()), signature)
        except SignatureError as exc:
            raise _fail(
                f"{who}: backend {backend}'s countersignature does not verify over the "
                "request id and commitments this log records (the request or response was "
                "changed after it was signed, or it was signed for another request)",
                index,
            ) from exc
        earlier = counters.get((statement.key, statement.counter))
        if earlier is not None:
            raise _fail(
                f"{who}: counter {statement.counter} of key {statement.key} was already used "
                f"for request {earlier!r}: a replayed countersignature",
                index,
            )
        counters[(statement.key, statement.counter)] = statement.request_id
        if answer:
            summary.answers[backend] += 1
        summary.statements.setdefault(statement.key, {})[statement.counter] = statement
    return summary


def _completions(
    records: Iterable[tuple[int, Record]], summary: AttestedSummary
) -> Iterator[tuple[int, Record, Record]]:
    """(index, dispatch, completion) of every completed dispatch of `records` (a log's,
    in order); notes every request dispatched to a backend of `summary`."""
    dispatches: dict[int, Record] = {}
    for index, record in records:
        if record.type == "dispatch":
            dispatches[index] = record
            sent = summary.dispatched.get(record.data["backend"]["id"])
            if sent is not None:
                sent.setdefault(record.request_id, []).append(record.data["request_commitment"])
        elif record.type == "completion":
            dispatch = dispatches.pop(record.data["dispatch"]["index"], None)
            if dispatch is not None:
                yield index, dispatch, record


def cross_check(
    summary: AttestedSummary,
    sidecar_log: str | Path,
    backend: str,
    verifier: Verifier,
    *,
    origin: str | None = None,
    trusted_checkpoints: Iterable[bytes] = (),
) -> int:
    """Verify a sidecar's log (signed by `verifier`, the key of `backend`) and compare its
    statements with the gateway log's: every request one has, the other has, with the
    same statement, each answer on its own (statements are matched by the key's counter,
    so a request id the gateway's log names twice needs two). Returns the number of
    statements compared.

    `trusted_checkpoints`: checkpoints of the sidecar's log seen before (by the auditor, a
    witness, a monitor); the log must still hold each (`verify_log`), which catches a
    rollback of its tail. Without one, statements after the last one the gateway's log
    carries can be cut from the sidecar's log unseen: nothing else binds them."""
    try:
        checked = verify_log(
            sidecar_log, [verifier], origin=origin, trusted_checkpoints=trusted_checkpoints
        )
    except LogVerificationError as exc:
        raise _fail(f"the sidecar log of backend {backend}: {exc}") from exc
    claimed = dict(summary.statements.get(str(verifier), {}))
    dispatched = summary.dispatched.get(backend, {})
    # the dispatches of each request id not yet met by a statement (their commitments)
    left = {request_id: list(sent) for request_id, sent in dispatched.items()}
    unaccepted = 0
    last = -1
    for index, record in LogDirectory(sidecar_log).verified_records(checked.size, checked.root):
        where = f"the sidecar log of backend {backend} ({checked.origin})"
        if record.type != "attestation":
            raise _fail(f"{where} holds a {record.type} record, not a statement", index)
        logged = Statement.from_record(record.data)
        if logged.key != str(verifier) or logged.counter <= last:
            raise _fail(
                f"{where}: statement of request {logged.request_id!r} has key {logged.key} and "
                f"counter {logged.counter} (after {last}): not this key's increasing counter",
                index,
            )
        last = logged.counter
        pending = left.get(logged.request_id, [])
        if logged.request_commitment not in pending:
            sent = len(dispatched.get(logged.request_id, ()))
            how = (
                f"over a request body the gateway's log never dispatched to backend {backend} "
                f"under that id ({sent} dispatch(es) there, none left with that commitment)"
                if pending
                else f"more often than the gateway's log dispatched it to backend {backend} "
                f"({sent})"
                if sent
                else f"which the gateway's log never dispatched to backend {backend}"
            )
            raise _fail(
                f"{where}: the sidecar countersigned request {logged.request_id!r} (counter "
                f"{logged.counter}) {how}: a request that did not come through this gateway",
                index,
            )
        pending.remove(logged.request_commitment)
        ours = claimed.pop(logged.counter, None)
        if ours is None:
            unaccepted += 1  # sent through the gateway, which recorded why it has none
            continue
        if ours != logged:
            raise _fail(
                f"{where}: its statement of request {logged.request_id!r} (counter "
                f"{logged.counter}) differs from the one the gateway's record carries",
                index,
            )
    if claimed:
        statement = claimed[min(claimed)]
        raise _fail(
            f"the gateway's log records request {statement.request_id!r} as countersigned "
            f"by backend {backend} (counter {statement.counter}), but the sidecar's log "
            f"({checked.origin}, {checked.size} signed entries) has no such statement: an "
            f"entry is missing from the sidecar's log ({len(claimed)} in all)"
        )
    summary.cross_checked[backend] = checked.size
    summary.unaccepted[backend] = unaccepted
    return checked.size
