"""The log's tiles and checkpoint are read within a bound, per admin token and in all
(gateway/admin/tiles.py, gateway/admin/work.py `LOG_READS`).

`GET /log/checkpoint` and `/log/tile/...` were sync routes, run in anyio's default 40
threads with no bound of their own: one auditor token could hold every one of them (40
entry bundles of 16 MiB read at once) while other auditors waited. Now a token past
`LOG_READS_PER_CALLER` reads in flight, or anyone past `LOG_READS`, gets 429
`rate_limit_exceeded` with `retry-after: 1` at once, and another token is still served.

The admin app runs in process (httpx's ASGI transport); the log's reader is replaced by
one that waits on an event before reading the tile `tile/0/000` (a stand-in for a disk
that does not answer), so the reads a test holds stay held until it lets them go.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread
import httpx
import pytest

from gateway.admin import tiles
from gateway.admin.work import LOG_READS, LOG_READS_PER_CALLER
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.provenance.formats.layout import read_log_file
from tests.helpers.gateways import backend
from tests.helpers.waiting import until_async

TOKENS = {who: f"og-admin-log-reads-{who}-token" for who in ("a", "b", "c")}
HELD = "tile/0/000"  # reads of this tile wait for the test's gate
TILE = bytes(range(256)) * 32  # a full level-0 tile: 256 hashes of 32 bytes
NOTE = b"log-reads.test/log\n1\nAAAA\n"  # served as it is: the route parses nothing
GATE_S = 30.0  # a held read waits at most this long (bounds a failing test's threads)


class HeldReads:
    """`read_log_file`, except that a read of `HELD` first waits for `gate`;
    `waiting` is how many do now."""

    def __init__(self, read: Callable[..., bytes], log: Path) -> None:
        self._read, self._held = read, log / HELD
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self.waiting = 0

    def __call__(self, path: Path, limit: int, **kwargs: bool) -> bytes:
        if path == self._held:
            with self._lock:
                self.waiting += 1
            try:
                self.gate.wait(GATE_S)
            finally:
                with self._lock:
                    self.waiting -= 1
        return self._read(path, limit, **kwargs)


def _app(tmp_path: Path) -> httpx.AsyncClient:
    log = tmp_path / "log"
    (log / "tile" / "0").mkdir(parents=True)
    (log / HELD).write_bytes(TILE)
    (log / "checkpoint").write_bytes(NOTE)
    digest = {who: "sha256:" + hashlib.sha256(t.encode()).hexdigest() for who, t in TOKENS.items()}
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": "log-reads.test/log", "signing_key_file": "k"},
        "admin": {"tokens": [{"hash": h, "role": "auditor"} for h in digest.values()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))
    transport = httpx.ASGITransport(app)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=GATE_S)


def _get(client: httpx.AsyncClient, who: str, path: str) -> asyncio.Task[httpx.Response]:
    headers = {"authorization": f"Bearer {TOKENS[who]}"}
    return asyncio.ensure_future(client.get(f"/log/{path}", headers=headers))


def _refused(answer: httpx.Response, bound: str) -> None:
    assert answer.status_code == 429, (answer.status_code, answer.text)
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert error["code"] == "rate_limit_exceeded", error
    assert bound in error["message"], error


def test_a_token_holding_its_share_of_log_reads_is_429_while_another_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token `a` holds LOG_READS_PER_CALLER reads: its next one (of another file, which
    nothing holds) is 429 at once; token `b` is served meanwhile, then holds as many as
    `a`, and token `c` is 429 (the bound in all). None of it runs in anyio's threads.
    Before: `a`'s next read was served (200), in a thread of anyio's 40."""
    reads = HeldReads(read_log_file, tmp_path / "log")
    monkeypatch.setattr(tiles, "read_log_file", reads)
    limiter = anyio.to_thread.current_default_thread_limiter

    async def run() -> None:
        held: list[asyncio.Task[httpx.Response]] = []
        async with _app(tmp_path) as client:
            try:
                held += [_get(client, "a", HELD) for _ in range(LOG_READS_PER_CALLER)]
                await until_async(lambda: reads.waiting == LOG_READS_PER_CALLER, "a's reads held")
                _refused(await _get(client, "a", "checkpoint"), "as many as one token may")
                assert limiter().borrowed_tokens == 0  # none in anyio's threads

                served = await _get(client, "b", "checkpoint")
                assert served.status_code == 200, served.text
                assert served.content == NOTE

                held += [_get(client, "b", HELD) for _ in range(LOG_READS - len(held))]
                await until_async(lambda: reads.waiting == LOG_READS, "b's reads held too")
                _refused(await _get(client, "c", "checkpoint"), "as many as it runs")
            finally:
                reads.gate.set()
                answers = await asyncio.gather(*held)
            assert [a.status_code for a in answers] == [200] * LOG_READS
            assert all(a.content == TILE for a in answers)
            again = await _get(client, "a", "checkpoint")
            assert again.status_code == 200, again.text

    asyncio.run(run())
