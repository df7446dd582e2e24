"""An `owngate serve` process run with a test's hook as its `sitecustomize`, behind a raw
backend that answers a request naming `first` with a large whole answer and any other
with a small one: the set-up of the shutdown and drain tests whose client reads nothing
(tests/integration/test_shutdown_unread.py, test_drain_head_cut.py). The hook watches (or
bends a buffer size) inside the gateway process and prints what it saw, so a test waits
on what happened there, never on a sleep."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from gateway.body_writer import BodyWriter
from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import backend
from tests.helpers.log_truth import ORIGIN
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import records
from tests.helpers.raw_backend import Post

__all__ = ["big_or_small", "check_first_answered_second_cut", "lost_seen", "start_hooked"]


def big_or_small(
    big: bytes, small: bytes
) -> Callable[[asyncio.StreamWriter, Post], Coroutine[Any, Any, bool]]:
    """A raw backend's answer: `big` to a request whose body names `first`, else `small`,
    each a whole 200 JSON answer with its content-length."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        body = big if b"first" in post.body else small
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(body) + body)
        await writer.drain()
        return False

    return answer


def start_hooked(
    backend_url: str,
    tmp_path: Path,
    hook: str,
    key: str,
    *,
    write_timeout_s: float = 600,
    drain_timeout_s: float = 60,
) -> GatewayProcess:
    """The gateway (provenance log on, JSON access log, tenant `key`), run with `hook` as
    its `sitecustomize` (first on its PYTHONPATH)."""
    write_signing_key(tmp_path / "log.key", ORIGIN)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port(), "write_timeout_s": write_timeout_s},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "limits": {"drain_timeout_s": drain_timeout_s, "max_held_answer_bytes": 64 << 20},
        "backends": [backend("gpu", backend_url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(key)], "models": ["*"]}],
        "provenance": {"dir": "log", "origin": ORIGIN, "signing_key_file": "log.key"},
    }
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(hook)
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH")) if p)
    return GatewayProcess(config, tmp_path, env={"PYTHONPATH": path}).start()


def check_first_answered_second_cut(tmp_path: Path, first_status: int = 200) -> None:
    """The log under `tmp_path` holds two requests: the first's completion says
    `first_status` (200: its client took the answer; else, committing to none of it: a
    client that never read it, its connection dropped by the forced end, 503, or by the
    write timeout, 499); the second's dispatch and completion, that completion the
    gateway's cut (503) committed to none of the answer (the client got none of it, or
    its head alone)."""
    logged = records(tmp_path / "log")
    ids = list(dict.fromkeys(r["request_id"] for r in logged))
    assert len(ids) == 2, logged
    first = [r for r in logged if r["request_id"] == ids[0]]
    assert [(r["type"], r.get("status")) for r in first][-1] == ("completion", first_status), first
    if first_status != 200:
        assert first[-1]["response_commitment"] is None, first
    second = [r for r in logged if r["request_id"] == ids[1]]
    assert [r["type"] for r in second] == ["dispatch", "completion"]
    assert second[1]["status"] == 503, second
    assert second[1]["response_commitment"] is None, second


def lost_seen(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once an in-process gateway's listener saw a client's connection go
    (`BodyWriter.lost`, called from `connection_lost`, whether or not the proxy still
    watches)."""
    seen = threading.Event()
    lost = BodyWriter.lost

    def noticed(writer: BodyWriter) -> None:
        lost(writer)
        seen.set()

    monkeypatch.setattr(BodyWriter, "lost", noticed)
    return seen
