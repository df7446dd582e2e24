"""Data-driven tests from independent implementations (sources in tests/vectors/README.md).

transparency-dev/merkle proof vectors (every wantErr case rejected), the Tessera tlog-tiles
test log (checkpoints, tiles, bundles, proofs), and Go sumdb/note keys and signatures.
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import (
    Checkpoint,
    KeyFormatError,
    MalformedError,
    ProofError,
    SignatureError,
    Signer,
    Verifier,
    open_checkpoint,
    open_note,
    sign_note,
)
from gateway.provenance.formats.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_from_leaves,
    verify_consistency,
    verify_inclusion,
)
from gateway.provenance.formats.tiles import TileReader, decode_bundle, entries_path, tile_path
from tests.helpers.paths import VECTORS

TESSERA = VECTORS / "tessera-log"
TESSERA_VKEY = "example.com/log/testdata+33d7b496+AeHTu4Q3hEIMHNqc6fASMsq3rKNx280NI+oO5xCFkkSx"


def _cases(kind: str) -> list[Any]:
    files = sorted((VECTORS / "merkle" / kind).rglob("*.json"))
    assert len(files) > 50
    return [pytest.param(path, id=str(path.relative_to(VECTORS / "merkle"))) for path in files]


def _b64(value: str) -> bytes:
    return base64.b64decode(value)


def _proof(items: list[str] | None) -> list[bytes]:
    return [_b64(item) for item in items or []]


@pytest.mark.parametrize("path", _cases("inclusion"))
def test_transparency_dev_inclusion_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        _b64(case["leafHash"]),
        case["leafIdx"],
        case["treeSize"],
        _proof(case["proof"]),
        _b64(case["root"]),
    )
    if case["wantErr"]:
        with pytest.raises(ProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", _cases("consistency"))
def test_transparency_dev_consistency_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        case["size1"],
        case["size2"],
        _proof(case["proof"]),
        _b64(case["root1"]),
        _b64(case["root2"]),
    )
    if case["wantErr"]:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def test_vector_suite_has_error_cases() -> None:
    cases = [json.loads(p.read_text()) for p in (VECTORS / "merkle").rglob("*.json")]
    assert sum(case["wantErr"] for case in cases) > 150
    assert sum(not case["wantErr"] for case in cases) >= 10


# --- the Tessera tlog-tiles log ------------------------------------------------------------


def _tessera_checkpoints() -> list[Checkpoint]:
    verifier = Verifier(TESSERA_VKEY)
    opened = []
    for size in range(16):
        note = (TESSERA / f"checkpoint.{size}").read_bytes()
        opened.append(open_checkpoint(note, [verifier], origin="example.com/log/testdata"))
    return [signed.checkpoint for signed in opened]


def test_tessera_checkpoints_verify_and_match_the_served_one() -> None:
    checkpoints = _tessera_checkpoints()
    assert [c.size for c in checkpoints] == list(range(16))
    latest = open_checkpoint((TESSERA / "checkpoint").read_bytes(), [Verifier(TESSERA_VKEY)])
    assert latest.checkpoint == checkpoints[15]


def test_tessera_bundles_hash_to_tiles_and_roots() -> None:
    checkpoints = _tessera_checkpoints()
    for size in range(1, 16):
        entries = decode_bundle((TESSERA / entries_path(0, size)).read_bytes())
        tile = (TESSERA / tile_path(0, 0, size)).read_bytes()
        leaves = [leaf_hash(entry) for entry in entries]
        assert b"".join(leaves) == tile
        assert root_from_leaves(leaves) == checkpoints[size].root


def test_tessera_inclusion_and_consistency_proofs_from_tiles() -> None:
    checkpoints = _tessera_checkpoints()
    entries = decode_bundle((TESSERA / entries_path(0, 15)).read_bytes())
    for size in range(1, 16):
        reader = TileReader(TESSERA, size)
        root = checkpoints[size].root
        for index in range(size):
            proof = inclusion_proof(index, size, reader.node)
            verify_inclusion(leaf_hash(entries[index]), index, size, proof, root)
    for size1, size2 in itertools.combinations(range(1, 16), 2):
        proof = consistency_proof(size1, size2, TileReader(TESSERA, size2).node)
        verify_consistency(size1, size2, proof, checkpoints[size1].root, checkpoints[size2].root)


def test_tessera_checkpoint_rejects_a_flipped_byte_and_another_key() -> None:
    note = bytearray((TESSERA / "checkpoint.15").read_bytes())
    note[len("example.com/log/testdata\n1")] ^= 0x01  # size 15 -> 14
    with pytest.raises(SignatureError, match="invalid signature"):
        open_checkpoint(bytes(note), [Verifier(TESSERA_VKEY)])
    stranger = Signer.from_seed("example.com/log/testdata", b"\x07" * 32)
    with pytest.raises(SignatureError, match="no signature by a trusted key"):
        open_checkpoint((TESSERA / "checkpoint.15").read_bytes(), [stranger.verifier()])


# --- Go sumdb/note -------------------------------------------------------------------------

NOTES = (VECTORS / "notes.txt").read_text(encoding="utf-8")
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)


def _note_lines(prefix: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in NOTES.splitlines() if line.startswith(prefix)]


def _signature_lines() -> list[str]:
    return [line + "\n" for line in NOTES.splitlines() if line.startswith("\u2014 ")]


def test_go_signer_key_derives_the_go_verifier_key() -> None:
    (skey,) = _note_lines("signer key:")
    vkeys = _note_lines("verifier key:")
    assert Signer.from_skey(skey).vkey == vkeys[0]
    assert Verifier(vkeys[0]).name == "PeterNeumann"


def test_go_signatures_verify_and_ours_are_identical() -> None:
    vkeys = _note_lines("verifier key:")
    peter, enoch = _signature_lines()
    note = open_note((TEXT + "\n" + peter + enoch).encode(), [Verifier(k) for k in vkeys])
    assert [s.name for s in note.verified] == ["PeterNeumann", "EnochRoot"]
    # Ed25519 is deterministic: signing the text with the Go signer key gives Go's bytes.
    (skey,) = _note_lines("signer key:")
    assert sign_note(TEXT, [Signer.from_skey(skey)]) == (TEXT + "\n" + peter).encode()
    # A key that did not sign is reported as unverified, not as an error, if another did.
    note = open_note((TEXT + "\n" + peter + enoch).encode(), [Verifier(vkeys[0])])
    assert [s.name for s in note.unverified] == ["EnochRoot"]


def _mutations(vkey: str) -> list[str]:
    cut = [vkey[:i] for i in range(len(vkey))]
    flipped = [vkey[:i] + chr(ord(vkey[i]) ^ 1) + vkey[i + 1 :] for i in range(len(vkey))]
    return cut + flipped


def test_go_rejects_truncated_or_altered_verifier_keys() -> None:
    vkey = _note_lines("verifier key:")[0]
    accepted = []
    for mutation in _mutations(vkey):
        try:
            Verifier(mutation)
        except KeyFormatError:
            continue
        accepted.append(mutation)
    # Flipping a base64 bit of padding-free text can decode to the same bytes only when
    # the key id still matches, which SHA-256 rules out.
    assert accepted == []


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda note: note.replace("\n\n", "\n"), MalformedError),  # no blank line
        (lambda note: note[:-1], MalformedError),  # last line without newline
        (lambda note: "\x01" + note, MalformedError),  # control character
        (lambda note: note + "extra line\n", MalformedError),  # non-signature line
        (lambda note: note.replace("PeterNeumann x", "Peter+Neumann x"), MalformedError),
        (lambda note: note.replace("PeterNeumann x", "Peter Neumann x"), MalformedError),
        (lambda note: note.replace("ZInNIu", "ZInNIv"), SignatureError),  # altered signature
        (lambda note: note.replace("answer", "Answer"), SignatureError),  # altered text
    ],
)
def test_go_note_rejections(mutate: Any, error: type[Exception]) -> None:
    vkey = _note_lines("verifier key:")[0]
    note = TEXT + "\n" + _signature_lines()[0]
    open_note(note.encode(), [Verifier(vkey)])
    with pytest.raises(error):
        open_note(mutate(note).encode(), [Verifier(vkey)])


def test_go_rejects_invalid_utf8_and_too_many_signatures() -> None:
    vkey = _note_lines("verifier key:")[0]
    line = _signature_lines()[0]
    with pytest.raises(MalformedError, match="UTF-8"):
        open_note(b"\xff" + (TEXT + "\n" + line).encode(), [Verifier(vkey)])
    with pytest.raises(MalformedError, match="more than 100"):
        open_note((TEXT + "\n" + line * 101).encode(), [Verifier(vkey)])


def test_invalid_signature_message_names_the_key() -> None:
    vkey = _note_lines("verifier key:")[0]
    note = TEXT + "\n" + _signature_lines()[0].replace("ZInNIu", "ZInNIv")
    with pytest.raises(SignatureError, match=r"invalid signature for key PeterNeumann\+c74f20a3"):
        open_note(note.encode(), [Verifier(vkey)])


def test_every_line_by_a_known_key_must_verify_a_repeat_too() -> None:
    """C2SP signed-note: a line whose name and key id match a known key MUST be verified,
    and one that fails rejects the note. Go's sumdb/note skips a repeated known key
    unread, and so did owngate: a checkpoint with the log's valid line followed by a line
    under the same name and key id from another key (all a key-id collision buys) passed,
    while the same lines in the other order failed. The very line twice still verifies."""
    vkey = _note_lines("verifier key:")[0]
    line = _signature_lines()[0]
    forged = line.replace("ZInNIu", "ZInNIv")  # same name and key id, another signature
    assert open_note((TEXT + "\n" + line + line).encode(), [Verifier(vkey)]).verified
    for lines in (line + forged, forged + line):
        with pytest.raises(SignatureError, match=r"invalid signature for key PeterNeumann"):
            open_note((TEXT + "\n" + lines).encode(), [Verifier(vkey)])
