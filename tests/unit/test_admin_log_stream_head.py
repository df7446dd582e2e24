"""A HEAD of a streamed log file sends its head alone and reads no chunk past the first
(gateway/admin/log_stream.py, gateway/admin/headers.py `HEAD_ONLY`).

`HeadAsGet` runs a HEAD as the GET and drops the body's messages. For an entry bundle
streamed from its open file, that GET read the file through, chunk by chunk (up to 255
reads of 64 KiB in the log-read threads, each a turn of the event loop the public
gateway shares), for bytes nobody was sent, and held none of the token's four reads
while doing it: an auditor could keep every connection's worth of them going with HEADs
that cost it nothing to receive. Now the head goes out with the file's length and the
descriptor is closed. The admin app runs in process (httpx's ASGI transport)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path

import httpx
import pytest

from gateway.admin import log_stream
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-log-stream-head-token"
BUNDLE = bytes(range(256)) * (5 * log_stream.CHUNK // 256) + b"tail"  # six chunks
NAME = "tile/entries/000"


def _client(tmp_path: Path) -> httpx.AsyncClient:
    log = tmp_path / "log"
    (log / "tile" / "entries").mkdir(parents=True)
    (log / NAME).write_bytes(BUNDLE)
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": "head.test/log", "signing_key_file": "k"},
        "admin": {
            "tokens": [
                {"hash": "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest(), "role": "auditor"}
            ]
        },
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    )


def _open_on(path: Path) -> int:
    """How many of this process's descriptors are open on the file at `path`."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # one closed meanwhile
            count += fd.readlink() == path
    return count


def test_a_head_of_a_streamed_bundle_reads_no_chunk_past_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets: list[int] = []
    read = log_stream.OpenLogFile.read

    def counted(self: log_stream.OpenLogFile, offset: int) -> bytes:
        offsets.append(offset)
        return read(self, offset)

    monkeypatch.setattr(log_stream.OpenLogFile, "read", counted)

    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with _client(tmp_path) as client:
            return await client.head(f"/log/{NAME}"), await client.get(f"/log/{NAME}")

    head, get = asyncio.run(run())
    assert head.status_code == 200, head.text
    assert head.headers["content-length"] == str(len(BUNDLE))
    assert head.headers["cache-control"] == "private, max-age=31536000, immutable"
    assert head.content == b""
    # Only the GET read its chunks past the first (the HEAD before it read none).
    assert offsets == list(range(log_stream.CHUNK, len(BUNDLE), log_stream.CHUNK))
    assert get.status_code == 200 and get.content == BUNDLE
    assert get.headers["content-length"] == head.headers["content-length"]
    assert _open_on((tmp_path / "log" / NAME).resolve()) == 0
