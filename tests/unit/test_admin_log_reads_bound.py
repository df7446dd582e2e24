"""The log's tiles and checkpoint are read within a bound, per admin token and in all
(gateway/admin/tiles.py, gateway/admin/work.py `LOG_READS`), and a read past it waits
its turn in a short line, fair across tokens (gateway/admin/read_line.py).

`GET /log/checkpoint` and `/log/tile/...` were sync routes, run in anyio's default 40
threads with no bound of their own: one auditor token could hold every one of them (40
entry bundles of 16 MiB read at once) while other auditors waited. Then a token past
`LOG_READS_PER_CALLER` reads in flight got 429 at once: a tlog client fetching more
tiles than that in parallel got 429 for the rest. Now those wait (up to
`LOG_WAITING_PER_CALLER` of one token's) and are served once a read ends; another token
is still served meanwhile; past the line, 429 `rate_limit_exceeded` with `retry-after: 1`.

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
from gateway.admin import work as admin_work
from gateway.admin.work import LOG_READS, LOG_READS_PER_CALLER, AdminWork
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


def _app(tmp_path: Path) -> tuple[AdminWork, httpx.AsyncClient]:
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
    client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=GATE_S)
    return app.state.log_reads, client


def _waiting(work: AdminWork) -> int:
    """Reads waiting their turn (an `AdminWork` without a line, as before it, has none)."""
    waiting = getattr(work, "waiting", None)
    return 0 if waiting is None else int(waiting())


def _get(client: httpx.AsyncClient, who: str, path: str) -> asyncio.Task[httpx.Response]:
    headers = {"authorization": f"Bearer {TOKENS[who]}"}
    return asyncio.ensure_future(client.get(f"/log/{path}", headers=headers))


def _refused(answer: httpx.Response, bound: str) -> None:
    assert answer.status_code == 429, (answer.status_code, answer.text)
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert error["code"] == "rate_limit_exceeded", error
    assert bound in error["message"], error


def test_a_token_fetching_more_tiles_than_its_share_waits_its_turn_while_another_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token `a` holds LOG_READS_PER_CALLER reads and sends as many more: they wait in
    the line (not 429) and are all served once the held ones end; token `b` is served
    meanwhile, and none of it runs in anyio's threads. Past its share of the line, `a`'s
    next read is 429 at once. Before: `a`'s reads past its share were 429 at once."""
    reads = HeldReads(read_log_file, tmp_path / "log")
    monkeypatch.setattr(tiles, "read_log_file", reads)
    # The line's reads wait until the gate opens, however long a busy machine takes to get
    # there: refused at LOG_WAIT_S (10 s), they would fail the test, not the gateway.
    monkeypatch.setattr(admin_work, "LOG_WAIT_S", GATE_S)
    limiter = anyio.to_thread.current_default_thread_limiter

    async def run() -> None:
        held: list[asyncio.Task[httpx.Response]] = []
        work, client = _app(tmp_path)
        async with client:
            try:
                held += [_get(client, "a", HELD) for _ in range(LOG_READS_PER_CALLER)]
                await until_async(lambda: reads.waiting == LOG_READS_PER_CALLER, "a's reads held")
                more = [_get(client, "a", "checkpoint") for _ in range(LOG_READS_PER_CALLER)]
                held += more
                await until_async(
                    lambda: any(t.done() for t in more) or _waiting(work) == len(more),
                    "a's further reads waiting (or answered)",
                )
                assert not any(t.done() for t in more), [t.result().text for t in more if t.done()]
                assert limiter().borrowed_tokens == 0  # none in anyio's threads

                served = await _get(client, "b", "checkpoint")
                assert served.status_code == 200, served.text
                assert served.content == NOTE
            finally:
                reads.gate.set()
                answers = await asyncio.gather(*held)
            assert [a.status_code for a in answers] == [200] * len(held), [a.text for a in answers]
            assert [a.content for a in answers] == [TILE] * LOG_READS_PER_CALLER + [NOTE] * len(
                more
            )
            again = await _get(client, "a", "checkpoint")
            assert again.status_code == 200, again.text

    asyncio.run(run())


def test_reads_past_the_bound_in_all_wait_and_past_the_line_are_429(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`a` and `b` hold LOG_READS reads between them; `c`'s read waits (the bound in all)
    and is served once reads end (which waiting read goes first: test_admin_read_line.py).
    `a`'s read past LOG_WAITING_PER_CALLER waiting is 429 at once."""
    reads = HeldReads(read_log_file, tmp_path / "log")
    monkeypatch.setattr(tiles, "read_log_file", reads)
    # The line's reads wait until the gate opens, however long a busy machine takes to get
    # there: refused at LOG_WAIT_S (10 s), they would fail the test, not the gateway.
    monkeypatch.setattr(admin_work, "LOG_WAIT_S", GATE_S)

    async def run() -> None:
        held: list[asyncio.Task[httpx.Response]] = []
        work, client = _app(tmp_path)
        async with client:
            try:
                for who in ("a", "b"):
                    held += [_get(client, who, HELD) for _ in range(LOG_READS_PER_CALLER)]
                await until_async(lambda: reads.waiting == LOG_READS, "a's and b's reads held")
                a_line = [_get(client, "a", HELD) for _ in range(admin_work.LOG_WAITING_PER_CALLER)]
                held += a_line
                await until_async(lambda: _waiting(work) == len(a_line), "a's line")
                _refused(await _get(client, "a", "checkpoint"), "as many as one token may")
                c_read = _get(client, "c", HELD)
                held.append(c_read)
                await until_async(lambda: _waiting(work) == len(a_line) + 1, "c waiting")
                assert not c_read.done()
            finally:
                reads.gate.set()
                answers = await asyncio.gather(*held)
            assert [a.status_code for a in answers] == [200] * len(held), [a.text for a in answers]

    asyncio.run(run())
