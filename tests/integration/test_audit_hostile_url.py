"""`owngate audit verify URL` against a server that serves a hostile log.

The served checkpoint's tree size is the server's word until its signature is checked:
verify checks it before fetching a tile, and the tiles a size needs are fetched one at a
time, so a checkpoint claiming a vast log costs neither memory nor a long wait.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import Signer, sign_note
from gateway.provenance.formats.layout import CHECKPOINT, history_path
from gateway.provenance.keys import generate_signing_key

ORIGIN = "test.owngate/hostile/1"
VAST = 10**15  # entries: a list of their tile names would not fit in memory


class _Served:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.asked: list[str] = []
        self.url = ""


@pytest.fixture
def served() -> Iterator[_Served]:
    state = _Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.removeprefix("/log/")
            state.asked.append(name)
            data = state.files.get(name)
            self.send_response(404 if data is None else 200)
            self.send_header("content-length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/log/"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _checkpoint(size: int, signer: Signer) -> bytes:
    root = base64.b64encode(bytes(32)).decode()
    return sign_note(f"{ORIGIN}\n{size}\n{root}\n", [signer])


def test_a_checkpoint_the_key_did_not_sign_is_refused_before_a_tile_is_fetched(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    impostor = Signer.from_skey(generate_signing_key(ORIGIN)[0])
    _, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(VAST, impostor)
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    assert "FAILED" in capsys.readouterr().err
    assert served.asked == ["checkpoint"]


def test_a_sidecar_log_url_is_checked_against_the_backend_key_before_its_tiles(
    served: _Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A gateway log that verifies (empty), and a sidecar log URL whose checkpoint another
    # key signed, claiming a vast log.
    log_skey, log_vkey = generate_signing_key("gw")
    empty = tmp_path / "log"
    root = base64.b64encode(bytes.fromhex(_EMPTY)).decode()
    note = sign_note(f"gw\n0\n{root}\n", [Signer.from_skey(log_skey)])
    history_path(empty, 0).parent.mkdir(parents=True)
    history_path(empty, 0).write_bytes(note)
    (empty / CHECKPOINT).write_bytes(note)
    assert main(["audit", "verify", str(empty), "--key", log_vkey]) == 0
    impostor = Signer.from_skey(generate_signing_key(ORIGIN)[0])
    _, backend_vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(VAST, impostor)
    argv = ["audit", "verify", str(empty), "--key", log_vkey]
    argv += ["--backend-key", f"gpu={backend_vkey}", "--attest-log", f"gpu={served.url}"]
    assert main(argv) == 1
    assert "FAILED" in capsys.readouterr().err
    assert served.asked == ["checkpoint"]


def test_a_signed_checkpoint_claiming_a_vast_log_stops_at_the_first_missing_tile(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(VAST, Signer.from_skey(skey))
    assert main(["audit", "show", served.url]) == 1
    assert "tile/0/000 is not served" in capsys.readouterr().err
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    assert "tile/0/000 is not served" in capsys.readouterr().err


_EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # SHA-256("")
