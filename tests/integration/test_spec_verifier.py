"""A real `owngate serve` process audited by the strict from-the-spec verifier
(tests/helpers/spec_verifier.py, spec_tiles.py, spec_receipts.py), as an auditor holding
only public keys and the specs would: the checkpoint and every tile and bundle over the
admin API's `/log/`, the tiles a tree does not have (404), every checkpoint seen read again
from later tiles, the client's own receipts (v1 and v2) checked with the docs' recipe and
tied to the log with the bytes sent and received, the tlog-proofs of both endpoints,
consistency between the checkpoints seen built from the tiles, a witness's cosignatures;
and the verifier refusing checkpoints and tiles the specs forbid (re-signed with the log's
key, so only the form is wrong). Gateways of their own: test_spec_verifier_edges.py.

The log is grown to exactly 256 entries, where tlog-tiles says what few writers get
right: "a tree of size 256 will be represented by a full level 0 tile and a partial
level 1 tile of width 1".
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.helpers import spec_receipts as receipts
from tests.helpers import spec_tiles as tiles
from tests.helpers import spec_verifier as spec
from tests.helpers.admin import ORIGIN, TOKENS, WITNESS, Served, serve_admin
from tests.helpers.doc_recipes import provenance_recipes
from tests.helpers.processes import KEY
from tests.helpers.spec_rig import chat, client_receipt, settle

FIRST = 10  # entries at the first checkpoint kept: five requests, two entries each
FULL = 256  # then to exactly one full tile: a partial level-1 tile of width 1 must exist


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The log at 10 entries, then at exactly 256 (read whole, and the tiles it must not
    have asked for, while it stays that size), then at 258 and 260; the notes served at
    each size kept, as an auditor keeps the checkpoints it saw."""
    directory = tmp_path_factory.mktemp("spec-verifier")
    # Appends wait 200 ms to share a write: 8 clients at once then always share batches
    # (v2 receipts), however busy the machine (at 20 ms, one loaded run saw none).
    with serve_admin(directory, witness=True, provenance={"group_commit_ms": 200}) as served:
        fetch = tiles.from_url(f"{served.admin}/log/", TOKENS["auditor"])
        keys = [spec.parse_key(served.vkey)]
        seen: dict[int, bytes] = {}
        exchanges = [chat(served, n % 2 == 1, n) for n in range(FIRST // 2)]
        seen[FIRST] = settle(served, FIRST)
        with ThreadPoolExecutor(8) as pool:  # batches of several receipts: v2 receipts
            exchanges += pool.map(lambda n: chat(served, n % 2 == 1, n), range(5, FULL // 2))
        seen[FULL] = settle(served, FULL)
        at_full = tiles.read_tree(fetch, keys, ORIGIN)
        absent = {path: fetch(path).status for path in tiles.absent_tiles(FULL)}
        caching = {
            path: fetch(path).cache for path in ("checkpoint", "tile/0/000", "tile/1/000.p/1")
        }
        for size in (FULL + 2, FULL + 4):
            exchanges.append(chat(served, False, size))
            seen[size] = settle(served, size)
        yield {
            "served": served,
            "fetch": fetch,
            "keys": keys,
            "seen": seen,
            "exchanges": exchanges,
            "at_full": at_full,
            "absent": absent,
            "caching": caching,
        }


def test_the_served_log_is_read_and_recomputed_from_the_spec(audited: dict[str, Any]) -> None:
    served: Served = audited["served"]
    tree = tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN)
    assert tree.checkpoint.size == FULL + 4 and tree.checkpoint.extensions == ()
    for entry in tree.entries:
        receipts.canonical_record(entry)
    on_disk = tiles.read_tree(tiles.from_directory(served.log), audited["keys"], ORIGIN)
    assert on_disk.checkpoint.note == tree.checkpoint.note and on_disk.entries == tree.entries


def test_a_tree_of_256_has_a_partial_level_1_tile_of_width_1(audited: dict[str, Any]) -> None:
    assert tiles.tiles_for(FULL) == [(0, 0, 256), (1, 0, 1)]
    assert audited["at_full"].checkpoint.size == FULL  # read whole, tile/1/000.p/1 included


def test_tiles_the_tree_does_not_have_are_not_served(audited: dict[str, Any]) -> None:
    assert audited["absent"] and set(audited["absent"].values()) == {404}, audited["absent"]


def test_checkpoints_seen_before_are_still_backed_by_the_tiles(audited: dict[str, Any]) -> None:
    """tlog-tiles: "Logs MUST serve partial tiles corresponding to tree sizes for which a
    checkpoint was produced, but MAY delete any partial tile once the corresponding full
    tile is available": each checkpoint seen reads whole from today's tiles."""
    for size, note in audited["seen"].items():
        tree = tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN, note)
        assert tree.checkpoint.size == size


def test_caching_headers_are_the_documented_ones(audited: dict[str, Any]) -> None:
    caching = audited["caching"]
    assert caching["checkpoint"] == "no-cache"  # tlog-tiles: mutable, not cached for long
    assert caching["tile/1/000.p/1"] == "no-cache"
    assert "immutable" in caching["tile/0/000"]  # tlog-tiles: immutable, long-lived


def test_consistency_between_the_checkpoints_seen_is_built_from_the_tiles(
    audited: dict[str, Any],
) -> None:
    tree = tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN)
    for size, note in audited["seen"].items():
        earlier = spec.parse_checkpoint(note, audited["keys"], ORIGIN)
        proof = spec.consistency_proof(size, tree.hashes)
        spec.verify_consistency(
            size, tree.checkpoint.size, proof, earlier.root, tree.checkpoint.root
        )
        if size < tree.checkpoint.size:  # the check can fail: another root at that size
            with pytest.raises(spec.SpecError):
                spec.verify_consistency(
                    size, tree.checkpoint.size, proof, bytes(32), tree.checkpoint.root
                )


def test_every_client_receipt_verifies_from_the_bytes_sent_and_received(
    audited: dict[str, Any],
) -> None:
    served: Served = audited["served"]
    tree = tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN)
    recipes = provenance_recipes()
    forms = set()
    for sent, answer in audited["exchanges"]:
        body, receipt = client_receipt(answer)
        forms.add("batch" in receipt.decode())
        receipts.verify_client_receipt(
            receipt,
            vkey=served.vkey,
            request_id=answer.headers["x-request-id"],
            sent=sent,
            body=body,
            tree=tree,
            recipes=recipes,
        )
        with pytest.raises(spec.SpecError):  # one byte more than the client received
            receipts.verify_client_receipt(
                receipt,
                vkey=served.vkey,
                request_id=answer.headers["x-request-id"],
                sent=sent,
                body=body + b" ",
                tree=tree,
                recipes=recipes,
            )
    assert forms == {False, True}  # v1 (one request at a time) and v2 (batches) receipts


def test_the_tlog_proofs_of_both_endpoints_verify(audited: dict[str, Any]) -> None:
    served: Served = audited["served"]
    keys = [spec.parse_key(served.vkey)]
    sent, answer = audited["exchanges"][2]  # a whole answer: its receipt in a header
    request_id = answer.headers["x-request-id"]
    claims = json.loads(spec.b64(answer.headers["x-owngate-receipt"]))
    proof = httpx.get(
        f"{served.process.url}/v1/provenance/proofs/{request_id}",
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert proof.status_code == 200, proof.text
    leaf = bytes.fromhex(json.loads(spec.b64(claims["payload"]))["dispatch_hash"])
    receipts.verify_tlog_proof(proof.content, keys, ORIGIN, leaf)
    stored = httpx.get(
        f"{served.process.url}/v1/provenance/receipts/{request_id}",
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert stored.status_code == 200, stored.text
    receipts.verify_client_receipt(
        stored.content,
        vkey=served.vkey,
        request_id=request_id,
        sent=sent,
        body=answer.content,
        tree=tiles.read_tree(audited["fetch"], keys, ORIGIN),
        recipes=provenance_recipes(),
    )
    found = served.get(f"/admin/v1/log/requests/{request_id}", "auditor").json()
    assert len(found["records"]) == 2  # its dispatch and its completion
    for record in found["records"]:
        _, extra, _ = receipts.verify_tlog_proof(record["proof"].encode(), keys, ORIGIN)
        assert extra is not None and receipts.canonical_record(extra)["request_id"] == request_id


def test_the_witness_cosignatures_verify_from_the_spec(audited: dict[str, Any]) -> None:
    served: Served = audited["served"]
    witness = spec.parse_key(WITNESS.vkey, 0x04)
    cosigned = sorted((served.log / "cosigned").iterdir())
    assert cosigned
    for file in cosigned:
        note = file.read_bytes()
        checkpoint = spec.parse_checkpoint(note, [spec.parse_key(served.vkey)], ORIGIN)
        assert file.name == f"{checkpoint.size:020d}"
        receipts.verify_cosignature(note, witness)


def _resign(text: bytes, directory: Path, key_id: bytes | None = None) -> bytes:
    """`text` signed by the log's own key (read from its Go signer-key file, as its holder
    can): a note whose signature verifies, so only its format is wrong."""
    name, hexid, material = (directory / "log.key").read_text().strip().split("+", 4)[2:]
    private = Ed25519PrivateKey.from_private_bytes(spec.b64(material)[1:])
    blob = (key_id or bytes.fromhex(hexid)) + private.sign(text)
    return text + f"\n\u2014 {name} {base64.b64encode(blob).decode()}\n".encode()


def _noncanonical(text: bytes) -> bytes:
    """The root line's 32 bytes in base64 with a pad bit set (RFC 4648 section 3.5)."""
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    root = text.split(b"\n")[2]
    changed = root[:-2] + alphabet[alphabet.index(root[-2:-1]) + 1 :][:1] + b"="
    assert spec.b64(root.decode()) == base64.b64decode(changed)  # the same bytes, another spelling
    return text.replace(root, changed)


Change = Callable[[bytes, Path], bytes]
NOTE_CHANGES: dict[str, Change] = {
    "size with a leading zero": lambda t, d: _resign(t.replace(b"\n260\n", b"\n0260\n"), d),
    "root in non-canonical base64": lambda t, d: _resign(_noncanonical(t), d),
    "a trailing space": lambda t, d: _resign(t.replace(b"\n260\n", b"\n260 \n"), d),
    "an empty extension line": lambda t, d: _resign(t + b"\n", d),
    "a carriage return": lambda t, d: _resign(t.replace(b"\n260\n", b"\n260\r\n"), d),
    "a 31-byte root": lambda t, d: _resign(
        t.replace(t.split(b"\n")[2], base64.b64encode(bytes(31))), d
    ),
    "no final newline": lambda t, d: _resign(t, d)[:-1],
    "a duplicated signature line": lambda t, d: _resign(t, d) + _resign(t, d).split(b"\n\n")[1],
    "a wrong key id": lambda t, d: _resign(t, d, key_id=b"\x00\x00\x00\x00"),
    "another origin": lambda t, d: _resign(t.replace(ORIGIN.encode(), b"other.test/log"), d),
    "another root": lambda t, d: _resign(
        t.replace(t.split(b"\n")[2], base64.b64encode(bytes(32))), d
    ),
}


@pytest.mark.parametrize("change", NOTE_CHANGES)
def test_the_verifier_refuses_a_checkpoint_the_specs_forbid(
    audited: dict[str, Any], change: str
) -> None:
    directory = audited["served"].log.parent
    text = spec.split_note(audited["seen"][FULL + 4]).text
    assert tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN, _resign(text, directory))
    changed = NOTE_CHANGES[change](text, directory)
    with pytest.raises(spec.SpecError):
        tiles.read_tree(audited["fetch"], audited["keys"], ORIGIN, changed)


def _edit(path: str, edit: Callable[[bytes], bytes | None]) -> Callable[[Path], None]:
    def change(log: Path) -> None:
        edited = edit((log / path).read_bytes())
        if edited is None:
            (log / path).unlink()
        else:
            (log / path).write_bytes(edited)

    return change


TILE_CHANGES: dict[str, Callable[[Path], None]] = {
    "a full tile a hash short": _edit("tile/0/000", lambda b: b[:-32]),
    "a full tile a byte long": _edit("tile/0/000", lambda b: b + b"\0"),
    "a level-1 partial tile missing": _edit("tile/1/000.p/1", lambda b: None),
    "a level-1 hash changed": _edit("tile/1/000.p/1", lambda b: bytes(32)),
    "a partial tile missing": _edit("tile/0/001.p/4", lambda b: None),
    "a bundle entry changed": _edit("tile/entries/000", lambda b: b.replace(b'"v":1', b'"v":2', 1)),
    "a bundle with an entry more": _edit("tile/entries/001.p/4", lambda b: b + b"\0\2{}"),
    "a bundle cut short": _edit("tile/entries/001.p/4", lambda b: b[:-1]),
}


@pytest.mark.parametrize("change", TILE_CHANGES)
def test_the_verifier_refuses_tiles_the_specs_forbid(
    audited: dict[str, Any], change: str, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    shutil.copytree(audited["served"].log / "tile", log / "tile")
    (log / "checkpoint").write_bytes(audited["seen"][FULL + 4])
    assert tiles.read_tree(tiles.from_directory(log), audited["keys"], ORIGIN)
    TILE_CHANGES[change](log)
    with pytest.raises(spec.SpecError):
        tiles.read_tree(tiles.from_directory(log), audited["keys"], ORIGIN)
