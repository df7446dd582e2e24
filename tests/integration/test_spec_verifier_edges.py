"""The from-the-spec verifier (tests/helpers/spec_verifier.py) on gateways of their own:
an attested backend's receipts checked with both keys and the sidecar's log, a log whose
origin is not ASCII, and the receipts of answers that failed (a stream that broke off, an
answer cut before its body, a backend's 500), each checked from what the client got.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from gateway.serving import ServerThread
from gateway.sim import Faults, SimSettings, create_sim_app
from tests.helpers import spec_receipts as receipts
from tests.helpers import spec_tiles as tiles
from tests.helpers import spec_verifier as spec
from tests.helpers.admin import serve_admin
from tests.helpers.attest import start_sidecar
from tests.helpers.doc_recipes import provenance_recipes
from tests.helpers.processes import KEY, owngate_argv
from tests.helpers.spec_rig import chat, client_receipt, served_tree, settle


def test_an_attested_answer_verifies_with_both_keys(tmp_path: Path) -> None:
    sim = ServerThread(create_sim_app(SimSettings.for_kind("vllm", models=("m",)))).start()
    sidecar = start_sidecar(tmp_path, "gpu-attest", sim.url)
    try:
        backend = {"base_url": sidecar.url, "attest": {"key": sidecar.vkey}}
        (tmp_path / "gw").mkdir()
        with serve_admin(tmp_path / "gw", backend=backend) as served:
            exchanges = [chat(served, stream, n) for n, stream in enumerate((False, True))]
            settle(served, 4)
            tree = served_tree(served)
            recipes = provenance_recipes()
            for sent, answer in exchanges:
                body, receipt = client_receipt(answer)
                receipts.verify_client_receipt(
                    receipt,
                    vkey=served.vkey,
                    request_id=answer.headers["x-request-id"],
                    sent=sent,
                    body=body,
                    tree=tree,
                    recipes=recipes,
                    backend_vkeys={"gpu": sidecar.vkey},
                    received=answer.content,
                )
    finally:
        assert sidecar.stop() == 0
        sim.stop()
    name = sidecar.vkey.split("+")[0]
    log = tiles.read_tree(tiles.from_directory(sidecar.log), [spec.parse_key(sidecar.vkey)], name)
    assert log.checkpoint.size == 2
    for entry in log.entries:
        receipts.canonical_record(entry)


# signed-note: "Key names MUST be non-empty and MUST NOT contain any Unicode spaces or plus
# (U+002B) characters" (any other UTF-8 is a name); tlog-checkpoint: the origin "MUST be
# non-empty", and "The log's key name in its signature line SHOULD match the origin line";
# docs/provenance.md: an origin is 1-255 printable characters, and the log's key is named
# after it.
UTF8_ORIGIN = "bücher.test/日志"


def test_a_signing_key_named_in_utf8_is_made_as_the_spec_names_it(tmp_path: Path) -> None:
    key_file = tmp_path / "log.key"
    made = subprocess.run(
        owngate_argv("keys", "new", "--signing", UTF8_ORIGIN, "--key-file", str(key_file)),
        capture_output=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr.decode(errors="replace")[-2000:]
    key = spec.parse_key(made.stdout.decode().strip())  # the key id over the UTF-8 name
    assert key.name == UTF8_ORIGIN and key_file.stat().st_size > 0


def test_a_log_whose_origin_is_not_ascii_is_served_and_verifies(tmp_path: Path) -> None:
    with serve_admin(tmp_path, origin=UTF8_ORIGIN) as served:
        chat(served, False, 0)
        settle(served, 2)
        tree = served_tree(served, UTF8_ORIGIN)
        assert tree.checkpoint.size == 2 and tree.checkpoint.origin == UTF8_ORIGIN


@pytest.mark.parametrize(
    ("fault", "stream"),
    [("die_mid_stream_rate", True), ("die_mid_stream_rate", False), ("error_rate", False)],
)
def test_a_failed_answers_receipt_verifies_from_what_the_client_got(
    tmp_path: Path, fault: str, stream: bool
) -> None:
    """The docs: a stream that broke off is the backend's bytes, the gateway's error event
    and its receipt line, committed to the backend's bytes alone; a failed request that
    relayed nothing commits to nothing (null), its receipt in the error's header."""
    app = create_sim_app(SimSettings.for_kind("vllm", models=("m",), zero_latency=True))
    app.control.faults = Faults(**{fault: 1.0})
    sim = ServerThread(app).start()
    try:
        with serve_admin(tmp_path, backend={"base_url": sim.url}) as served:
            sent = b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":%s}' % (
                b"true" if stream else b"false"
            )
            answer = httpx.post(
                f"{served.process.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
                content=sent,
                timeout=10,
            )
            if stream:
                assert answer.status_code == 200
                body, receipt = receipts.stream_bodies(answer.content)
            else:
                assert answer.status_code >= 500
                body, receipt = None, spec.b64(answer.headers["x-owngate-receipt"])
            settle(served, 2)
            tree = served_tree(served)
            receipts.verify_client_receipt(
                receipt,
                vkey=served.vkey,
                request_id=answer.headers["x-request-id"],
                sent=sent,
                body=body,
                tree=tree,
                recipes=provenance_recipes(),
            )
            completion = receipts.canonical_record(tree.entries[1])
            assert completion["status"] == (answer.status_code if not stream else 502)
    finally:
        sim.stop()
