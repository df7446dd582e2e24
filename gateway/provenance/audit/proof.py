"""Checking a C2SP tlog-proof file (`owngate audit proof verify`): that one entry is in a
checkpoint signed by a trusted log key, and, with witness keys, that enough witnesses
cosigned that checkpoint.

The entry is the one given (its bytes, or its leaf hash from a receipt), else the proof's
`extra` line: the spec leaves extra data unauthenticated, and it proves something only
because its leaf hash must lead to the signed root. When both are there they must agree.
The witness rule is `verify_log`'s (`check_witness_policy`, `cosigners`): every line by a
given witness must verify, and at least `min_witnesses` of them must have cosigned.

A proof is one checkpoint: it cannot show that the log never forked or rolled back since,
nor whether the key that signed it had been retired by a rotation (that takes the log's
history: `verify_log`). Give only the keys you trust now.

With a receipt, the record the proof carries (or the entry given) must also say what the
receipt says (`audit.receipt.check_claims`, as `receipt verify --log` holds it): the log
signs both, and a receipt whose `dispatch_hash` named one request's record while it
claimed another request, backend or policy passed here as proved. A proof without the
record (no extra line, no entry) proves only the hash: `ProvedEntry.claims_checked` says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.provenance.audit.cosigned import check_witness_policy, cosigners
from gateway.provenance.audit.receipt import check_claims
from gateway.provenance.errors import MalformedError, ProofError, RecordError, SignatureError
from gateway.provenance.formats.checkpoint import Checkpoint, open_checkpoint
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.merkle import leaf_hash, verify_inclusion
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.proofs import TlogProof
from gateway.provenance.formats.receipt_payload import Receipt
from gateway.provenance.formats.record_parser import parse_record

__all__ = ["MAX_PROOF_BYTES", "ProvedEntry", "check_tlog_proof"]

#: an entry (at most 64 KiB, base64) and a checkpoint with at most 100 signature lines fit
MAX_PROOF_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ProvedEntry:
    """What a proof showed: entry `index` (leaf hash `leaf`) in `checkpoint`."""

    index: int
    leaf: bytes
    entry: bytes | None  # the entry's bytes, when given or carried as the extra line
    from_extra: bool  # the entry came from the proof's own extra line
    checkpoint: Checkpoint
    signed_by: tuple[str, ...]  # trusted log keys whose signature verified
    cosigned_by: tuple[str, ...]  # witnesses whose cosignature verified
    # a receipt was given and the record it names was at hand: its claims are the record's
    claims_checked: bool = False


def _check_record(entry: bytes, index: int, receipt: Receipt | None) -> None:
    """An entry that is JSON is read as a provenance record, so it must be one: schema v1
    in its own RFC 8785 encoding, as `verify_log` holds every entry (a member written
    twice, which parsers read differently, or a usage_bound no usage exceeded, is
    refused). An entry that is not JSON at all (another log's, such as Tessera's test
    log) is only proved included, unless a `receipt` names it: then it must be the
    record the receipt's claims are."""
    if receipt is None:
        try:
            json.loads(entry)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return
    try:
        record = parse_record(entry)
    except RecordError as exc:
        raise ProofError(f"entry {index}: not a valid schema-v1 record: {exc}") from exc
    if receipt is not None:
        check_claims(record, receipt)


def check_tlog_proof(
    data: bytes,
    verifiers: Sequence[Verifier],
    *,
    origin: str | None = None,
    entry: bytes | None = None,
    leaf: bytes | None = None,
    index: int | None = None,
    receipt: Receipt | None = None,
    witnesses: Sequence[CosignatureVerifier] = (),
    min_witnesses: int = 1,
    now: float,
) -> ProvedEntry:
    """Raise a ProvenanceError unless `data`, a tlog-proof, proves its entry is in a
    checkpoint signed by one of `verifiers` (and cosigned by `min_witnesses` of
    `witnesses`, when given).

    `entry` (the entry's bytes) or `leaf` (its RFC 6962 leaf hash, e.g. a receipt's
    `dispatch_hash`) name the entry; a proof's extra line must then be that entry, and
    the proof must be at `index` when given (a receipt's: checked first, so another
    entry's proof is named as such, not as a hash that misses the root). With
    neither, the extra line is the entry; a proof without one is a ValueError (nothing to
    prove). `receipt` (verified by the caller) gives `leaf` and `index`, and the record,
    when the proof or `entry` carries it, must say what the receipt says. `now` (POSIX
    seconds) refuses cosignatures dated in the future.
    """
    if receipt is not None:
        leaf, index = receipt.dispatch_hash, receipt.index
    if not verifiers:
        raise ValueError("a tlog-proof check needs at least one trusted log key")
    check_witness_policy(witnesses, verifiers, min_witnesses)
    if len(data) > MAX_PROOF_BYTES:
        raise MalformedError(f"tlog-proof: longer than {MAX_PROOF_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError("tlog-proof: not valid UTF-8") from exc
    proof = TlogProof.parse(text)
    if index is not None and proof.index != index:
        raise ProofError(
            f"the proof is of entry {proof.index}, the receipt names entry {index}: another entry"
        )
    if entry is not None and proof.extra is not None and entry != proof.extra:
        raise ProofError("the proof's extra line is not the entry given: another entry")
    proved = entry if entry is not None else proof.extra
    hashed = None if proved is None else leaf_hash(proved)
    if leaf is not None and hashed is not None and hashed != leaf:
        raise ProofError(
            "the entry's leaf hash is not the one given (the receipt's dispatch_hash): "
            "another entry"
        )
    target = leaf if leaf is not None else hashed
    if target is None:
        raise ValueError(
            "the proof has no extra line holding its entry: give the entry (or a receipt "
            "naming its leaf hash) to say what it proves"
        )
    signed = open_checkpoint(proof.checkpoint, verifiers, origin=origin)
    checkpoint = signed.checkpoint
    verify_inclusion(target, proof.index, checkpoint.size, proof.hashes, checkpoint.root)
    if proved is not None:
        _check_record(proved, proof.index, receipt)
    witnessed: list[CosignatureVerifier] = []
    if witnesses:
        witnessed = cosigners(proof.checkpoint, witnesses, now)
        if len(witnessed) < min_witnesses:
            raise SignatureError(
                f"the proof's checkpoint is cosigned by {len(witnessed)} of the "
                f"{len(witnesses)} given witness key(s), fewer than {min_witnesses}"
            )
    return ProvedEntry(
        index=proof.index,
        leaf=target,
        entry=proved,
        from_extra=entry is None and proof.extra is not None,
        checkpoint=checkpoint,
        signed_by=tuple(f"{s.name}+{s.key_id:08x}" for s in signed.signatures.verified),
        cosigned_by=tuple(str(w) for w in witnessed),
        claims_checked=receipt is not None and proved is not None,
    )
