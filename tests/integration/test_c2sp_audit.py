"""A real `owngate serve` log read by the from-the-spec verifier
(tests/helpers/c2sp_verifier.py, which imports nothing of `gateway`) and by `owngate audit
verify`: 150 requests (300 entries: a full tile, partial tiles at levels 0 and 1, some
270 checkpoints), read over the admin API's tlog-tiles `/log/` and from the directory,
its tlog-proofs and its witness's cosignatures. Then each tampering an auditor must catch
is applied to a copy, and both verifiers must refuse it, with the reason; the changes the
C2SP specs allow (signatures by unknown keys, in any order; extension lines) both accept.
"""

from __future__ import annotations

import base64
import contextlib
import io
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.helpers import c2sp_verifier as c2sp
from tests.helpers.admin import ORIGIN, TOKENS, WITNESS, bearer, serve_admin
from tests.helpers.provenance import run_audit

REQUESTS = 150  # two entries each: 300, one full tile and a partial one of 44
SIZE = 2 * REQUESTS
EARLIER = 280  # a checkpoint signed on the way: its partial tiles are `.p/24`


@dataclass(frozen=True)
class Produced:
    log: Path
    vkey: str
    signer: Ed25519PrivateKey  # the log's key, read from its Go signer-key file
    served: tuple[c2sp.Checkpoint, list[bytes]]  # read over HTTP from /log/
    proofs: list[tuple[bytes, bytes]]  # (tlog-proof, record) from the admin API


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Produced:
    directory = tmp_path_factory.mktemp("c2sp-audit")
    with serve_admin(directory, witness=True) as served:
        answers: list[httpx.Response] = []
        for count, size in ((EARLIER // 2, EARLIER), (REQUESTS - EARLIER // 2, SIZE)):
            with ThreadPoolExecutor(8) as pool:
                answers += pool.map(lambda _: served.chat(), range(count))
            served.wait_for_size(size)  # nothing else is logged: a checkpoint at `size`
        assert all(answer.status_code == 200 for answer in answers)
        ids = [answer.headers["x-request-id"] for answer in answers]
        fetch = c2sp.from_url(f"{served.admin}/log/", TOKENS["auditor"])
        read = c2sp.read_log(fetch, [c2sp.note_key(served.vkey)], ORIGIN)
        found = httpx.get(
            f"{served.admin}/admin/v1/log/requests/{ids[100]}", headers=bearer("auditor")
        ).json()
        proofs = [
            (p["proof"].encode(), base64.b64decode(p["proof"].split("\nextra ")[1].split()[0]))
            for p in found["records"]
        ]
    seed = (directory / "log.key").read_text().strip().split("+", 4)[4]
    signer = Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed)[1:])
    return Produced(directory / "log", served.vkey, signer, read, proofs)


def _owngate(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = run_audit(list(argv))
    return code, out.getvalue()


def _owngate_verify(log: Path, vkey: str) -> tuple[int, str]:
    return _owngate("verify", str(log), "--key", vkey, "--origin", ORIGIN)


def _log_copy(produced: Produced, tmp_path: Path) -> Path:
    """A copy of the produced log to change, its lock file left behind."""
    log = tmp_path / "log"
    shutil.copytree(produced.log, log, ignore=shutil.ignore_patterns(".lock"))
    return log


def _history(log: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((log / "checkpoints").iterdir())]


def _spec_verify(log: Path, vkey: str) -> list[bytes]:
    """Every checkpoint the log ever signed (its `checkpoints/` history, the served one
    last), each verified from its tiles, and each consistent with the one before."""
    key, fetch = c2sp.note_key(vkey), c2sp.from_directory(log)
    checkpoint, entries = c2sp.read_log(fetch, [key], ORIGIN)
    leaves = [c2sp.leaf_hash(entry) for entry in entries]
    previous = None
    for note in _history(log):
        old, _ = c2sp.read_log(fetch, [key], ORIGIN, note=note)
        if previous is not None and previous.size:
            proof = c2sp.consistency_proof(leaves[: old.size], previous.size)
            c2sp.verify_consistency(previous.size, old.size, proof, previous.root, old.root)
        previous = old
    assert previous == checkpoint, "the served checkpoint is not the newest one signed"
    return entries


def test_the_log_verifies_from_the_spec_over_http_on_disk_and_by_owngate(
    produced: Produced,
) -> None:
    log = produced.log
    checkpoint, entries = produced.served
    assert checkpoint.size == SIZE and checkpoint.extensions == ()
    assert _spec_verify(log, produced.vkey) == entries
    for path in ("tile/0/000", "tile/0/001.p/44", "tile/1/000.p/1", "tile/entries/001.p/44"):
        assert (log / path).is_file(), path
    assert len(_history(log)) > 2 and (log / "checkpoints" / f"{EARLIER:020d}").is_file()
    assert _owngate_verify(log, produced.vkey)[0] == 0


def test_the_tlog_proofs_verify_from_the_spec(produced: Produced) -> None:
    key = c2sp.note_key(produced.vkey)
    _, entries = produced.served
    assert len(produced.proofs) == 2
    for proof, record in produced.proofs:
        index, checkpoint, extra = c2sp.verify_tlog_proof(proof, [key], ORIGIN)
        assert extra == record == entries[index] and checkpoint.size <= SIZE


def test_the_witness_cosignatures_verify_from_the_spec(produced: Produced) -> None:
    log_key, witness = c2sp.note_key(produced.vkey), c2sp.note_key(WITNESS.vkey)
    assert witness.kind == c2sp.COSIGNATURE
    cosigned = sorted((produced.log / "cosigned").iterdir())
    assert cosigned
    for path in cosigned:
        _, signers = c2sp.open_note(path.read_bytes(), [log_key, witness])
        assert {key.name for key in signers} == {log_key.name, witness.name}, path.name
    code, out = _owngate("verify", str(produced.log), "--key", produced.vkey,
                         "--witness-key", WITNESS.vkey)  # fmt: skip
    assert code == 0, out


# --- tampering ------------------------------------------------------------------------

Change = Callable[[Path, "Produced"], None]


def _edit(path: str, edit: Callable[[bytes], bytes]) -> Change:
    def change(log: Path, _: Produced) -> None:
        (log / path).write_bytes(edit((log / path).read_bytes()))

    return change


def _flip(at: int) -> Callable[[bytes], bytes]:
    return lambda data: data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def _note(make: Callable[[bytes, bytes, Produced], bytes]) -> Change:
    """Replace the newest checkpoint, in `checkpoint` and in its history file, by what
    `make(text, signature lines, produced)` gives."""

    def change(log: Path, produced: Produced) -> None:
        text, _, signatures = (log / "checkpoint").read_bytes().partition(b"\n\n")
        note = make(text + b"\n", signatures, produced)
        (log / "checkpoint").write_bytes(note)
        (log / "checkpoints" / f"{SIZE:020d}").write_bytes(note)

    return change


def _signed(text: bytes, produced: Produced) -> bytes:
    """`text` signed by the log's own key (what a writer with a bug, or its key, makes)."""
    key = c2sp.note_key(produced.vkey)
    blob = base64.b64encode(key.key_id + produced.signer.sign(text))
    return text + b"\n\xe2\x80\x94 " + key.name.encode() + b" " + blob + b"\n"


OTHER = Ed25519PrivateKey.generate()


def _line(text: bytes, name: str, key_id: bytes, private: Ed25519PrivateKey = OTHER) -> bytes:
    blob = base64.b64encode(key_id + private.sign(text))
    return "\u2014 ".encode() + name.encode() + b" " + blob + b"\n"


def _own_id(produced: Produced) -> bytes:
    return c2sp.note_key(produced.vkey).key_id


def _root(text: bytes, length: int) -> bytes:
    lines = text.split(b"\n")
    root = base64.b64decode(lines[2])
    lines[2] = base64.b64encode((root + b"\0")[:length])
    return b"\n".join(lines)


TAMPERED: dict[str, Change] = {
    "a byte flipped in the full entry bundle": _edit("tile/entries/000", _flip(100)),
    "a byte flipped in the partial entry bundle": _edit("tile/entries/001.p/44", _flip(100)),
    "a byte flipped in a level-0 tile": _edit("tile/0/000", _flip(5)),
    "a byte flipped in the level-1 partial tile": _edit("tile/1/000.p/1", _flip(5)),
    "the partial tile cut by a hash": _edit("tile/0/001.p/44", lambda d: d[:-32]),
    "the partial tile cut by a byte": _edit("tile/0/001.p/44", lambda d: d[:-1]),
    "the partial bundle cut by a byte": _edit("tile/entries/001.p/44", lambda d: d[:-1]),
    "a full tile's worth under the .p path": _edit(
        "tile/0/001.p/44", lambda d: (d * 6)[: 256 * 32]
    ),
    "an entry appended to the partial bundle": _edit(
        "tile/entries/001.p/44", lambda d: d + b"\x00\x02{}"
    ),
    "an older checkpoint's partial tile altered": _edit("tile/0/001.p/24", _flip(5)),
    "an older checkpoint's partial bundle deleted": lambda log, _: (
        log / "tile/entries/001.p/24"
    ).unlink(),
    "the level-1 partial tile deleted": lambda log, _: (log / "tile/1/000.p/1").unlink(),
    "an unknown key's line first, the log's line forged": _note(
        lambda t, s, p: (
            t + b"\n" + _line(t, "w.example", b"\1\2\3\4") + _line(t, ORIGIN, _own_id(p))
        )
    ),
    "origin with a trailing space": _note(
        lambda t, s, p: t.replace(b"log\n", b"log \n", 1) + b"\n" + s
    ),
    "origin with a trailing space, re-signed": _note(
        lambda t, s, p: _signed(t.replace(b"log\n", b"log \n", 1), p)
    ),
    "size with a leading zero, re-signed": _note(
        lambda t, s, p: _signed(t.replace(b"\n300\n", b"\n0300\n"), p)
    ),
    "size with a '+', re-signed": _note(
        lambda t, s, p: _signed(t.replace(b"\n300\n", b"\n+300\n"), p)
    ),
    "a 31-byte root, re-signed": _note(lambda t, s, p: _signed(_root(t, 31), p)),
    "a 33-byte root, re-signed": _note(lambda t, s, p: _signed(_root(t, 33), p)),
    "an extension line, not re-signed": _note(lambda t, s, p: t + b"ext\n\n" + s),
    "a line after the signatures": _note(lambda t, s, p: t + b"\n" + s + b"extra\n"),
    "a blank line at the end": _note(lambda t, s, p: t + b"\n" + s + b"\n"),
    "CRLF line ends": _note(lambda t, s, p: (t + b"\n" + s).replace(b"\n", b"\r\n")),
    "CRLF line ends, re-signed": _note(lambda t, s, p: _signed(t.replace(b"\n", b"\r\n"), p)),
    "a byte that is not UTF-8": _note(lambda t, s, p: t + b"\n" + s.replace(b"log ", b"lo\xff ")),
    "only an unknown key's signature": _note(
        lambda t, s, p: t + b"\n" + _line(t, "w.example", b"\1\2\3\4")
    ),
    "a signer name with a Unicode space": _note(
        lambda t, s, p: t + b"\n" + s + _line(t, "w\u00a0x", b"\1\2\3\4")
    ),
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=TAMPERED.keys())
def test_both_verifiers_refuse_a_tampered_log(
    produced: Produced, tmp_path: Path, change: Change
) -> None:
    log = _log_copy(produced, tmp_path)
    change(log, produced)
    with pytest.raises(c2sp.Rejected) as refused:
        _spec_verify(log, produced.vkey)
    assert str(refused.value)
    code, out = _owngate_verify(log, produced.vkey)
    assert code == 1 and "FAILED: " in out, out


ALLOWED: dict[str, Change] = {
    "an unknown key's signature first": _note(
        lambda t, s, p: t + b"\n" + _line(t, "w.example", b"\1\2\3\4") + s
    ),
    "an unknown key's signature last": _note(
        lambda t, s, p: t + b"\n" + s + _line(t, "w.example", b"\1\2\3\4")
    ),
    "the log's name with another key id, first": _note(
        lambda t, s, p: t + b"\n" + _line(t, ORIGIN, b"\xaa\xbb\xcc\xdd") + s
    ),
    "the log's key id under another name, first": _note(
        lambda t, s, p: t + b"\n" + _line(t, "w.example", _own_id(p)) + s
    ),
    "the log's line twice": _note(lambda t, s, p: t + b"\n" + s + s),
    "fifteen unknown lines before the log's": _note(
        lambda t, s, p: t + b"\n" + _line(t, "w.example", b"\1\2\3\4") * 15 + s
    ),
    "an extension line, re-signed": _note(lambda t, s, p: _signed(t + b"ext\x7f\n", p)),
}


@pytest.mark.parametrize("change", ALLOWED.values(), ids=ALLOWED.keys())
def test_both_verifiers_accept_what_the_spec_allows(
    produced: Produced, tmp_path: Path, change: Change
) -> None:
    log = _log_copy(produced, tmp_path)
    change(log, produced)
    _spec_verify(log, produced.vkey)
    code, out = _owngate_verify(log, produced.vkey)
    assert code == 0, out


def test_a_partial_bundle_holding_more_than_its_width_is_named_so(
    produced: Produced, tmp_path: Path
) -> None:
    """A `.p/44` bundle given more than a full bundle's entries: `verify` names the width
    of the file and its last entry (299), not a full bundle's 256 and an entry (511)
    past the end of the log."""
    log = _log_copy(produced, tmp_path)
    full = (log / "tile/entries/000").read_bytes()
    (log / "tile/entries/001.p/44").write_bytes((log / "tile/entries/001.p/44").read_bytes() + full)
    with pytest.raises(c2sp.Rejected, match="after its 44 entries"):
        _spec_verify(log, produced.vkey)
    code, out = _owngate("verify", str(log), "--key", produced.vkey)
    assert code == 1, out
    assert "holds 300 entries, more than its width 44" in out, out
    assert "after entry 299" in out and "511" not in out, out
