"""A client that reads a large log file slowly, or not at all, holds a bounded buffer in
the gateway, not the file (gateway/admin/log_stream.py).

A real admin listener (uvicorn with owngate's protocol, uvloop) serves a log whose entry
bundle `tile/entries/000` is `BUNDLE` bytes. `CLIENTS` raw sockets, each with a small
receive buffer (the server's side a fixed send buffer), ask for it and read nothing.
Once every one of the server's connections has paused writing (the client's window and
the kernel's buffers are full), the bytes left in each transport are read. Before, each
answer went to its transport in one write: each held the whole bundle less what the
kernel took, megabytes per connection. Now the bundle is streamed as its client takes
it: each transport holds at most its high-water mark and a chunk. A client that reads
gets the bundle whole, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.serving import ServerThread
from tests.helpers.gateways import backend
from tests.helpers.waiting import until

TOKEN = "og-admin-slow-readers-token"
BUNDLE = 12 << 20  # an entry bundle of 12 MiB (at most 16 MiB: 256 entries of 64 KiB)
CLIENTS = 6
CHUNK = 64 << 10  # gateway/admin/log_stream.py `CHUNK`
HELD_MOST = 4 * CHUNK  # per connection: the transport's high-water mark (64 KiB) and a chunk


def _bundle() -> bytes:
    block = hashlib.sha256(b"slow readers").digest() * (CHUNK // 32)
    data = block * (BUNDLE // len(block))
    return data + bytes(BUNDLE - len(data))


def _server(tmp_path: Path) -> ServerThread:
    log = tmp_path / "log"
    (log / "tile" / "entries").mkdir(parents=True)
    (log / "tile" / "entries" / "000").write_bytes(_bundle())
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": "slow-readers.test/log", "signing_key_file": "k"},
        "admin": {
            "tokens": [
                {"hash": "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest(), "role": "auditor"}
            ]
        },
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))
    server = ServerThread(app)
    # Its connections inherit a fixed send buffer (no autotuning up to tcp_wmem's maximum,
    # 4 MiB here, more on a tuned host): the kernel takes about 128 KiB of each answer.
    server._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    return server


def _silent_reader(port: int) -> socket.socket:
    """A connection that asks for the bundle and reads nothing (a small receive window)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /log/tile/entries/000 HTTP/1.1\r\nhost: admin\r\n"
        b"authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
    )
    return sock


def _connections(server: ServerThread) -> list[Any]:
    """The server's open connections (uvicorn's protocol instances)."""
    return list(server._server.server_state.connections)


def _open_on(path: Path) -> int:
    """How many of this process's descriptors are open on the file at `path`."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # one closed meanwhile
            count += fd.readlink() == path
    return count


def test_clients_that_read_nothing_hold_a_bounded_buffer_each(tmp_path: Path) -> None:
    bundle = (tmp_path / "log" / "tile" / "entries" / "000").resolve()
    with _server(tmp_path) as server:
        readers = [_silent_reader(server.port) for _ in range(CLIENTS)]
        try:

            def all_paused() -> bool:
                connections = _connections(server)
                return len(connections) == CLIENTS and all(c.flow.write_paused for c in connections)

            until(all_paused, "every connection's writes paused (its client reads nothing)")
            held = [c.transport.get_write_buffer_size() for c in _connections(server)]
            assert max(held) <= HELD_MOST, held
            assert _open_on(bundle) == CLIENTS  # each streams from its open file
        finally:
            for sock in readers:
                sock.close()
        # Each streamed answer's descriptor is closed once its client has gone.
        until(lambda: _open_on(bundle) == 0, "no descriptor left open on the bundle")

        # A client that reads gets it whole, with its length declared.
        answer = httpx.get(
            f"{server.url}/log/tile/entries/000",
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-length"] == str(BUNDLE)
        assert answer.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert answer.content == _bundle()
        head = httpx.head(
            f"{server.url}/log/tile/entries/000",
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert head.status_code == 200, head.text
        assert head.headers["content-length"] == str(BUNDLE)
        assert head.content == b""
        until(lambda: _open_on(bundle) == 0, "no descriptor left open after a GET and a HEAD")


def test_the_chunk_this_test_assumes_is_the_gateways() -> None:
    from gateway.admin.log_stream import CHUNK as STREAMED

    assert STREAMED == CHUNK


def test_a_file_cut_short_under_its_stream_ends_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer never truncates a log file in place, but if someone does while its
    stream runs, the client must not take what it got for the whole file: the answer
    declared the length it opened with, and the connection ends short of it."""
    from gateway.admin import log_stream

    bundle = tmp_path / "log" / "tile" / "entries" / "000"
    read = log_stream.OpenLogFile.read

    def truncating(self: log_stream.OpenLogFile, offset: int) -> bytes:
        if offset == CHUNK:  # the first chunk is sent: cut the file under the open descriptor
            os.truncate(bundle, 3 * CHUNK)
        return read(self, offset)

    monkeypatch.setattr(log_stream.OpenLogFile, "read", truncating)
    with _server(tmp_path) as server:
        url = f"{server.url}/log/tile/entries/000"
        with httpx.stream("GET", url, headers={"authorization": f"Bearer {TOKEN}"}) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-length"] == str(BUNDLE)
            with pytest.raises(httpx.RemoteProtocolError):  # not a short body taken whole
                answer.read()
        until(lambda: _open_on(bundle.resolve()) == 0, "no descriptor left open on the bundle")
