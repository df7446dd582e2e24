"""`owngate audit verify URL` against a server that serves a hostile log.

The served checkpoint's tree size is the server's word until its signature is checked:
verify checks it before fetching a tile, and the tiles a size needs are fetched one at a
time, so a checkpoint claiming a vast log costs neither memory nor a long wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import MalformedError, Signer, sign_note
from gateway.provenance.audit.remote import FetchLimits, copy_budget, mirror_log
from gateway.provenance.audit.remote_busy import TRIES
from gateway.provenance.formats.layout import CHECKPOINT, history_path
from gateway.provenance.formats.tiles import TILE_WIDTH, decode_bundle, encode_bundle
from gateway.provenance.keys import generate_signing_key
from gateway.provenance.testing import log_refusal, seeded_signer
from gateway.provenance.writer.log import ProvenanceLog

ORIGIN = "test.owngate/hostile/1"
VAST = 10**15  # entries: a list of their tile names would not fit in memory


class _Served:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.asked: list[str] = []
        self.url = ""
        # name -> "head" or "body": that answer drips a byte at a time until `stop`
        self.drip: dict[str, str] = {}
        self.stop = threading.Event()
        self.dripped = threading.Event()  # a dripping answer has sent a byte
        self.any_tile: bytes | None = None  # served for every tile path not in `files`
        self.moved: dict[str, str] = {}  # name -> where a redirect sends it
        self.moved_code = 302
        self.moved_body = 0  # bytes of body a redirect sends (no length, till it closes)
        self.moved_sent = 0  # of those, how many were sent before the client went
        self.moved_done = threading.Event()  # a redirect with a body has ended
        self.tokens: list[str | None] = []  # each request's Authorization header
        self.busy: dict[str, int] = {}  # name -> how many GETs of it are answered 429 first
        self.retry_after = "0"  # the 429s' retry-after


@pytest.fixture
def served() -> Iterator[_Served]:
    with _serving() as state:
        yield state


@contextlib.contextmanager
def _serving() -> Iterator[_Served]:
    state = _Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.removeprefix("/log/")
            state.asked.append(name)
            state.tokens.append(self.headers.get("authorization"))
            if state.busy.get(name, 0) > 0:  # as owngate's admin API past its log reads
                state.busy[name] -= 1
                self.send_response(429)
                self.send_header("retry-after", state.retry_after)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if name in state.moved:
                self.send_response(state.moved_code)
                self.send_header("location", state.moved[name])
                if state.moved_body:
                    self._send_moved_body()
                    return
                self.send_header("content-length", "0")
                self.end_headers()
                return
            data = state.files.get(name)
            if data is None and state.any_tile is not None and name.startswith("tile/"):
                data = state.any_tile
            if name in state.drip:
                self._drip(state.drip[name])
                return
            self.send_response(404 if data is None else 200)
            self.send_header("content-length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def _send_moved_body(self) -> None:
            """The redirect's body, `moved_body` bytes at most, ended by closing the
            connection: sent until the client goes (a write fails) or all of it is."""
            self.send_header("connection", "close")
            self.end_headers()
            chunk = bytes(1 << 16)
            try:
                while state.moved_sent < state.moved_body:  # bounded: moved_body bytes
                    self.wfile.write(chunk)
                    state.moved_sent += len(chunk)
                self.wfile.flush()
            except OSError:
                pass  # the client closed the redirect's connection: what the test wants
            finally:
                self.close_connection = True
                state.moved_done.set()

        def _drip(self, where: str) -> None:
            """A byte, then another each time the server's pace allows, until the client
            goes or the test stops it: each read gets a byte long before any read
            timeout, so only a deadline for the whole file ends it."""
            if where == "body":
                self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
                byte = b"x"
            else:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nx-slow: ")  # one header, never ended
                byte = b"y"
            try:
                while not state.stop.is_set():
                    self.wfile.write(byte)
                    self.wfile.flush()
                    state.dripped.set()
                    state.stop.wait(0.01)  # the server's pace, not a wait for the client
            except OSError:
                return  # the client shut the connection: what the test wants

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/log/"
    try:
        yield state
    finally:
        state.stop.set()
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


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_server_dripping_a_file_is_cut_off_at_the_file_deadline(
    served: _Served, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each read gets a byte well inside its 30 s timeout: before the per-file deadline
    # this never ended (the test's `stop` ended it, and the audit then failed otherwise).
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(skey))
    served.drip["tile/0/000.p/1"] = where
    argv = ["audit", "verify", served.url, "--key", vkey, "--file-deadline", "0.2"]
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert served.dripped.is_set()
    assert f"GET {served.url}tile/0/000.p/1: not received whole within 0.2 s" in said
    assert "--file-deadline" in said


def test_a_claimed_tree_size_cannot_fill_the_disk(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    # `show` has no key: the checkpoint's size is the server's word, and it serves a full
    # tile under every name. The copy stops at the byte budget, naming it.
    skey, _ = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(VAST, Signer.from_skey(skey))
    served.any_tile = bytes(TILE_WIDTH * 32)
    assert main(["audit", "show", served.url, "--max-download", "100000"]) == 1
    said = capsys.readouterr().err
    assert f"{served.url} serves more than" in said and "(--max-download)" in said
    assert len(served.asked) <= 100000 // len(served.any_tile) + 2


@pytest.mark.parametrize("size", [str(2**64), str(2**70), "9" * 5000, "007"])
def test_a_tree_size_no_tlog_has_ends_an_unverified_copy_at_once(
    served: _Served, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `show` copies without a key: the checkpoint's size is the server's word, but a size
    # past 2^64-1 (or with leading zeros) is no tlog's. It ends the copy, named as what it
    # is, before any tile is fetched: 2^70 had the copy fetch tiles up to --max-download
    # (16 GiB by default), and 5,000 digits ended it with Python's int() conversion error.
    signer = Signer.from_skey(generate_signing_key(ORIGIN)[0])
    root = base64.b64encode(bytes(32)).decode()
    served.files["checkpoint"] = sign_note(f"{ORIGIN}\n{size}\n{root}\n", [signer])
    served.any_tile = bytes(TILE_WIDTH * 32)
    assert main(["audit", "show", served.url, "--max-download", "100000"]) == 1
    said = capsys.readouterr().err
    assert "the served checkpoint is not a checkpoint: checkpoint size" in said, said
    assert served.asked == ["checkpoint"]


def test_a_tile_longer_than_its_width_is_refused(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(skey))
    served.files["tile/0/000.p/1"] = bytes(33)  # one hash is 32 bytes
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    assert "tile/0/000.p/1 is larger than 32 bytes" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["show", "verify"])
def test_empty_tiles_end_the_copy_at_the_first(
    served: _Served, verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every tile and bundle of a vast checkpoint served as 200 with no body: nothing is
    # spent of the byte budget, so before, the copy fetched (and wrote, an empty file
    # each: inodes, not bytes) tile after tile until the copy's deadline (an hour by
    # default). A hash tile is exactly its width in hashes, a bundle at least a length
    # prefix an entry: the first short one ends the copy, named.
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(VAST, Signer.from_skey(skey))
    served.any_tile = b""
    argv = ["audit", verb, served.url, "--copy-deadline", "5"]
    assert main(argv + (["--key", vkey] if verb == "verify" else [])) == 1
    said = capsys.readouterr().err
    assert "tile/0/000 is 0 bytes, not the 8192 of 256 hashes" in said, said
    assert served.asked == ["checkpoint", "tile/0/000"]


def test_a_short_tile_or_bundle_is_refused(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(2, Signer.from_skey(skey))
    served.files["tile/0/000.p/2"] = bytes(63)  # two hashes are 64 bytes
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    assert "tile/0/000.p/2 is 63 bytes, not the 64 of 2 hashes" in capsys.readouterr().err
    served.files["tile/0/000.p/2"] = bytes(64)
    served.files["tile/entries/000.p/2"] = b"\x00\x01x"  # one entry of the two
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    said = capsys.readouterr().err
    assert "tile/entries/000.p/2 is 3 bytes, less than the 4 of 2 entries" in said, said


def test_the_budget_is_what_a_tree_size_can_hold() -> None:
    entry = 2 + 0xFFFF  # a bundle's length prefix and largest entry
    assert copy_budget(0) == 0
    assert copy_budget(1) == TILE_WIDTH * (32 + entry)
    assert copy_budget(TILE_WIDTH) == TILE_WIDTH * (32 + entry) + TILE_WIDTH * 32
    assert copy_budget(TILE_WIDTH + 1) == 2 * TILE_WIDTH * (32 + entry) + TILE_WIDTH * 32


@pytest.mark.parametrize("elsewhere", ["other host", "ftp", "same host"])
def test_a_redirect_is_followed_only_within_the_log_urls_origin(
    served: _Served, elsewhere: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # urllib copies every header onto a redirected request: a log server sending the
    # auditor to another host (or port, or scheme) would hand it the --token, and the
    # log would be read from a server the auditor never named.
    skey, vkey = generate_signing_key(ORIGIN)
    root = base64.b64encode(bytes.fromhex(_EMPTY)).decode()
    note = sign_note(f"{ORIGIN}\n0\n{root}\n", [Signer.from_skey(skey)])  # the empty log
    argv = ["audit", "verify", served.url, "--key", vkey, "--token", "s3cret"]
    with _serving() as other:
        other.files["checkpoint"] = note
        served.moved["checkpoint"] = {
            "other host": f"{other.url}checkpoint",
            "ftp": f"ftp://{other.url.removeprefix('http://')}checkpoint",
            "same host": f"{served.url}moved/checkpoint",
        }[elsewhere]
        served.files["moved/checkpoint"] = note
        code = main(argv)
        said = capsys.readouterr()
    if elsewhere == "same host":
        assert code == 0, said.err
        assert served.tokens == ["Bearer s3cret"] * 2
        return
    assert code == 1
    assert "another origin than the log URL's: not followed" in said.err
    assert other.asked == []
    assert served.asked == ["checkpoint"]


def test_a_redirects_body_is_not_read(served: _Served, capsys: pytest.CaptureFixture[str]) -> None:
    # urllib reads a redirect's body whole (`fp.read()`) before it follows the redirect:
    # a log server answering a same-origin redirect with an endless body had the auditor
    # hold all of it in memory, as long as it came within the file deadline (300 s by
    # default: gigabytes on a fast link). The body is never the log: it is not read.
    skey, vkey = generate_signing_key(ORIGIN)
    root = base64.b64encode(bytes.fromhex(_EMPTY)).decode()
    served.files["moved/checkpoint"] = sign_note(f"{ORIGIN}\n0\n{root}\n", [Signer.from_skey(skey)])
    served.moved["checkpoint"] = f"{served.url}moved/checkpoint"
    served.moved_body = 256 << 20  # more than any socket buffers hold between the two
    assert main(["audit", "verify", served.url, "--key", vkey]) == 0, capsys.readouterr().err
    assert served.asked == ["checkpoint", "moved/checkpoint"]
    assert served.moved_done.wait(60)  # the redirect's handler has seen the client go
    assert served.moved_sent < served.moved_body, "the redirect's body was read through"


def test_a_redirect_loop_ends_the_copy(served: _Served, capsys: pytest.CaptureFixture[str]) -> None:
    _, vkey = generate_signing_key(ORIGIN)
    served.moved["checkpoint"] = f"{served.url}checkpoint"  # to itself, for good
    assert main(["audit", "verify", served.url, "--key", vkey]) == 2
    assert f"GET {served.url}checkpoint: HTTP 302" in capsys.readouterr().err
    assert 1 < len(served.asked) <= 11  # urllib's bound: 4 visits of a URL, 10 redirects


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_a_url_that_does_not_parse_is_the_servers_fault(
    served: _Served, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: exit 2, a usage error, saying only "error: Invalid IPv6 URL" (urllib's
    # ValueError from parsing the location), naming neither the GET nor the redirect.
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(skey))
    served.moved["tile/0/000.p/1"] = "http://[::1"
    served.moved_code = code
    assert main(["audit", "verify", served.url, "--key", vkey]) == 1
    said = capsys.readouterr().err
    assert f"GET {served.url}tile/0/000.p/1: HTTP {code} redirects to a URL that" in said, said


@pytest.mark.parametrize("where", ["same origin", "other host"])
def test_a_redirect_to_a_url_with_userinfo_is_refused_before_connecting(
    served: _Served, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # urllib takes `user:pass@host` for the host name: the redirect failed at name lookup
    # (or as a "nonnumeric port"), quoting the credential, instead of being refused.
    _, vkey = generate_signing_key(ORIGIN)
    with _serving() as other:
        target = served.url if where == "same origin" else other.url
        authority = target.removeprefix("http://")
        served.moved["checkpoint"] = f"http://auditor:pw-s3cret@{authority}moved/checkpoint"
        code = main(["audit", "verify", served.url, "--key", vkey])
        said = capsys.readouterr()
    assert code == 1, said.err
    assert "userinfo (user:password@): not followed" in said.err
    assert "pw-s3cret" not in said.err + said.out
    assert "***@127.0.0.1" in said.err
    assert served.asked == ["checkpoint"]
    assert other.asked == []


def test_a_log_url_with_userinfo_is_refused_without_quoting_it(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    _, vkey = generate_signing_key(ORIGIN)
    url = served.url.replace("http://", "http://auditor:pw-s3cret@")
    code = main(["audit", "verify", url, "--key", vkey])
    said = capsys.readouterr()
    assert code == 2, said.err
    assert "holds userinfo" in said.err
    assert "pw-s3cret" not in said.err + said.out
    assert served.asked == []


def test_the_whole_copy_has_a_deadline_not_only_each_file(served: _Served, tmp_path: Path) -> None:
    # Each file arrives within its own deadline (100 s of the copy's clock, which moves
    # 100 s each time the server answers a GET, against 300 s a file), but the three a
    # tree of one entry needs take 300 s: past the 250 s for the whole copy. Before, a
    # server dripping every file just inside the per-file deadline held the auditor for
    # as many deadlines as the log has files.
    skey, _ = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(skey))
    served.files["tile/0/000.p/1"] = bytes(32)
    served.files["tile/entries/000.p/1"] = b"\x00\x01x"
    limits = FetchLimits(file_deadline_s=300, copy_deadline_s=250)
    with pytest.raises(OSError, match="--copy-deadline") as raised:
        mirror_log(
            served.url,
            tmp_path,
            limits=limits,
            clock=lambda: 100.0 * len(served.asked),
        )
    assert "not done within 250 s" in str(raised.value)
    assert served.asked == ["checkpoint", "tile/0/000.p/1", "tile/entries/000.p/1"]


def test_the_copy_deadline_flag_cuts_off_a_file_before_its_own_deadline(
    served: _Served, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tile's head drips for ever: only a deadline ends it, and the copy's (3 s) comes
    # long before the file's (60 s). The copy's runs from the checkpoint's GET: 0.2 s ran
    # out before the tile's first byte on a loaded machine (and a dripping body reaches
    # the tile's 32 bytes in 0.3 s: a head has no such bound this early).
    skey, vkey = generate_signing_key(ORIGIN)
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(skey))
    served.drip["tile/0/000.p/1"] = "head"
    argv = ["audit", "verify", served.url, "--key", vkey]
    argv += ["--file-deadline", "60", "--copy-deadline", "3"]
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert served.dripped.is_set()
    assert f"GET {served.url}tile/0/000.p/1: the copy of the log is not done within 3 s" in said


def test_a_token_never_goes_to_the_environments_proxy(
    served: _Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """urllib takes a proxy from `http_proxy` (for a loopback URL too, without
    `no_proxy`): `owngate audit verify http://admin:9090/log/ --token T` sent the proxy
    the request with `Authorization: Bearer T` in plain text. With a token the log URL is
    fetched directly; a public log (no token) still goes through the proxy."""
    with _serving() as proxy:
        for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", proxy.url.removesuffix("/log/"))
        with pytest.raises(MalformedError, match="not served"):
            mirror_log(served.url, tmp_path / "with-token", token="og-admin-secret")
        assert proxy.tokens == [] and served.tokens == ["Bearer og-admin-secret"]
        with pytest.raises(MalformedError, match="not served"):
            mirror_log(served.url, tmp_path / "public")
        assert proxy.asked and proxy.tokens == [None], proxy.asked
        assert served.tokens == ["Bearer og-admin-secret"]


def test_a_busy_server_is_asked_again_as_its_retry_after_says(
    served: _Served, tmp_path: Path
) -> None:
    """owngate's admin API answers 429 (`retry-after: 1`) past its eight log reads at
    once, four for a token: another auditor's copy at the same time is enough. The copy
    asks again after the wait it names. Before, the first 429 ended it (`HTTP 429`)."""
    signer = Signer.from_skey(generate_signing_key(ORIGIN)[0])
    served.files["checkpoint"] = _checkpoint(1, signer)
    served.files["tile/0/000.p/1"] = bytes(32)
    served.files["tile/entries/000.p/1"] = b"\x00\x01x"
    served.busy = {"checkpoint": 1, "tile/0/000.p/1": 2, "tile/entries/000.p/1": 1}
    assert mirror_log(served.url, tmp_path / "copy") == 1
    assert (
        served.asked == ["checkpoint"] * 2 + ["tile/0/000.p/1"] * 3 + ["tile/entries/000.p/1"] * 2
    )
    assert (tmp_path / "copy" / "tile/entries/000.p/1").read_bytes() == b"\x00\x01x"


def test_a_server_busy_for_good_ends_the_copy(served: _Served, tmp_path: Path) -> None:
    served.files["checkpoint"] = _checkpoint(1, Signer.from_skey(generate_signing_key(ORIGIN)[0]))
    served.busy = {"checkpoint": 10 * TRIES}
    with pytest.raises(OSError, match=rf"HTTP 429 .*{TRIES} times in a row"):
        mirror_log(served.url, tmp_path / "copy")
    assert len(served.asked) == TRIES  # bounded: never a loop as long as the server likes
    served.asked.clear()
    served.retry_after = "3600"  # past the copy's deadline: it ends at once, unwaited
    with pytest.raises(OSError, match=r"HTTP 429 .*past the copy's deadline"):
        mirror_log(served.url, tmp_path / "copy", limits=FetchLimits(copy_deadline_s=60.0))
    assert served.asked == ["checkpoint"]
    served.asked.clear()
    served.busy = {"checkpoint": 1}
    served.retry_after = "\u00b2"  # a digit to Python's str.isdigit, no number: 1 s
    with pytest.raises(MalformedError, match="tile/0/000 is not served"):
        mirror_log(served.url, tmp_path / "copy")  # the checkpoint, asked again
    assert served.asked[:2] == ["checkpoint", "checkpoint"]


def test_a_partial_file_gone_since_is_cut_from_its_full_one(
    served: _Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The log grew past the copied checkpoint's partial tile before the copy reached it:
    # the writer deleted `tile/0/000.p/129` once `tile/0/000` was whole, and the copy took
    # the full file in its place (tlog-tiles: the fallback). It wrote it whole, at the full
    # name, which `verify` refuses for a tree that does not reach the tile's end ("a full
    # tile no checkpoint covers"): every copy of a log that grew past a tile's end during
    # it failed. Now the full file's first 129 hashes and entries are the partial ones.
    signer = seeded_signer(ORIGIN)

    async def add(first: int, end: int) -> bytes:
        log = await ProvenanceLog.open(tmp_path / "log", ORIGIN, signer)
        for number in range(first, end):
            await log_refusal(log, number)
        await log.checkpoint()
        await log.close()
        return (tmp_path / "log" / CHECKPOINT).read_bytes()

    old = asyncio.run(add(0, 129))
    asyncio.run(add(129, 300))
    for path in (tmp_path / "log" / "tile").rglob("*"):
        if path.is_file():
            served.files[str(path.relative_to(tmp_path / "log"))] = path.read_bytes()
    assert "tile/0/000.p/129" not in served.files and "tile/0/000" in served.files
    served.files[CHECKPOINT] = old
    assert main(["audit", "verify", served.url, "--key", signer.vkey]) == 0, capsys.readouterr().err
    assert "tile/0/000" in served.asked and "tile/entries/000" in served.asked
    copy = tmp_path / "copy"
    assert mirror_log(served.url, copy, verifiers=[signer.verifier()]) == 129
    assert (copy / "tile/0/000.p/129").read_bytes() == served.files["tile/0/000"][: 129 * 32]
    assert not (copy / "tile/0/000").exists() and not (copy / "tile/entries/000").exists()
    entries = decode_bundle(served.files["tile/entries/000"])
    served.files["tile/entries/000"] = encode_bundle(entries[:128])  # one short of 129
    fewer = "entries/000 is a bundle of 128 whole entries, fewer than 129"
    with pytest.raises(MalformedError, match=fewer):
        mirror_log(served.url, tmp_path / "short", verifiers=[signer.verifier()])
