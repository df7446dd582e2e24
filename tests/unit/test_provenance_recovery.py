"""A reopened log goes on only from its newest signed checkpoint, never from less.

`LogStore.open` recovers from the history files (`checkpoints/`); these tests damage the
directory the way a crash or lost files leave it and check that the log either repairs
what a crash explains or refuses to sign a tree that does not extend the published one.
The high-water file (`HighWater`, outside the directory) catches what the directory itself
cannot show: a directory emptied, deleted, or restored from an older copy or another log.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.provenance.errors import LogCorruptedError, LogForkError, LogUnavailableError
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.layout import (
    CHECKPOINT,
    HISTORY,
    cosigned_path,
    history_path,
    list_history,
)
from gateway.provenance.formats.merkle import leaf_hash, root_from_leaves
from gateway.provenance.formats.tiles import decode_bundle
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import seeded_signer
from gateway.provenance.writer.high_water import HighWater
from gateway.provenance.writer.store import LogStore
from tests.helpers.provenance import socket_in_place

ORIGIN = "gateway.example/log/recovery"
SIGNER = seeded_signer(ORIGIN)


def _append(store: LogStore, count: int) -> None:
    _append_from(store, count, 0)


def _append_from(store: LogStore, count: int, first: int) -> None:
    entries = [f'{{"n":{first + store.size + n}}}'.encode() for n in range(count)]
    pairs = [(entry, leaf_hash(entry)) for entry in entries]
    store.append_frames(pairs, b"".join(encode_frame(e, h) for e, h in pairs))


def _log_of_sizes(
    directory: Path, *sizes: int, high_water: HighWater | None = None, first: int = 0
) -> list[bytes]:
    """A closed log with a checkpoint at each of `sizes`; returns their notes, in order.
    `first` shifts the entries' contents (another log of the same sizes)."""
    store = LogStore.open(directory, ORIGIN, [SIGNER], high_water=high_water)
    notes = []
    try:
        for size in sizes:
            _append_from(store, size - store.size, first)
            notes.append(store.checkpoint().note)
    finally:
        store.close()
    return notes


def test_a_crash_before_the_checkpoint_file_was_replaced_is_repaired(tmp_path: Path) -> None:
    # export writes the history file, then the checkpoint file: a crash between the two
    # left the older checkpoint served, and a reopened log that had nothing new to sign
    # kept it there, so the log looked rolled back to anyone reading `checkpoint`.
    older, newest = _log_of_sizes(tmp_path, 3, 7)
    (tmp_path / CHECKPOINT).write_bytes(older)
    LogStore.open(tmp_path, ORIGIN, [SIGNER]).close()
    assert (tmp_path / CHECKPOINT).read_bytes() == newest  # what `audit verify` requires


def test_a_lost_history_is_not_a_new_empty_log(tmp_path: Path) -> None:
    _log_of_sizes(tmp_path, 5)
    shutil.rmtree(tmp_path / HISTORY)
    served = (tmp_path / CHECKPOINT).read_bytes()
    with pytest.raises(LogCorruptedError, match="history is missing"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
    assert (tmp_path / CHECKPOINT).read_bytes() == served  # not replaced by a size-0 one
    (tmp_path / CHECKPOINT).unlink()
    with pytest.raises(LogCorruptedError, match="history is missing"):  # the tiles remain
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def test_a_lost_newest_history_file_is_not_a_rollback(tmp_path: Path) -> None:
    _log_of_sizes(tmp_path, 3, 7)
    newest = list_history(tmp_path)[-1][1]
    newest.unlink()
    with pytest.raises(LogCorruptedError, match="size 7, but checkpoints/ ends at size 3"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def test_a_cosigned_size_beyond_the_history_is_not_a_rollback(tmp_path: Path) -> None:
    # The witnesses hold a larger tree than the log would go on from: signing new
    # entries from size 3 would fork the log they cosigned.
    _, newest = _log_of_sizes(tmp_path, 3, 7)
    cosigned = cosigned_path(tmp_path, 7)
    cosigned.parent.mkdir()
    cosigned.write_bytes(newest)
    list_history(tmp_path)[-1][1].unlink()
    (tmp_path / CHECKPOINT).write_bytes(list_history(tmp_path)[-1][1].read_bytes())
    with pytest.raises(LogCorruptedError, match="cosigned/ holds a checkpoint of size 7"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def _recorded(high_water: HighWater) -> Checkpoint:
    recorded = HighWater(high_water.path).read()  # read afresh, as the next start reads it
    assert recorded is not None
    return recorded


def test_an_emptied_log_directory_is_refused_not_forked(tmp_path: Path) -> None:
    # The attack: delete (or empty) the log directory and restart under the same origin and
    # key; the new log would sign a size-0 tree and grow a second history under that origin.
    directory, high_water = tmp_path / "log", HighWater(tmp_path / "log.high-water")
    _log_of_sizes(directory, 3, 7, high_water=high_water)
    assert _recorded(high_water).size == 7
    for emptied in (
        shutil.rmtree,
        lambda path: [p.unlink() for p in path.rglob("*") if p.is_file()],
    ):
        emptied(directory)
        with pytest.raises(LogForkError) as refused:
            LogStore.open(directory, ORIGIN, [SIGNER], high_water=high_water)
        message = str(refused.value)
        for named in (str(directory), repr(ORIGIN), "size 7", str(high_water.path)):
            assert named in message, message
        assert "--new-log-origin" in message and "Restore the log directory" in message
        assert list_history(directory) == []  # nothing was signed
        assert not (directory / CHECKPOINT).exists()
        assert _recorded(high_water).size == 7  # and the record stays


def test_an_older_copy_of_the_log_directory_is_refused(tmp_path: Path) -> None:
    directory, high_water = tmp_path / "log", HighWater(tmp_path / "log.high-water")
    _log_of_sizes(directory, 3, high_water=high_water)
    shutil.copytree(directory, tmp_path / "backup")
    store = LogStore.open(directory, ORIGIN, [SIGNER], high_water=high_water)
    _append(store, 4)
    store.checkpoint()
    store.close()
    shutil.rmtree(directory)
    shutil.copytree(tmp_path / "backup", directory)
    (directory / ".lock").unlink(missing_ok=True)
    with pytest.raises(LogForkError, match="a log signed only up to size 3, but the log"):
        LogStore.open(directory, ORIGIN, [SIGNER], high_water=high_water)


def test_another_log_under_the_same_origin_is_refused(tmp_path: Path) -> None:
    # Same origin, same key, a larger tree: not the one signed (its root at size 3 differs).
    high_water = HighWater(tmp_path / "log.high-water")
    _log_of_sizes(tmp_path / "log", 3, high_water=high_water)
    _log_of_sizes(tmp_path / "other", 5, first=100)
    with pytest.raises(LogForkError, match="holds another tree than the log"):
        LogStore.open(tmp_path / "other", ORIGIN, [SIGNER], high_water=high_water)
    # the log itself, grown, still opens: its tree at size 3 is the one recorded
    _log_of_sizes(tmp_path / "log", 9, high_water=high_water)
    assert _recorded(high_water).size == 9


def test_a_first_start_and_a_log_from_before_the_file_open_and_are_recorded(
    tmp_path: Path,
) -> None:
    fresh = HighWater(tmp_path / "fresh.high-water")
    LogStore.open(tmp_path / "fresh", ORIGIN, [SIGNER], high_water=fresh).close()
    assert _recorded(fresh).size == 0
    _log_of_sizes(tmp_path / "old", 4)  # written before high-water files existed
    upgraded = HighWater(tmp_path / "old.high-water")
    LogStore.open(tmp_path / "old", ORIGIN, [SIGNER], high_water=upgraded).close()
    assert upgraded.path.read_bytes() == (tmp_path / "old" / CHECKPOINT).read_bytes()


def test_a_new_origin_starts_over_only_when_the_operator_says_so(tmp_path: Path) -> None:
    directory, path = tmp_path / "log", tmp_path / "log.high-water"
    _log_of_sizes(directory, 7, high_water=HighWater(path))
    shutil.rmtree(directory)
    new = "gateway.example/log/recovery-2"
    with pytest.raises(
        LogForkError, match=r"records the log .* not 'gateway\.example/log/recovery-2'"
    ):
        LogStore.open(directory, new, [SIGNER], high_water=HighWater(path))
    # the flag never excuses the same origin: that would be the fork itself
    with pytest.raises(LogForkError, match="holds no log"):
        LogStore.open(directory, ORIGIN, [SIGNER], high_water=HighWater(path, new_origin=True))
    LogStore.open(directory, new, [SIGNER], high_water=HighWater(path, new_origin=True)).close()
    assert (_recorded(HighWater(path)).origin, _recorded(HighWater(path)).size) == (new, 0)


def test_a_checkpoint_not_recorded_is_not_the_latest_and_is_recorded_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    high_water = HighWater(tmp_path / "log.high-water")
    store = LogStore.open(tmp_path / "log", ORIGIN, [SIGNER], high_water=high_water)
    try:
        _append(store, 2)

        def refused(self: HighWater, note: bytes) -> None:
            raise OSError(28, "No space left on device", str(self.path))

        with monkeypatch.context() as patched:
            patched.setattr(HighWater, "write", refused)
            with pytest.raises(LogUnavailableError, match="record the signed checkpoint"):
                store.checkpoint()
        assert store.latest is not None and store.latest.checkpoint.size == 0
        assert _recorded(high_water).size == 0
        assert store.checkpoint().checkpoint.size == 2  # the next export records it
        assert _recorded(high_water).size == 2
    finally:
        store.close()


# --- history the newest checkpoint covers: every entry bundle and tile, checked on open ---


def _reopened(directory: Path, more: int = 3) -> None:
    """Open the log, sign `more` entries on top of it, close it."""
    store = LogStore.open(directory, ORIGIN, [SIGNER])
    try:
        _append(store, more)
        store.checkpoint()
    finally:
        store.close()


def _tiles(directory: Path) -> dict[str, bytes]:
    tiles = directory / "tile"
    return {str(p.relative_to(directory)): p.read_bytes() for p in tiles.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # cut in half: "holds 128 hashes, not 256"
        lambda data: data[:32] + bytes(32) + data[64:],  # one hash altered
        lambda data: b"",
        None,  # deleted
    ],
    ids=["cut", "altered", "emptied", "deleted"],
)
def test_a_damaged_old_full_tile_is_rewritten_from_the_entries(
    tmp_path: Path, damage: object
) -> None:
    # Open used to rebuild only the tree's right edge: a damaged tile/0/000 stayed, and
    # every checkpoint signed on top of it made a log that `audit verify` fails.
    _log_of_sizes(tmp_path, 600)
    before = _tiles(tmp_path)
    tile = tmp_path / "tile/0/000"
    if callable(damage):
        tile.write_bytes(damage(tile.read_bytes()))
    else:
        tile.unlink()
    store = LogStore.open(tmp_path, ORIGIN, [SIGNER])
    store.close()
    assert tile.read_bytes() == before["tile/0/000"]
    assert store.recovery.rewritten == ("tile/0/000",)
    _reopened(tmp_path)
    assert tile.read_bytes() == before["tile/0/000"]


def test_a_damaged_higher_level_tile_and_partial_tiles_are_rewritten(tmp_path: Path) -> None:
    size = 256 * 256 + 256 * 3 + 5  # a full level-1 tile, partial ones at levels 0, 1, 2
    _log_of_sizes(tmp_path, size)
    before = _tiles(tmp_path)
    damaged = ["tile/1/000", "tile/0/255", "tile/0/259.p/5", "tile/1/001.p/3", "tile/2/000.p/1"]
    for name in damaged:
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(bytes([data[0] ^ 1]) + data[1:])
    store = LogStore.open(tmp_path, ORIGIN, [SIGNER])
    store.close()
    assert _tiles(tmp_path) == before
    assert sorted(store.recovery.rewritten) == sorted(damaged)


def test_a_sound_log_opens_with_nothing_rewritten(tmp_path: Path) -> None:
    _log_of_sizes(tmp_path, 3, 256, 700)
    before = _tiles(tmp_path)
    store = LogStore.open(tmp_path, ORIGIN, [SIGNER])
    store.close()
    assert _tiles(tmp_path) == before
    assert store.recovery.rewritten == ()


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda data: data[:-1], "tile/entries/000 is cut short"),
        (lambda data: data[: data.index(b'{"n":9}') - 2], "tile/entries/000 holds 9 entries"),
        (lambda data: data.replace(b'"n":7}', b'"n":8}', 1), "tile/entries/000 does not hash"),
        (lambda data: data + encode_frame(b"{}", bytes(32)), "tile/entries/000 is cut short"),
        (None, "entry bundle tile/entries/000 is missing"),
    ],
    ids=["cut", "halved", "edited", "appended", "deleted"],
)
def test_a_damaged_entry_bundle_is_refused_naming_it(
    tmp_path: Path, damage: object, why: str
) -> None:
    # The entry bundles are the log: one that does not hash to the signed root cannot be
    # rebuilt, and signing on top of it would extend a tree the log never published.
    _log_of_sizes(tmp_path, 600)
    bundle = tmp_path / "tile/entries/000"
    if callable(damage):
        bundle.write_bytes(damage(bundle.read_bytes()))
    else:
        bundle.unlink()
    history = list_history(tmp_path)
    served = (tmp_path / CHECKPOINT).read_bytes()
    with pytest.raises(LogCorruptedError, match="--new-log-origin") as refused:
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
    assert why in str(refused.value), refused.value
    assert "size 600" in str(refused.value)
    assert list_history(tmp_path) == history  # nothing was signed
    assert (tmp_path / CHECKPOINT).read_bytes() == served


def test_an_edited_entry_with_its_tiles_rewritten_to_match_is_refused(tmp_path: Path) -> None:
    # Tiles recomputed over an edited entry agree with each other, not with the root the
    # log signed: nothing to name but the mismatch, and nothing is "repaired" to match.
    _log_of_sizes(tmp_path, 600)
    bundle = tmp_path / "tile/entries/001"
    bundle.write_bytes(bundle.read_bytes().replace(b'"n":300}', b'"n":301}', 1))
    entries = decode_bundle(bundle.read_bytes())
    (tmp_path / "tile/0/001").write_bytes(b"".join(leaf_hash(e) for e in entries))
    before = _tiles(tmp_path)
    with pytest.raises(LogCorruptedError, match="do not hash to the root of the signed"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
    assert _tiles(tmp_path) == before


def test_a_checkpoint_rewritten_over_edited_entries_with_its_old_signature_is_refused(
    tmp_path: Path,
) -> None:
    # Entries, tiles and checkpoint rewritten together, the signature lines left as they
    # were: everything hashes to the checkpoint's root, which no key of the log signed.
    # Without a high-water file (a first start, a deleted file) the log went on from it.
    notes = _log_of_sizes(tmp_path, 600)
    bundle = tmp_path / "tile/entries/001"
    bundle.write_bytes(bundle.read_bytes().replace(b'"n":300}', b'"n":301}', 1))
    leaves = [
        leaf_hash(e)
        for name in ("000", "001", "002.p/88")
        for e in decode_bundle((tmp_path / "tile/entries" / name).read_bytes())
    ]
    (tmp_path / "tile/0/001").write_bytes(b"".join(leaves[256:512]))
    text, _, signatures = notes[-1].decode().partition("\n\n")
    old = Checkpoint.parse(text + "\n")
    forged = Checkpoint(old.origin, old.size, root_from_leaves(leaves))
    note = (forged.text() + "\n" + signatures).encode()
    history_path(tmp_path, 600).write_bytes(note)
    (tmp_path / CHECKPOINT).write_bytes(note)
    with pytest.raises(LogCorruptedError, match="no valid signature by a key of this log"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])


def test_a_checkpoint_signed_by_a_retired_key_opens_only_with_that_key_listed(
    tmp_path: Path,
) -> None:
    # A rotation that skipped the overlap: the newest checkpoint carries the old key alone.
    _log_of_sizes(tmp_path, 10)
    new = seeded_signer(ORIGIN, 2)
    with pytest.raises(LogCorruptedError, match="retired_verifier_keys"):
        LogStore.open(tmp_path, ORIGIN, [new])
    store = LogStore.open(tmp_path, ORIGIN, [new], retired=[SIGNER.verifier()])
    store.close()


def test_a_tile_directory_the_system_cannot_read_is_named_not_called_damaged(
    tmp_path: Path,
) -> None:
    # A file in place of `tile/` (a mount not there yet, an operator's mistake) loses
    # nothing: the open says which path and which error, not "damaged ... restore from a
    # backup or start a new origin" (before), and once the directory is back it opens.
    _log_of_sizes(tmp_path, 300)
    (tmp_path / "tile").rename(tmp_path / "tile.aside")
    (tmp_path / "tile").write_bytes(b"")
    with pytest.raises(LogUnavailableError) as refused:
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
    said = str(refused.value)
    assert f"{tmp_path / 'tile/entries/000'}: Not a directory" in said, said
    assert "new-log-origin" not in said and "restart" in said, said
    (tmp_path / "tile").unlink()
    (tmp_path / "tile.aside").rename(tmp_path / "tile")
    store = LogStore.open(tmp_path, ORIGIN, [SIGNER])
    store.close()
    assert store.size == 300 and store.recovery.rewritten == ()


def test_a_socket_in_place_of_an_entry_bundle_is_damage_not_an_unreadable_disk(
    tmp_path: Path,
) -> None:
    # A socket where the bundle was (ENXIO on open) is no file, as a FIFO there is: the
    # log is damaged. Before, the open called it a disk to make usable and restart.
    _log_of_sizes(tmp_path, 300)
    socket_in_place(tmp_path / "tile/entries/000")
    with pytest.raises(LogCorruptedError, match="000"):
        LogStore.open(tmp_path, ORIGIN, [SIGNER])
