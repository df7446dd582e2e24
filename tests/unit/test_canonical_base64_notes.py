"""Base64 in a signed note, a checkpoint and a tlog-proof is read only in
its one canonical spelling (RFC 4648 section 4, with the pad bits zero: section 3.5 lets
a decoder refuse the others), as receipts already are. The specs say a root line is "the
base64 encoding of the root", a signature "the base64 encoding of 4+n bytes"; a second
spelling of the same bytes is not that encoding, and it made one note two byte strings
that both verified: anyone relaying a checkpoint could change the last character of its
signature line and owngate's verifier accepted it (the from-the-spec verifier,
tests/helpers/spec_verifier.py, refuses it)."""

from __future__ import annotations

import base64

import pytest

from gateway.provenance import MalformedError, TlogProof, open_note, sign_note, verify_tlog_proof
from gateway.provenance.formats.checkpoint import Checkpoint, open_checkpoint, sign_checkpoint
from gateway.provenance.formats.merkle import leaf_hash, root_from_leaves
from gateway.provenance.testing import seeded_signer
from tests.helpers import spec_verifier as spec

ORIGIN = "canonical.example/log"
SIGNER = seeded_signer(ORIGIN)
ENTRIES = [b"entry %d" % i for i in range(5)]
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _respell(encoded: str) -> str:
    """The same bytes with a pad bit set: the last character before the padding moved up
    by one (its low bits are pad bits when there is padding)."""
    assert encoded.endswith("=")
    at = encoded.rstrip("=")
    changed = at[:-1] + ALPHABET[ALPHABET.index(at[-1]) + 1] + encoded[len(at) :]
    assert base64.b64decode(changed) == base64.b64decode(encoded) and changed != encoded
    return changed


def _note() -> bytes:
    root = root_from_leaves([leaf_hash(e) for e in ENTRIES])
    return sign_checkpoint(Checkpoint(ORIGIN, len(ENTRIES), root, ()), [SIGNER])


def test_a_signature_line_respelled_is_refused() -> None:
    note = _note()
    text, line = note.decode().rsplit("\n\n", 1)
    name, encoded = line.rstrip("\n").rsplit(" ", 1)
    respelled = f"{text}\n\n{name} {_respell(encoded)}\n".encode()
    open_note(note, [SIGNER.verifier()])  # as signed: fine
    with pytest.raises(MalformedError, match="canonical"):
        open_note(respelled, [SIGNER.verifier()])


def test_a_checkpoint_root_respelled_is_refused_though_signed() -> None:
    root = root_from_leaves([leaf_hash(e) for e in ENTRIES])
    line = base64.b64encode(root).decode()
    text = f"{ORIGIN}\n{len(ENTRIES)}\n{_respell(line)}\n"
    note = sign_note(text, [SIGNER])  # the log's key signed it: only the form is wrong
    with pytest.raises(MalformedError, match="canonical"):
        open_checkpoint(note, [SIGNER.verifier()], origin=ORIGIN)


def test_a_tlog_proof_hash_respelled_is_refused() -> None:
    hashes = [leaf_hash(e) for e in ENTRIES]
    proof = TlogProof(1, tuple(spec.inclusion_proof(1, hashes)), _note())
    text = proof.format()
    verify_tlog_proof(TlogProof.parse(text), ENTRIES[1], [SIGNER.verifier()], origin=ORIGIN)
    first = base64.b64encode(proof.hashes[0]).decode()
    with pytest.raises(MalformedError, match="canonical"):
        TlogProof.parse(text.replace(first, _respell(first), 1))
