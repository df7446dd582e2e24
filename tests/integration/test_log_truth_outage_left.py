"""The log writes (and then refuses) the dispatch record of a request's next attempt (the
first private backend was sent the request and failed) while the client leaves, or a
drain cuts the request: the next backend gets nothing, and the request's last record (the
first attempt's completion) says what the client got: 499 (nothing), or the cut's 503.
Before, it said the first attempt's 502 whatever the client got: it was written before
the refused record, and stayed."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api import exchange as exchange_module
from gateway.api.recorder import Recorder
from gateway.provenance.writer import segment_writer
from tests.helpers.audit_rig import (
    ASKS_USAGE,
    WHOLE,
    failing_over_onto_the_log,
    first_request_settled,
    request_log,
)
from tests.helpers.gateways import Gateway
from tests.helpers.independent_audit import Received, audit
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until


class HangingDisk:
    """`os` for the write-ahead segment: while `hang`, a write blocks until `release`
    (bounded: 30 s), then fails (EIO), as a disk that hangs and then errors."""

    def __init__(self) -> None:
        self.hang = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        written = os.pwrite(fd, data, offset)
        if self.hang:
            self.hang = False
            self.entered.set()
            self.release.wait(30)
            raise OSError(errno.EIO, "Input/output error")
        return written


def _failing_over(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Gateway, str, HangingDisk, RawBackend, RawBackend]:
    """A gateway whose first backend fails (502) and makes the log's next write hang
    (until `release`), then fail: that of the second attempt's dispatch record."""
    disk = HangingDisk()
    monkeypatch.setattr(segment_writer, "os", disk)

    def arm() -> None:
        disk.hang = True

    gateway, vkey, a, b = failing_over_onto_the_log(
        start_raw, start_gateway, tmp_path, arm, limits={"drain_timeout_s": 30.0}
    )
    return gateway, vkey, disk, a, b


@pytest.mark.parametrize("ask", [WHOLE, ASKS_USAGE], ids=["whole", "stream"])
def test_a_client_that_leaves_while_the_next_dispatch_record_fails_is_logged_499(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ask: dict[str, object],
) -> None:
    gateway, vkey, disk, a, b = _failing_over(start_raw, start_gateway, tmp_path, monkeypatch)
    left = threading.Event()
    cancel = exchange_module.cancel

    def noticed(task: asyncio.Task[Any]) -> None:
        left.set()  # the gateway saw the client go
        cancel(task)

    monkeypatch.setattr(exchange_module, "cancel", noticed)
    body = json.dumps(ask).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {gateway.key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert disk.entered.wait(30), "the next attempt's dispatch record was never written"
    client.close()  # the client leaves while that write hangs
    assert left.wait(30), "the gateway never saw the client go"
    disk.release.set()  # the write fails: the next attempt is not made
    request_id = first_request_settled(tmp_path / "log", vkey)
    records = request_log(tmp_path / "log", vkey, request_id)
    assert len(a.posts) == 1 and b.posts == []
    assert [r["type"] for r in records] == ["dispatch", "completion"], records
    assert records[-1]["status"] == 499, records[-1]  # the client got nothing


@pytest.mark.parametrize("ask", [WHOLE, ASKS_USAGE], ids=["whole", "stream"])
def test_a_drain_cut_while_the_next_dispatch_record_fails_is_logged_as_the_503_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ask: dict[str, object],
) -> None:
    gateway, vkey, disk, a, b = _failing_over(start_raw, start_gateway, tmp_path, monkeypatch)
    tasks: list[asyncio.Task[Any]] = []
    settle = Recorder.settle

    def settling(recorder: Recorder, *args: Any) -> Any:
        task = asyncio.current_task()
        if task is not None and not tasks:
            tasks.append(task)  # the request's
        return settle(recorder, *args)

    monkeypatch.setattr(Recorder, "settle", settling)
    with ThreadPoolExecutor(1) as pool:
        try:
            asked = pool.submit(
                httpx.post,
                f"{gateway.url}/v1/chat/completions",
                content=json.dumps(ask).encode(),
                headers={**gateway.headers, "content-type": "application/json"},
                timeout=30,
            )
            assert disk.entered.wait(30), "the next attempt's dispatch record was never written"
            (task,) = tasks
            loop = task.get_loop()
            loop.call_soon_threadsafe(gateway.app.begin_drain)
            loop.call_soon_threadsafe(task.cancel)  # the drain's cut, while the write hangs
            until(lambda: task.cancelling() > 0, "the cut")
        finally:
            disk.release.set()  # the write fails: the next attempt is not made
        response = asked.result(30)
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "not_ready"
    request_id = response.headers["x-request-id"]
    received = Received(503, dict(response.headers), response.content, json.dumps(ask).encode())
    first_request_settled(tmp_path / "log", vkey)
    records = request_log(tmp_path / "log", vkey, request_id)
    assert len(a.posts) == 1 and b.posts == []
    assert [r["type"] for r in records] == ["dispatch", "completion"], records
    assert records[-1]["status"] == 503, records[-1]  # the cut the client got
    assert audit(received, tmp_path / "log", vkey) == []
