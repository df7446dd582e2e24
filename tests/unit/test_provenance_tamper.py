"""`owngate audit verify` detects each kind of tampering, with a specific message.

One log (with several checkpoints) is built once; each test copies it, damages the copy
the way an attacker would, and runs the audit command on it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.provenance import LogSettings, ProvenanceLog, Signer, sign_checkpoint
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.layout import CHECKPOINT, list_history
from gateway.provenance.formats.merkle import leaf_hash, root_from_leaves
from gateway.provenance.formats.tiles import decode_bundle, encode_bundle, entries_path, tile_path
from gateway.provenance.testing import log_refusal, log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/replica-1"
SIGNER = seeded_signer(ORIGIN)
REQUESTS = 20  # 40 records + 1 refusal = 41 entries, all in bundle 0


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        settings = LogSettings(group_commit_ms=0, checkpoint_every=10)
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, settings=settings)
        for n in range(REQUESTS):
            await log_request(log, n)
            await log.exports_idle()  # a checkpoint every 10 entries exactly
        await log_refusal(log, 1000)
        await log.close()

    asyncio.run(build())
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(pristine, target)
    return target


def _verify(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = run_audit(["verify", str(path), "--key", SIGNER.vkey, *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def _size(path: Path) -> int:
    return list_history(path)[-1][0]


def _rewrite_entries(path: Path, change: Callable[[list[bytes]], list[bytes]]) -> None:
    name = entries_path(0, _size(path))
    entries = decode_bundle((path / name).read_bytes())
    (path / name).write_bytes(encode_bundle(change(entries)))


def test_pristine_log_verifies(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(copy, capsys)
    assert code == 0, out
    assert "ok: gateway.example/log/replica-1: 41 entries" in out


def test_flipped_byte_in_a_record(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def flip(entries: list[bytes]) -> list[bytes]:
        record = bytearray(entries[17])
        record[40] ^= 0x01
        entries[17] = bytes(record)
        return entries

    _rewrite_entries(copy, flip)
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 17: the entry does not hash to its leaf in tile/0/000" in out
    assert "edited, deleted, inserted or reordered" in out


def test_deleted_record(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite_entries(copy, lambda entries: entries[:12] + entries[13:])
    code, out = _verify(copy, capsys)
    assert code == 1
    assert (
        "entry 12: missing from entry bundle tile/entries/000.p/41 (it holds 40 entries, the "
        "tree 41): entry 13's record sits in its place, so this record was deleted" in out
    )


def test_deleted_last_record(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite_entries(copy, lambda entries: entries[:-1])
    code, out = _verify(copy, capsys)
    assert code == 1
    assert (
        "entry 40: missing from entry bundle tile/entries/000.p/41 (it holds 40 entries, the "
        "tree 41): entries were deleted or truncated; the signed checkpoint covers 41" in out
    )


def test_edited_record_before_a_deleted_one(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def change(entries: list[bytes]) -> list[bytes]:
        edited = entries[6].replace(b"eu-west", b"us-east")
        assert edited != entries[6]
        return [*entries[:6], edited, *entries[7:12], *entries[13:]]

    _rewrite_entries(copy, change)
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 6: the entry does not hash to its leaf in tile/0/000: a record was edited" in out
    assert "(entry bundle tile/entries/000.p/41 holds 40 entries, the tree 41)" in out


def test_deleted_record_with_padding_to_keep_the_count(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rewrite_entries(copy, lambda entries: [*entries[:12], *entries[13:], entries[-1]])
    code, out = _verify(copy, capsys)
    assert code == 1
    assert (
        "entry 12: the entry does not hash to its leaf in tile/0/000: it holds entry 13's "
        "record (records were reordered, or this one deleted)" in out
    )


@pytest.mark.parametrize(("a", "b"), [(4, 9), (9, 4), (39, 40)])
def test_swapped_records(copy: Path, capsys: pytest.CaptureFixture[str], a: int, b: int) -> None:
    def swap(entries: list[bytes]) -> list[bytes]:
        entries[a], entries[b] = entries[b], entries[a]
        return entries

    _rewrite_entries(copy, swap)
    code, out = _verify(copy, capsys)
    assert code == 1
    first, second = min(a, b), max(a, b)
    assert (
        f"entry {first}: the entry does not hash to its leaf in tile/0/000: it holds entry "
        f"{second}'s record (records were reordered, or this one deleted)" in out
    )


def test_swapped_records_in_a_short_bundle(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def change(entries: list[bytes]) -> list[bytes]:
        entries[7], entries[8] = entries[8], entries[7]
        return entries[:-1]

    _rewrite_entries(copy, change)
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 7: missing from entry bundle tile/entries/000.p/41 (it holds 40 entries" in out
    assert "entry 8's record sits in its place" in out


def test_truncated_tail(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = copy / entries_path(0, _size(copy))
    name.write_bytes(name.read_bytes()[:-100])  # inside entry 40, the last one
    code, out = _verify(copy, capsys)
    assert code == 1
    assert (
        "entry 40: the entry is cut short: entry bundle tile/entries/000.p/41 ends inside it "
        "(truncated file); the signed checkpoint covers 41 entries" in out
    )


def test_truncated_inside_a_length_prefix(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = copy / entries_path(0, _size(copy))
    entries = decode_bundle(name.read_bytes())
    name.write_bytes(encode_bundle(entries[:30]) + b"\x01")  # half of entry 30's length
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 30: the entry is cut short: entry bundle tile/entries/000.p/41" in out


def test_bytes_after_the_last_entry(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = copy / entries_path(0, _size(copy))
    name.write_bytes(name.read_bytes() + b"\x00")  # every entry intact, one byte more
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry bundle tile/entries/000.p/41 has bytes after entry 40, its last" in out


def test_truncated_level0_tile(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = copy / tile_path(0, 0, _size(copy))
    name.write_bytes(name.read_bytes()[:-64])
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 39: no leaf hash for the entry: tile tile/0/000.p/41 holds 39 hashes" in out


def test_rollback_to_an_older_checkpoint(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = list_history(copy)
    shutil.copy(history[2][1], copy / CHECKPOINT)
    code, out = _verify(copy, capsys)
    assert code == 1
    assert (
        f"rollback: the checkpoint file presents size {history[2][0]} but the log signed a "
        f"newer checkpoint of size {history[-1][0]}" in out
    )


def test_consistent_rollback_is_caught_by_a_checkpoint_the_auditor_holds(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = tmp_path / "seen-checkpoint"
    shutil.copy(copy / CHECKPOINT, held)
    history = list_history(copy)
    for _, path in history[3:]:  # the attacker drops the newer checkpoints and entries
        path.unlink()
    shutil.copy(history[2][1], copy / CHECKPOINT)
    assert _verify(copy, capsys)[0] == 0  # self-consistent: only outside knowledge helps
    code, out = _verify(copy, capsys, "--checkpoint", str(held))
    assert code == 1
    assert f"rollback: the log's newest checkpoint has size {history[2][0]}" in out


def _forge(path: Path, signer: Signer, edit: int) -> None:
    """Edit one record and rebuild tiles and every checkpoint, signing with `signer`."""

    def change(entries: list[bytes]) -> list[bytes]:
        edited = entries[edit].replace(b"eu-west", b"us-east").replace(b":200,", b":500,")
        assert edited != entries[edit]
        entries[edit] = edited
        return entries

    _rewrite_entries(path, change)
    size = _size(path)
    entries = decode_bundle((path / entries_path(0, size)).read_bytes())
    leaves = [leaf_hash(entry) for entry in entries]
    (path / tile_path(0, 0, size)).write_bytes(b"".join(leaves))
    notes = []
    for checkpoint_size, history_path in list_history(path):
        root = root_from_leaves(leaves[:checkpoint_size])
        note = sign_checkpoint(Checkpoint(ORIGIN, checkpoint_size, root), [signer])
        history_path.write_bytes(note)
        notes.append(note)
    (path / CHECKPOINT).write_bytes(notes[-1])


def test_resigned_with_another_key(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _forge(copy, seeded_signer(ORIGIN, seed=666), edit=30)
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "checkpoint checkpoints/00000000000000000000: note has no signature by a trusted" in out
    assert f"trusted: {SIGNER}" in out


def test_rewritten_tiles_without_a_new_signature(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = {size: path.read_bytes() for size, path in list_history(copy)}
    _forge(copy, SIGNER, edit=31)  # a completion: no link points at it
    for size, note in history.items():  # keep the genuine signed checkpoints
        (copy / "checkpoints" / f"{size:020d}").write_bytes(note)
    (copy / CHECKPOINT).write_bytes(history[max(history)])
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "do not hash to the root of the checkpoint of size 40" in out
    assert "altered after it was signed" in out


def test_broken_link_from_completion_to_dispatch(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _forge(copy, SIGNER, edit=0)  # consistent re-sign by the real key: only links can tell
    # entry 0 is req-0's dispatch; its completion at entry 1 carries the old hash.
    code, out = _verify(copy, capsys)
    assert code == 1
    assert "entry 1: completion's link hash differs from entry 0's hash" in out


def test_wrong_origin(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(copy, capsys, "--origin", "gateway.example/log/replica-2")
    assert code == 1
    assert "expected 'gateway.example/log/replica-2': another log" in out
