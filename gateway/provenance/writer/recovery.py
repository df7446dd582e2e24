"""What a reopened log rebuilds from its files, and what it refuses to go on from.

`LogStore.open` takes the newest history checkpoint (`checkpoints/`), checks that nothing in
the directory shows a larger signed tree (`check_no_later_tree`), and rebuilds the tree
from the entry bundles, checking the root (`tree_check.rebuild_tree`). Appending from less than
the log published would sign a tree that does not extend it: a fork. Then it replays the
write-ahead segments onto that tree (`replay_segments`), cutting only a torn tail.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gateway.provenance.errors import LogCorruptedError, MalformedError, ProvenanceError
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.layout import (
    CHECKPOINT,
    HISTORY,
    WAL,
    list_cosigned,
    read_log_file,
)
from gateway.provenance.formats.note import Verifier, open_note
from gateway.provenance.formats.tree import TiledTree
from gateway.provenance.formats.wal import list_segments, scan_segment
from gateway.provenance.writer.replay_check import ReplayCheck

__all__ = ["check_no_later_tree", "check_signed", "note_text", "replay_segments"]


def check_signed(data: bytes, path: Path, verifiers: Iterable[Verifier]) -> None:
    """Refuse to go on from a checkpoint no key of this log signs: the signing key, the
    previous keys, the verifier keys a rotation retired. Without it, a directory whose
    entries, tiles and checkpoint were rewritten together (the signature left as it was)
    was extended on open wherever no high-water file recorded the log."""
    try:
        open_note(data, verifiers)
    except ProvenanceError as exc:
        raise LogCorruptedError(
            f"{path} carries no valid signature by a key of this log ({exc}): the directory "
            "was altered, or the log's key changed without the old one listed (the gateway: "
            "put its verifier key in provenance.retired_verifier_keys; `owngate attest`: "
            "keep its key, or start a new log directory)"
        ) from exc


def note_text(data: bytes, path: Path) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogCorruptedError(f"{path} is not UTF-8") from exc
    split = text.rfind("\n\n")
    if split < 0:
        raise LogCorruptedError(f"{path} is not a signed note")
    return text[: split + 1]


def read_note(path: Path) -> bytes:
    """The writer's own checkpoint file at `path`, read as the admin API serves it (a
    regular file of at most `MAX_NOTE_FILE` bytes): FileNotFoundError when it is absent,
    LogCorruptedError, as for a damaged file, when it is a FIFO, a device or larger (never
    a wait for a FIFO's writer, nor a device read whole), OSError otherwise."""
    try:
        return read_log_file(path)
    except MalformedError as exc:
        raise LogCorruptedError(str(exc)) from exc


def holds_note(path: Path, note: bytes) -> bool:
    """Whether the file at `path` holds `note`: False when it is absent or not one of
    the writer's files (a FIFO, a device, larger than a note), which is then replaced."""
    try:
        return read_note(path) == note
    except (FileNotFoundError, LogCorruptedError):
        return False


def check_no_later_tree(directory: Path, signed: int, *, has_history: bool) -> None:
    """Refuse to go on from size `signed` (the newest history file) when the directory shows
    that the log signed more: a checkpoint file or a cosigned checkpoint of a larger size,
    or, with no history at all, a checkpoint file or tiles. Appending would then sign a
    tree that does not extend the one published. A crash never leaves this (history is
    written before the checkpoint file and the cosignatures); lost files do."""
    path = directory / CHECKPOINT
    try:
        served: int | None = Checkpoint.parse(note_text(read_note(path), path)).size
    except FileNotFoundError:
        served = None
    if not has_history and (served is not None or (directory / "tile").exists()):
        raise LogCorruptedError(
            f"{directory} holds a checkpoint file or tiles but no {HISTORY}/: the signed "
            "history is missing; refusing to start a new tree over a published one"
        )
    cosigned = list_cosigned(directory)
    for what, size in (
        ("checkpoint", served),
        ("cosigned/", cosigned[-1][0] if cosigned else None),
    ):
        if size is not None and size > signed:
            raise LogCorruptedError(
                f"{directory}: {what} holds a checkpoint of size {size}, but {HISTORY}/ "
                f"ends at size {signed}: a signed checkpoint is missing; refusing to roll back"
            )


def replay_segments(directory: Path, tree: TiledTree) -> tuple[list[tuple[str, bytes]], int, int]:
    """Append the entries of `directory`'s write-ahead segments that `tree` (the newest
    checkpoint's) does not hold yet, each checked (`ReplayCheck`); returns the tiles and
    bundles they completed, the entries replayed and the torn bytes to cut."""
    pending: list[tuple[str, bytes]] = []
    replayed = torn = 0
    segments = list_segments(directory / WAL)
    check = ReplayCheck(directory, tree.size)
    for position, (first, path) in enumerate(segments):
        if first > tree.size:
            raise LogCorruptedError(
                f"{path.name} starts at entry {first} but the log ends at {tree.size}"
            )
        scan = scan_segment(path, first)
        if scan.torn and position != len(segments) - 1:
            raise LogCorruptedError(
                f"{path.name} is damaged at byte {scan.valid_bytes} and is not the last "
                "segment: this is not a torn tail, refusing to cut it"
            )
        torn += scan.total_bytes - scan.valid_bytes
        for offset, (entry, leaf) in enumerate(scan.entries):
            if first + offset < tree.size:
                continue  # already covered by the checkpoint (crash before cleanup)
            check.check(first + offset, entry, leaf, path.name)
            pending.extend(tree.append(entry, leaf))
            replayed += 1
    return pending, replayed, torn
