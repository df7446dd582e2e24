"""`owngate witness serve`, a real process, driven by a client written from C2SP
tlog-witness alone: each MUST of `add-checkpoint` (status codes, the 409 body and
content type, persistence before answering) and the cosignature lines it answers checked
with the from-the-spec verifier (tests/helpers/spec_verifier.py, spec_receipts.py). The
logs are the test's own: checkpoints it signs with its own Ed25519 keys, as signed-note
specifies, over RFC 6962 trees of made-up entries.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.helpers import spec_receipts as receipts
from tests.helpers import spec_verifier as spec
from tests.helpers.net import free_port
from tests.helpers.processes import ServerProcess, owngate_argv
from tests.helpers.waiting import until

LOG = "spec.test/log"
OTHER_LOG = "spec.test/other"
LEAVES = [spec.leaf_hash(b"entry %d" % i) for i in range(12)]


class Log:
    """A log the test signs for: `name`'s key, a vkey as signed-note spells one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.private = Ed25519PrivateKey.generate()
        public = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = spec.key_id(name, 0x01, public)
        material = base64.b64encode(bytes([0x01]) + public).decode()
        self.vkey = f"{name}+{self.key_id.hex()}+{material}"

    def checkpoint(self, size: int, root: bytes | None = None) -> bytes:
        root = spec.mth(LEAVES[:size]) if root is None else root
        text = f"{self.name}\n{size}\n{base64.b64encode(root).decode()}\n".encode()
        signature = base64.b64encode(self.key_id + self.private.sign(text)).decode()
        return text + f"\n\u2014 {self.name} {signature}\n".encode()


def _body(old: int | str, proof: list[bytes], note: bytes) -> bytes:
    lines = [f"old {old}\n".encode()] + [base64.b64encode(h) + b"\n" for h in proof]
    return b"".join(lines) + b"\n" + note


Rig = tuple[str, spec.Key, Log, Log, ServerProcess]  # URL, its key, two logs, the process


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[Rig]:
    key, state = tmp_path / "witness.key", tmp_path / "state.json"
    run = [owngate_argv("keys", "new", "--signing", "witness.spec.test/w1", "--key-file", str(key))]
    run += [owngate_argv("witness", "init", "--state", str(state))]
    for argv in run:
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
    vkey = (
        subprocess.run(
            owngate_argv("witness", "vkey", "--key", str(key)),
            check=True,
            capture_output=True,
            timeout=60,
        )
        .stdout.decode()
        .strip()
    )
    log, other = Log(LOG), Log(OTHER_LOG)
    port = free_port()
    argv = owngate_argv("witness", "serve", "--key", str(key), "--state", str(state))
    argv += ["--log", log.vkey, "--log", other.vkey, "--port", str(port)]

    def start() -> ServerProcess:
        process = ServerProcess("witness", argv, tmp_path, port)
        until(
            lambda: _listening(process), "the witness listening", timeout=30, detail=process.output
        )
        return process

    process = start()
    yield f"http://127.0.0.1:{port}", spec.parse_key(vkey, 0x04), log, other, process
    process.kill()


def _listening(process: ServerProcess) -> bool:
    assert process.proc.poll() is None, process.output()
    try:
        httpx.get(process.url + "/", timeout=1)
    except httpx.TransportError:
        return False
    return True


def _add(url: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{url}/add-checkpoint", content=body, timeout=10)


def _cosigned(answer: httpx.Response, note: bytes, witness: spec.Key) -> None:
    """tlog-witness: 200, one or more note signature lines ('—' ... newline), cosignatures
    from the witness key on the checkpoint."""
    assert answer.status_code == 200, answer.text
    lines = answer.content.split(b"\n")
    assert lines[-1] == b"" and all(line.startswith("\u2014 ".encode()) for line in lines[:-1])
    receipts.verify_cosignature(note + answer.content, witness)


def test_add_checkpoint_answers_as_tlog_witness_says(witness: Rig) -> None:
    url, key, log, other, _ = witness
    first = log.checkpoint(3)
    _cosigned(_add(url, _body(0, [], first)), first, key)
    # old size other than the latest cosigned: 409, text/x.tlog.size, "<size>\n"
    stale = _add(url, _body(0, [], log.checkpoint(5)))
    assert stale.status_code == 409
    assert stale.headers["content-type"] == "text/x.tlog.size"
    assert stale.content == b"3\n"
    # a consistency proof that does not verify: 422; one that does: 200
    bad = spec.consistency_proof(3, LEAVES[:5])[::-1]
    assert _add(url, _body(3, bad, log.checkpoint(5))).status_code == 422
    grown = log.checkpoint(5)
    # proof lines in base64's one spelling: the same hash respelled is malformed (400)
    good = _body(3, spec.consistency_proof(3, LEAVES[:5]), grown).decode()
    line = good.split("\n")[1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    respelled = line[:-2] + alphabet[alphabet.index(line[-2]) + 1] + "="
    assert base64.b64decode(respelled) == base64.b64decode(line)
    assert _add(url, good.replace(line, respelled, 1).encode()).status_code == 400
    _cosigned(_add(url, _body(3, spec.consistency_proof(3, LEAVES[:5]), grown)), grown, key)
    # same size: the same root cosigns again, another root is a fork, 409
    _cosigned(_add(url, _body(5, [], grown)), grown, key)
    assert _add(url, _body(5, [], log.checkpoint(5, bytes(32)))).status_code == 409
    # old size above the checkpoint's: 400; a size with a leading zero is malformed
    assert _add(url, _body(6, [], log.checkpoint(5))).status_code == 400
    assert _add(url, _body("05", [], log.checkpoint(5))).status_code == 400
    # unknown origin: 404; no signature by a trusted key: 403
    assert _add(url, _body(0, [], Log("spec.test/unknown").checkpoint(1))).status_code == 404
    impostor = Log(LOG)  # the log's name, another key
    assert _add(url, _body(5, [], impostor.checkpoint(5))).status_code == 403
    # from old size 0 the proof must be empty: a proof from 0 is refused (422)
    assert _add(url, _body(0, [LEAVES[0]], other.checkpoint(1))).status_code == 422


def test_the_witness_persists_what_it_cosigned_before_answering(witness: Rig) -> None:
    url, key, log, _, process = witness
    note = log.checkpoint(4)
    _cosigned(_add(url, _body(0, [], note)), note, key)
    process.kill()  # no clean shutdown: what it answered must already be on disk
    argv = cast("list[str]", process.proc.args)  # the witness's own command line, again
    restarted = ServerProcess("witness-again", argv, process.log.parent, process.port)
    try:
        until(lambda: _listening(restarted), "the witness listening again", timeout=30)
        again = _add(url, _body(0, [], log.checkpoint(6)))
        assert again.status_code == 409 and again.content == b"4\n"
    finally:
        restarted.kill()


def test_the_cosignature_key_id_is_the_specs(witness: Rig) -> None:
    _, key, *_ = witness
    assert key.key_id == hashlib.sha256(key.name.encode() + b"\n\x04" + key.public).digest()[:4]
