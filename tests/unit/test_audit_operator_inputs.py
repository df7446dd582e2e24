"""The auditor's tools on a log the audited operator wrote, holding the log's own key.

Each test copies one honest log, changes it the way such an operator could (re-signing
what it changes), and runs the audit: tiles of the wrong size, checkpoints whose sizes go
backwards, a record that two JSON readers would read differently (a member written twice,
a non-canonical spelling), and checkpoint text that would drive the auditor's terminal.
What `audit verify` accepts must be what `audit show` and `audit prove` present, and no
text of the operator's reaches the terminal unescaped.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.provenance import LogSettings, ProvenanceLog, sign_checkpoint
from gateway.provenance.formats.checkpoint import Checkpoint
from gateway.provenance.formats.layout import CHECKPOINT, cosigned_path, list_history
from gateway.provenance.formats.merkle import leaf_hash, root_from_leaves
from gateway.provenance.formats.tiles import decode_bundle, encode_bundle, entries_path, tile_path
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.provenance import run_audit

ORIGIN = "gateway.example/log/operator-inputs"
SIGNER = seeded_signer(ORIGIN)
REQUESTS = 3  # 6 entries, checkpoints at 2, 4 and 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        settings = LogSettings(group_commit_ms=0, checkpoint_every=2)
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER, settings=settings)
        for n in range(REQUESTS):
            await log_request(log, n)
            await log.exports_idle()
        await log.close()

    asyncio.run(build())
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(pristine, target)
    return target


def _audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_audit(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, out, err = _audit(capsys, "verify", str(path), "--key", SIGNER.vkey)
    return code, out + err


def _size(path: Path) -> int:
    return list_history(path)[-1][0]


def _resign(path: Path, entries: list[bytes], extensions: tuple[str, ...] = ()) -> None:
    """Rewrite the bundle, level-0 tile and every checkpoint for `entries`, signed with the
    log's own key (the operator holds it)."""
    size = _size(path)
    (path / entries_path(0, size)).write_bytes(encode_bundle(entries))
    leaves = [leaf_hash(entry) for entry in entries]
    (path / tile_path(0, 0, size)).write_bytes(b"".join(leaves))
    note = b""
    for checkpoint_size, history_file in list_history(path):
        root = root_from_leaves(leaves[:checkpoint_size])
        note = sign_checkpoint(Checkpoint(ORIGIN, checkpoint_size, root, extensions), [SIGNER])
        history_file.write_bytes(note)
    (path / CHECKPOINT).write_bytes(note)


def _entries(path: Path) -> list[bytes]:
    return decode_bundle((path / entries_path(0, _size(path))).read_bytes())


def test_the_log_as_built_verifies(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _verify(copy, capsys)[0] == 0


# Tiles of the wrong size (held: each is a failed check naming the file).


@pytest.mark.parametrize(
    "change",
    [lambda data: data + b"\0" * 32, lambda data: data + b"x", lambda data: data[:-1]],
    ids=["an-extra-hash", "an-extra-byte", "a-byte-short"],
)
def test_a_level0_tile_of_the_wrong_size_fails(
    copy: Path, capsys: pytest.CaptureFixture[str], change: object
) -> None:
    assert callable(change)
    tile = copy / tile_path(0, 0, _size(copy))
    tile.write_bytes(change(tile.read_bytes()))
    code, out = _verify(copy, capsys)
    assert code == 1, out
    assert "tile/0/000.p/6" in out, out


def test_a_full_width_tile_beside_a_short_tree_is_not_taken_for_it(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `tile/0/000` of 256 hashes (the first six right, the rest the operator's) in
    place of the partial tile the tree of 6 needs."""
    partial = copy / tile_path(0, 0, _size(copy))
    (copy / tile_path(0, 0)).write_bytes(partial.read_bytes() + b"\x07" * 32 * 250)
    partial.unlink()
    code, out = _verify(copy, capsys)
    assert code == 1, out
    assert "tile/0/000.p/6 is missing, and tile/0/000 stands in its place" in out, out


def test_an_entry_bundle_with_an_extra_entry_fails(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = copy / entries_path(0, _size(copy))
    entries = decode_bundle(bundle.read_bytes())
    bundle.write_bytes(encode_bundle([*entries, entries[-1]]))
    code, out = _verify(copy, capsys)
    assert code == 1, out
    assert "tile/entries/000.p/6" in out, out


# Checkpoints whose size goes backwards (held).


def test_a_history_file_holding_a_smaller_size_fails(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = list_history(copy)
    shutil.copy(history[0][1], history[-1][1])  # the file named 6 holds the checkpoint of 2
    shutil.copy(history[0][1], copy / CHECKPOINT)
    code, out = _verify(copy, capsys)
    assert code == 1, out
    assert f"holds size {history[0][0]}, not {history[-1][0]}" in out


def test_a_cosigned_checkpoint_of_a_signed_size_with_another_root_fails(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.provenance.formats.cosignature import Cosigner

    witness = Cosigner(seeded_signer("witness.example/w1"))
    for size, _ in list_history(copy):
        checkpoint = Checkpoint(ORIGIN, size, bytes(32))
        note = sign_checkpoint(checkpoint, [SIGNER])
        line = witness.cosign(checkpoint.text(), 1_700_000_000).line()
        cosigned_path(copy, size).parent.mkdir(exist_ok=True)
        cosigned_path(copy, size).write_bytes(note + line.encode())
    code, out, err = _audit(
        capsys, "verify", str(copy), "--key", SIGNER.vkey, "--witness-key", witness.vkey
    )
    assert code == 1, out + err
    assert "cosigned/" in err, err


# A record two readers read differently (held: verify refuses it, and show shows nothing
# of it, rather than a value verify never checked).


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b'"status":200', b'"status":500,"status":200'),  # written twice: readers differ
        (b'"status":200', b'"status":200 '),  # whitespace
        (b'"region":"eu-west"', b'"region":"\\u0065u-west"'),  # an escape JCS does not use
    ],
    ids=["a-member-twice", "whitespace", "an-escape"],
)
def test_a_record_not_in_its_canonical_form_is_neither_verified_nor_shown(
    copy: Path, capsys: pytest.CaptureFixture[str], before: bytes, after: bytes
) -> None:
    entries = _entries(copy)
    index = next(n for n, entry in enumerate(entries) if before in entry)
    entries[index] = entries[index].replace(before, after, 1)
    _resign(copy, entries)
    code, out = _verify(copy, capsys)
    assert code == 1, out
    assert f"entry {index}: not a valid schema-v1 record" in out
    assert "RFC 8785 canonical encoding" in out
    code, out, err = _audit(capsys, "show", str(copy), "--records")
    assert code == 1, out
    assert out == ""  # no summary, no record: nothing verify did not check
    assert f"entry {index}" in err


# Checkpoint text that would drive the terminal (a hole: `audit prove` wrote the note
# raw; a note holds no C0 control, but a C1 CSI or a bidi override was printed as is).


@pytest.mark.parametrize("text", ["\u009b2J", "\u202eevil", "\u2028ok: forged", "\x1b[2K"])
def test_prove_writes_no_control_character_of_the_checkpoint(
    copy: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    _resign(copy, _entries(copy), extensions=(f"note {text}",) if text[0] != "\x1b" else ())
    if text[0] == "\x1b":  # a C0 control, which no signed note holds: written over one
        note = (copy / CHECKPOINT).read_bytes()
        (copy / CHECKPOINT).write_bytes(note.replace(b"\n\n", f"\nnote {text}\n\n".encode(), 1))
    code, out, err = _audit(capsys, "prove", str(copy), "req-0")
    assert code == 1, out
    assert text not in out + err
    assert "checkpoint" in err


def _cosign_history(copy: Path, keep_log_lines: Callable[[list[bytes]], list[bytes]]) -> str:
    """Write `cosigned/<size>` for each history checkpoint: its text, the log's signature
    lines `keep_log_lines` leaves, and a witness's cosignature; returns the witness's vkey."""
    from gateway.provenance.formats.cosignature import Cosigner

    witness = Cosigner(seeded_signer("witness.example/w1"))
    for size, path in list_history(copy):
        text, _, block = path.read_bytes().partition(b"\n\n")
        lines = keep_log_lines(block.splitlines(keepends=True))
        cosigned = witness.cosign(text.decode() + "\n", 1_700_000_000).line().encode()
        cosigned_path(copy, size).parent.mkdir(exist_ok=True)
        cosigned_path(copy, size).write_bytes(text + b"\n\n" + b"".join(lines) + cosigned)
    return witness.vkey


def _forged(line: bytes) -> bytes:
    """The log's signature line with its signature's last byte changed."""
    head, _, encoded = line.rstrip(b"\n").rpartition(b" ")
    raw = bytearray(base64.b64decode(encoded))
    raw[-1] ^= 1
    return head + b" " + base64.b64encode(bytes(raw)) + b"\n"


def test_a_cosigned_note_as_the_gateway_writes_it_verifies(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    witness = _cosign_history(copy, lambda lines: lines)
    code, out, err = _audit(
        capsys, "verify", str(copy), "--key", SIGNER.vkey, "--witness-key", witness
    )
    assert code == 0, out + err


@pytest.mark.parametrize(
    ("keep", "said"),
    [
        # the checkpoint text and a witness line, no log signature
        (lambda lines: [], "note has no signature by a trusted key"),
        # and a forged one beside the genuine one
        (lambda lines: [*lines, _forged(lines[0])], "invalid signature for key"),
    ],
    ids=["no-log-line", "a-forged-log-line"],
)
def test_a_cosigned_file_without_the_logs_own_valid_signature_fails(
    copy: Path,
    capsys: pytest.CaptureFixture[str],
    keep: Callable[[list[bytes]], list[bytes]],
    said: str,
) -> None:
    # docs/provenance.md: "The file is a valid signed note: the log's own checkpoint, byte
    # for byte, then the witness lines." Before, a file whose text matched a checkpoint of
    # the history passed without its log signature lines being looked at.
    witness = _cosign_history(copy, keep)
    code, out, err = _audit(
        capsys, "verify", str(copy), "--key", SIGNER.vkey, "--witness-key", witness
    )
    assert code == 1, out + err
    assert "FAILED: cosigned/" in err and said in err, err
