"""`verify_log`: the auditor's full check of a log directory, with a public key only.

It checks, and raises `LogVerificationError` at the first failure:

1. every checkpoint in the history is signed by a trusted key, for the same origin (a key
   retired by a rotation never signs alone again, and a rotation keeps the key's name:
   `audit.rotation`);
2. the served `checkpoint` is the newest one (an older one is a rollback), and every
   checkpoint the auditor already holds is covered (or the log was rolled back);
3. every entry: its leaf hash equals the stored level-0 tile hash (else the first edited,
   deleted, inserted or reordered index is named; a bundle or tile of the wrong length is
   compared entry by entry, naming the first index missing or not hashing to its leaf), it
   is a valid schema-v1 record, and a completion links to an open dispatch of the same
   request by index and hash;
4. every stored tile and bundle matches the recomputed tree, and the recomputed root at each
   checkpoint's size equals the signed root (else the log was altered after signing);
5. each checkpoint is consistent with the previous one (RFC 6962 consistency proof);
6. with witness keys: every cosignature line by a given witness in `cosigned/` is valid,
   each cosigned checkpoint is one the log signed and is consistent with the entries (its
   root is checked like a trusted checkpoint's, a size beyond the log is a rollback), and
   at least one checkpoint carries cosignatures by `min_witnesses` of the witnesses.

After a key rotation, `accept_earlier_keys` lets the checkpoints before the first one a
trusted key signed carry only keys the auditor does not hold: their roots are still
checked against the entries, and the first trusted checkpoint covers those entries.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.provenance.audit.cosigned import (
    WitnessSummary,
    check_cosigned,
    check_witness_policy,
)
from gateway.provenance.audit.history import DEFAULT_LIMITS, HistoryLimits, open_history
from gateway.provenance.audit.links import RecordLinks
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.rotation import check_rotation_order
from gateway.provenance.errors import (
    LogVerificationError,
    MalformedError,
    ProofError,
    RecordError,
    SignatureError,
)
from gateway.provenance.formats.checkpoint import SignedCheckpoint, open_checkpoint
from gateway.provenance.formats.cosignature import CosignatureVerifier
from gateway.provenance.formats.layout import (
    read_log_file,
)
from gateway.provenance.formats.merkle import (
    HASH_SIZE,
    consistency_proof,
    leaf_hash,
    verify_consistency,
)
from gateway.provenance.formats.note import Verifier
from gateway.provenance.formats.records import parse_record
from gateway.provenance.formats.tiles import TILE_WIDTH, TileReader, file_limit, tile_path
from gateway.provenance.formats.tree import TiledTree

__all__ = ["HistoryLimits", "LogSummary", "WitnessSummary", "verify_log"]


@dataclass(frozen=True, slots=True)
class LogSummary:
    origin: str
    size: int
    root: bytes
    checkpoints: int
    signed_by: tuple[str, ...]
    unsigned_entries: int  # durable entries not yet covered by a checkpoint
    open_dispatches: int  # dispatches with no completion (in flight, or a crash)
    earlier_checkpoints: int = 0  # before a rotation: signed only by keys not given
    witnesses: WitnessSummary | None = None  # when witness keys were given


def _fail(reason: str, index: int | None = None) -> LogVerificationError:
    return LogVerificationError(reason, index=index)


def _check_latest(log: LogDirectory, history: list[SignedCheckpoint]) -> None:
    newest = history[-1]
    try:
        served = log.latest_note()
    except MalformedError as exc:
        raise _fail(str(exc)) from exc
    if served == newest.note:
        return
    try:
        size = next(c.checkpoint.size for c in history if c.note == served)
    except StopIteration:
        raise _fail(
            "the checkpoint file is not one of the signed checkpoints in checkpoints/"
        ) from None
    raise _fail(
        f"rollback: the checkpoint file presents size {size} but the log signed a newer "
        f"checkpoint of size {newest.checkpoint.size}"
    )


def _check_trusted(
    trusted: Iterable[bytes], verifiers: Sequence[Verifier], origin: str, latest: int
) -> list[SignedCheckpoint]:
    held: list[SignedCheckpoint] = []
    for number, data in enumerate(trusted):
        try:
            signed = open_checkpoint(data, verifiers, origin=origin)
        except (SignatureError, MalformedError) as exc:
            raise _fail(f"trusted checkpoint #{number + 1}: {exc}") from exc
        if signed.checkpoint.size > latest:
            raise _fail(
                f"rollback: the log's newest checkpoint has size {latest}, but you hold a "
                f"checkpoint of size {signed.checkpoint.size} signed by the same log"
            )
        held.append(signed)
    return held


def _compare_files(
    log: LogDirectory, files: list[tuple[str, bytes]], index: int | None, newest: bool = False
) -> None:
    """Each of `files` must be in the log as the entries make it; `newest`: they are the
    partial files of the newest checkpoint, which no full tile has superseded yet."""
    for name, expected in files:
        try:
            actual = read_log_file(log.path / name, file_limit(name))
        except MalformedError as exc:
            raise _fail(str(exc), index) from exc
        except FileNotFoundError:
            full, partial, _ = name.partition(".p/")
            if partial and not newest and (log.path / full).exists():
                continue  # a partial tile may be deleted once its full tile exists
            why = ""
            if partial and (log.path / full).exists():
                why = (
                    f", and {full} stands in its place though the newest checkpoint does "
                    "not reach that tile's end: a full tile no checkpoint covers"
                )
            raise _fail(f"{name} is missing{why}", index) from None
        if actual != expected:
            raise _fail(f"{name} does not match the entries it covers (altered file)", index)


def _locate(log: LogDirectory, bundle: int, size: int, cause: Exception) -> LogVerificationError:
    """Bundle or level-0 tile unreadable or of the wrong length: compare what is there, in
    order, and name the first index that is missing or does not hash to its leaf."""
    first, signed = bundle * TILE_WIDTH, f"the signed checkpoint covers {size} entries"
    count = min(TILE_WIDTH, size - first)
    name, entries, cut = log.bundle_prefix(bundle, size)
    tile, leaves = log.level0_prefix(bundle, size)
    held, hashes = entries or [], leaves or []
    for offset, (entry, leaf) in enumerate(zip(held, hashes, strict=False)):
        if leaf_hash(entry) != leaf:
            return _mismatch(first, offset, held, hashes, name, count)
    if entries is None:
        return _fail(f"entry bundle {name} is missing; {signed} (entries were deleted)", first)
    if len(held) < count and len(held) <= len(hashes):
        how = f"it holds {len(held)} entries, the tree {count}"
        why = f"missing from entry bundle {name} ({how}): entries were deleted or truncated"
        if cut:
            why = f"the entry is cut short: entry bundle {name} ends inside it (truncated file)"
        return _fail(f"{why}; {signed}", first + len(held))
    if len(hashes) < count:
        why = "is missing" if leaves is None else f"holds {len(hashes)} hashes, not {count}"
        return _fail(
            f"no leaf hash for the entry: tile {tile} {why}; {signed}", len(hashes) + first
        )
    if cut and len(held) >= count:
        last = first + count - 1
        return _fail(f"entry bundle {name} has bytes after entry {last}, its last (altered file)")
    # The file's own width: a partial bundle `.p/<W>` holds W entries (C2SP tlog-tiles).
    width = int(name.rpartition("/")[2]) if ".p/" in name else TILE_WIDTH
    if len(held) > width:
        why = f"holds {len(held)} entries, more than its width {width}: entries were appended"
        return _fail(f"entry bundle {name} {why} after entry {first + width - 1}")
    return _fail(f"{cause}; {signed}", first)


def _mismatch(
    first: int, offset: int, entries: list[bytes], leaves: list[bytes], name: str, count: int
) -> LogVerificationError:
    """Entry `first + offset` does not hash to its leaf: say why, when another leaf tells."""
    index, leaf = first + offset, leaf_hash(entries[offset])
    found = first + leaves.index(leaf) if leaf in leaves else -1
    holds = f"holds {len(entries)} entries, the tree {count}"
    if found > index and len(entries) < count:
        why = f"missing from entry bundle {name} (it {holds}): entry {found}'s record sits in its"
        return _fail(f"{why} place, so this record was deleted", index)
    why = f"the entry does not hash to its leaf in {tile_path(0, first // TILE_WIDTH)}: "
    if found > index:
        why += f"it holds entry {found}'s record (records were reordered, or this one deleted)"
    elif found >= 0:
        why += f"it holds entry {found}'s record (a record was inserted or moved here)"
    else:
        why += "a record was edited, deleted, inserted or reordered here"
    return _fail(why + (f" (entry bundle {name} {holds})" if len(entries) != count else ""), index)


def verify_log(
    directory: str | Path,
    verifiers: Sequence[Verifier],
    *,
    origin: str | None = None,
    trusted_checkpoints: Iterable[bytes] = (),
    witnesses: Sequence[str | CosignatureVerifier] = (),
    min_witnesses: int = 1,
    now: float | None = None,
    accept_earlier_keys: bool = False,
    limits: HistoryLimits = DEFAULT_LIMITS,
) -> LogSummary:
    """Verify a whole log directory; raises LogVerificationError naming the first problem.

    `witnesses` (cosignature verifier keys) also checks `cosigned/`: every line by one of
    them must verify, and some checkpoint must carry `min_witnesses` of them; two keys that
    are one public key, or a witness key that is one of `verifiers`, are a ValueError (one
    witness would count twice; the log would witness itself). `now` (POSIX
    seconds, default the clock) refuses cosignatures from the future. `limits` bounds the
    checkpoint files listed and held (`HistoryLimits`).
    """
    if not verifiers:
        raise ValueError("verify_log needs at least one trusted key")
    witness_keys = [
        w if isinstance(w, CosignatureVerifier) else CosignatureVerifier(w) for w in witnesses
    ]
    check_witness_policy(witness_keys, verifiers, min_witnesses)
    try:
        log = LogDirectory(directory)
    except MalformedError as exc:
        raise _fail(str(exc)) from exc
    history, earlier = open_history(log, verifiers, origin, accept_earlier_keys, limits)
    check_rotation_order(history, earlier)
    _check_latest(log, history)
    newest = history[-1].checkpoint
    held = _check_trusted(trusted_checkpoints, verifiers, newest.origin, newest.size)
    expected_roots: dict[int, list[tuple[str, bytes]]] = {}
    for label, signed in [("checkpoint", c) for c in history] + [("trusted", c) for c in held]:
        size = signed.checkpoint.size
        name = f"{'' if label == 'checkpoint' else 'trusted '}checkpoint of size {size}"
        expected_roots.setdefault(size, []).append((name, signed.checkpoint.root))
    witnessed: WitnessSummary | None = None
    if witness_keys:
        clock = time.time() if now is None else now
        cosigned, witnessed = check_cosigned(
            log, history, verifiers, witness_keys, min_witnesses, clock, limits.files
        )
        for name, checkpoint in cosigned:
            expected_roots.setdefault(checkpoint.size, []).append((name, checkpoint.root))
    history_sizes = {signed.checkpoint.size for signed in history}

    tree = TiledTree()
    links = RecordLinks()
    _check_roots(tree, expected_roots, history_sizes, log)
    for bundle_index in range((newest.size + TILE_WIDTH - 1) // TILE_WIDTH):
        first = bundle_index * TILE_WIDTH
        try:
            entries = log.bundle(bundle_index, newest.size)
            hashes = log.level0_tile(bundle_index, newest.size)
        except MalformedError as exc:
            raise _locate(log, bundle_index, newest.size, exc) from exc
        for offset, entry in enumerate(entries):
            index = first + offset
            leaf = leaf_hash(entry)
            if leaf != hashes[offset * HASH_SIZE : (offset + 1) * HASH_SIZE]:
                leaves = [hashes[i : i + HASH_SIZE] for i in range(0, len(hashes), HASH_SIZE)]
                raise _mismatch(first, offset, entries, leaves, "", len(leaves))
            try:
                record = parse_record(entry)
            except RecordError as exc:
                raise _fail(f"not a valid schema-v1 record: {exc}", index) from exc
            links.check(index, record, leaf)
            completed = tree.append(entry, leaf)
            if completed:
                _compare_files(log, completed, index)
            if tree.size in expected_roots:
                _check_roots(tree, expected_roots, history_sizes, log)

    _check_consistency(log, history)
    unsigned = _check_unsigned(log.unsigned_entries(newest.size), newest.size, links)
    signers = sorted({f"{s.name}+{s.key_id:08x}" for c in history for s in c.signatures.verified})
    return LogSummary(
        origin=newest.origin,
        size=newest.size,
        root=newest.root,
        checkpoints=len(history),
        signed_by=tuple(signers),
        unsigned_entries=unsigned,
        open_dispatches=len(links.open),
        earlier_checkpoints=earlier,
        witnesses=witnessed,
    )


def _check_unsigned(entries: Iterator[bytes], size: int, links: RecordLinks) -> int:
    """The write-ahead entries past the newest checkpoint, held to the record and link
    checks of the signed ones (the next start replays them unread and signs them), one
    at a time; returns how many there are."""
    after = " (in the write-ahead segment, not yet in a checkpoint: the next start signs it)"
    count = 0
    for index, entry in enumerate(entries, start=size):
        try:
            record = parse_record(entry)
        except RecordError as exc:
            raise _fail(f"not a valid schema-v1 record: {exc}{after}", index) from exc
        try:
            links.check(index, record, leaf_hash(entry))
        except LogVerificationError as exc:
            raise _fail(exc.reason + after, index) from exc
        count += 1
    return count


def _check_roots(
    tree: TiledTree,
    expected: dict[int, list[tuple[str, bytes]]],
    history_sizes: set[int],
    log: LogDirectory,
) -> None:
    wanted = expected.get(tree.size)
    if wanted is None:
        return
    root = tree.root()
    for label, signed_root in wanted:
        if root != signed_root:
            raise _fail(
                f"entries 0..{tree.size - 1} do not hash to the root of the {label}: "
                "the log was altered after it was signed (tiles were rewritten to match)"
            )
    if tree.size in history_sizes:
        _compare_files(log, tree.partial_files(), None, newest=tree.size == max(history_sizes))


def _check_consistency(log: LogDirectory, history: list[SignedCheckpoint]) -> None:
    newest = history[-1].checkpoint
    reader = TileReader(log.path, newest.size)
    for older, newer in itertools.pairwise(history):
        a, b = older.checkpoint, newer.checkpoint
        if a.size == 0:
            continue  # every tree extends the empty tree
        try:
            proof = consistency_proof(a.size, b.size, reader.node)
            verify_consistency(a.size, b.size, proof, a.root, b.root)
        except (ProofError, MalformedError) as exc:
            raise _fail(
                f"checkpoint of size {b.size} is not consistent with the one of size {a.size}: "
                f"{exc}"
            ) from exc
