"""The from-the-spec verifier (tests/helpers/c2sp_verifier.py) against the ground truth:
the transparency-dev/merkle proof vectors, the Tessera tlog-tiles test log and Go's
sumdb/note keys and signatures (tests/vectors/, sources in its README), and the C2SP
rules on notes and checkpoints that those vectors do not spell out."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.helpers.c2sp_verifier import (
    NoteKey,
    Rejected,
    consistency_proof,
    from_directory,
    inclusion_proof,
    leaf_hash,
    note_key,
    open_checkpoint,
    open_note,
    read_log,
    root_of,
    tile_path,
    verify_consistency,
    verify_inclusion,
    verify_tlog_proof,
)
from tests.helpers.paths import VECTORS

TESSERA = VECTORS / "tessera-log"
TESSERA_KEY = "example.com/log/testdata+33d7b496+AeHTu4Q3hEIMHNqc6fASMsq3rKNx280NI+oO5xCFkkSx"
NOTES = (VECTORS / "notes.txt").read_text(encoding="utf-8")
PETER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    b"If you think cryptography is the answer to your problem,\n"
    b"then you don't know what your problem is.\n"
)


def _line(name: str) -> bytes:
    line = next(x for x in NOTES.splitlines() if x.startswith(f"\u2014 {name} "))
    return line.encode() + b"\n"


def _cases(kind: str) -> list[Any]:
    files = sorted((VECTORS / "merkle" / kind).rglob("*.json"))
    assert len(files) > 50
    return [pytest.param(path, id=str(path.relative_to(VECTORS / "merkle"))) for path in files]


def _b64s(items: list[str] | None) -> list[bytes]:
    return [base64.b64decode(item) for item in items or []]


@pytest.mark.parametrize("path", _cases("inclusion"))
def test_inclusion_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        base64.b64decode(case["leafHash"]),
        case["leafIdx"],
        case["treeSize"],
        _b64s(case["proof"]),
        base64.b64decode(case["root"]),
    )
    if case["wantErr"]:
        with pytest.raises(Rejected):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", _cases("consistency"))
def test_consistency_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        case["size1"],
        case["size2"],
        _b64s(case["proof"]),
        base64.b64decode(case["root1"]),
        base64.b64decode(case["root2"]),
    )
    if case["wantErr"]:
        with pytest.raises(Rejected):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def _tessera(size: int) -> Any:
    files = from_directory(TESSERA)
    return lambda path: files(f"checkpoint.{size}" if path == "checkpoint" else path)


def test_every_tessera_checkpoint_verifies_with_its_tiles_and_proofs() -> None:
    key = note_key(TESSERA_KEY)
    assert (TESSERA / "checkpoint").read_bytes() == (TESSERA / "checkpoint.15").read_bytes()
    _, entries = read_log(_tessera(15), [key], "example.com/log/testdata")
    leaves = [leaf_hash(entry) for entry in entries]
    roots = {}
    for size in range(16):
        checkpoint, mine = read_log(_tessera(size), [key])
        assert (checkpoint.size, mine) == (size, entries[:size])
        roots[size] = checkpoint.root
    for size in range(1, 16):
        for index in range(size):
            proof = inclusion_proof(leaves[:size], index)
            verify_inclusion(leaves[index], index, size, proof, roots[size])
        for old in range(1, size + 1):
            proof = consistency_proof(leaves[:size], old)
            verify_consistency(old, size, proof, roots[old], roots[size])


def test_proofs_from_leaves_verify_and_any_changed_hash_fails() -> None:
    leaves = [leaf_hash(b"%d" % i) for i in range(40)]
    for size in range(1, 41):
        root = root_of(leaves[:size])
        for index in range(size):
            proof = inclusion_proof(leaves[:size], index)
            verify_inclusion(leaves[index], index, size, proof, root)
            if proof:
                with pytest.raises(Rejected):
                    verify_inclusion(leaves[index], index, size, [b"\0" * 32, *proof[1:]], root)
        for old in range(1, size):
            proof = consistency_proof(leaves[:size], old)
            verify_consistency(old, size, proof, root_of(leaves[:old]), root)
            with pytest.raises(Rejected):
                verify_consistency(old, size, proof[:-1], root_of(leaves[:old]), root)


def test_tile_paths_follow_the_tlog_tiles_index_encoding() -> None:
    assert tile_path(0, 0) == "tile/0/000"
    assert tile_path(0, 1, 44) == "tile/0/001.p/44"
    assert tile_path(1, 1234067) == "tile/1/x001/x234/067"
    assert tile_path("entries", 1000, 3) == "tile/entries/x001/000.p/3"
    assert tile_path(2, 999999) == "tile/2/x999/999"


def test_a_tessera_tile_or_bundle_changed_is_rejected(tmp_path: Path) -> None:
    key = note_key(TESSERA_KEY)
    for target in ("tile/0/000.p/15", "tile/entries/000.p/15"):
        copy = tmp_path / target.replace("/", "_")
        shutil.copytree(TESSERA, copy)
        data = bytearray((copy / target).read_bytes())
        data[-1] ^= 1
        (copy / target).write_bytes(bytes(data))
        with pytest.raises(Rejected):
            read_log(from_directory(copy), [key])


# --- Go's sumdb/note vectors, and the C2SP rules ---------------------------------------


def test_go_notes_verify_by_either_key_and_both() -> None:
    peter, enoch = note_key(PETER), note_key(ENOCH)
    for lines, keys in (
        (_line("PeterNeumann"), [peter]),
        (_line("EnochRoot"), [enoch]),
        (_line("PeterNeumann") + _line("EnochRoot"), [peter, enoch]),
        (_line("EnochRoot") + _line("PeterNeumann"), [peter]),  # the other key is unknown
    ):
        text, signers = open_note(TEXT + b"\n" + lines, keys)
        assert text == TEXT and {s.name for s in signers} == {k.name for k in keys}


@pytest.mark.parametrize(
    "vkey",
    [
        PETER[:-1],
        PETER.replace("c74f20a3", "c74f20a4"),
        PETER.replace("Peter", "Pete"),
        PETER.replace("+ARpc", "+AXpc"),
        "PeterNeumann+c74f20a3",
        PETER + "+x",
    ],
)
def test_go_rejects_truncated_or_altered_verifier_keys(vkey: str) -> None:
    with pytest.raises(Rejected):
        note_key(vkey)


GOOD = TEXT + b"\n" + _line("PeterNeumann")


@pytest.mark.parametrize(
    "note",
    [
        pytest.param(TEXT + _line("PeterNeumann"), id="no-blank-line"),
        pytest.param(GOOD[:-1], id="no-final-newline"),
        pytest.param(b"\x01" + GOOD, id="leading-0x01"),
        pytest.param(b"\xff" + GOOD, id="leading-0xff"),
        pytest.param(GOOD.replace(b"\xe2\x80\x94 Peter", b"\xe2\x80\x94 Pe ter"), id="name-space"),
        pytest.param(GOOD.replace(b"\xe2\x80\x94 Peter", b"\xe2\x80\x94 Pe+ter"), id="name-plus"),
        pytest.param(GOOD + b"not a signature\n", id="extra-line"),
        pytest.param(GOOD.replace(b"x08go", b"x08gp"), id="altered-signature"),
        pytest.param(GOOD + _line("PeterNeumann") * 100, id="101-signatures"),
        pytest.param(GOOD.replace(b"\n", b"\r\n"), id="crlf"),
        pytest.param(TEXT + b"\n" + _line("EnochRoot"), id="only-unknown-keys"),
    ],
)
def test_go_note_rejections(note: bytes) -> None:
    with pytest.raises(Rejected):
        open_note(note, [note_key(PETER)])


def test_many_signatures_up_to_the_spec_minimum_are_accepted() -> None:
    note = TEXT + b"\n" + _line("EnochRoot") * 15 + _line("PeterNeumann")
    assert open_note(note, [note_key(PETER)])[0] == TEXT


# --- checkpoints signed by a key of our own -------------------------------------------


def _key(name: str) -> tuple[Ed25519PrivateKey, NoteKey]:
    private = Ed25519PrivateKey.generate()
    raw = b"\x01" + private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    hexid = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4].hex()
    return private, note_key(f"{name}+{hexid}+{base64.b64encode(raw).decode()}")


def _sign(text: bytes, private: Ed25519PrivateKey, key: NoteKey) -> bytes:
    blob = key.key_id + private.sign(text)
    return f"\u2014 {key.name} {base64.b64encode(blob).decode()}\n".encode()


ROOT = base64.b64encode(hashlib.sha256(b"r").digest())


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"log.example\n007\n" + ROOT + b"\n", id="size-leading-zero"),
        pytest.param(b"log.example\n+7\n" + ROOT + b"\n", id="size-plus"),
        pytest.param(b"log.example\n7 \n" + ROOT + b"\n", id="size-trailing-space"),
        pytest.param(b"log.example\n7\n" + ROOT[:-4] + b"\n", id="root-short"),
        pytest.param(b"log.example\n7\n" + ROOT + b"AAAA\n", id="root-long"),
        pytest.param(b"log.example\n7\n" + ROOT[:-1] + b"\n", id="root-unpadded"),
        pytest.param(b"log.example \n7\n" + ROOT + b"\n", id="origin-trailing-space"),
        pytest.param(b"log.example\n7\n" + ROOT + b"\n\nextension\n", id="empty-extension"),
        pytest.param(b"log.example\n7\n", id="two-lines"),
    ],
)
def test_checkpoint_bodies_the_spec_refuses(text: bytes) -> None:
    private, key = _key("log.example")
    with pytest.raises(Rejected):
        open_checkpoint(text + b"\n" + _sign(text, private, key), [key])


def test_checkpoint_signatures_by_unknown_keys_are_ignored_in_any_order() -> None:
    private, key = _key("log.example")
    other_private, other = _key("log.example")  # same name, another key id
    text = b"log.example\n7\n" + ROOT + b"\nan extension line\n"
    mine, theirs = _sign(text, private, key), _sign(text, other_private, other)
    for signatures in (mine + theirs, theirs + mine):
        checkpoint = open_checkpoint(text + b"\n" + signatures, [key], "log.example")
        assert (checkpoint.size, checkpoint.extensions) == (7, ("an extension line",))
    bad = _sign(b"log.example\n8\n" + ROOT + b"\n", private, key)
    with pytest.raises(Rejected, match="invalid signature"):  # a known key's line must verify
        open_checkpoint(text + b"\n" + mine + bad, [key])


def test_a_tlog_proof_verifies_and_a_changed_line_fails() -> None:
    private, key = _key("log.example")
    entries = [b"entry %d" % i for i in range(5)]
    leaves = [leaf_hash(e) for e in entries]
    text = b"log.example\n5\n" + base64.b64encode(root_of(leaves)) + b"\n"
    note = text + b"\n" + _sign(text, private, key)
    path = b"".join(base64.b64encode(h) + b"\n" for h in inclusion_proof(leaves, 3))
    proof = b"c2sp.org/tlog-proof@v1\nextra " + base64.b64encode(entries[3])
    proof += b"\nindex 3\n" + path + b"\n" + note
    assert verify_tlog_proof(proof, [key])[0] == 3
    for bad in (
        proof.replace(b"index 3", b"index 03"),
        proof.replace(b"index 3", b"index 2"),
        proof.replace(b"tlog-proof@v1", b"tlog-proof@v2"),
        proof.replace(b"\n\n", b"\nAAAA\n\n", 1),
    ):
        with pytest.raises(Rejected):
            verify_tlog_proof(bad, [key])


def test_a_tlog_cosignature_verifies_and_its_timestamp_is_signed() -> None:
    private, key = _key("log.example")
    witness = Ed25519PrivateKey.generate()
    raw = b"\x04" + witness.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    hexid = hashlib.sha256(b"w.example\n" + raw).digest()[:4]
    vkey = f"w.example+{hexid.hex()}+{base64.b64encode(raw).decode()}"
    text = b"log.example\n7\n" + ROOT + b"\n"

    def cosign(stamp: int, signed: int) -> bytes:
        sig = witness.sign(b"cosignature/v1\ntime %d\n" % signed + text)
        blob = hexid + stamp.to_bytes(8, "big") + sig
        return b"\xe2\x80\x94 w.example " + base64.b64encode(blob) + b"\n"

    note = text + b"\n" + _sign(text, private, key) + cosign(1679315147, 1679315147)
    assert {k.name for k in open_note(note, [key, note_key(vkey)])[1]} == {
        "log.example",
        "w.example",
    }
    with pytest.raises(Rejected, match="invalid signature"):
        open_note(
            note.replace(cosign(1679315147, 1679315147), cosign(1679315148, 1679315147)),
            [key, note_key(vkey)],
        )
    with pytest.raises(Rejected, match="no verified signature by a log key"):
        open_checkpoint(text + b"\n" + cosign(5, 5), [note_key(vkey)])
