"""Log scans on the admin API run one at a time: finding a request's records
(`/admin/v1/log/requests/{id}`) reads the whole log, as an audit report does, in a worker
thread that takes the GIL from the loop serving tenants; lookups wait for the running
scan (report.py `scanning`), and past the waiting bound one is told to retry (429)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gateway.admin.report import MAX_WAITING_REPORTS
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.provenance import LogDirectory
from tests.helpers.gateways import backend
from tests.helpers.waiting import until_async

TOKEN = "og-admin-log-scans-token"
HEADERS = {"authorization": f"Bearer {TOKEN}"}


def _admin(tmp_path: Path) -> FastAPI:
    (tmp_path / "log").mkdir()
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "provenance": {"dir": "log", "origin": "scans.test/log", "signing_key_file": "k"},
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    return admin_app(create_app(GatewaySettings.model_validate(config), config_dir=tmp_path))


class _Scans:
    """LogDirectory's scan for a request, held until released, counting who is inside."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def find_request(self, request_id: str, size: int) -> list[object]:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        self.release.wait(30)
        with self._lock:
            self.inside -= 1
        return []


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Scans]:
    held = _Scans()
    monkeypatch.setattr(LogDirectory, "latest_note", lambda log: b"scans.test/log\n7\nroot\n")
    monkeypatch.setattr(LogDirectory, "find_request_entries", held.find_request)
    yield held
    held.release.set()


def test_request_lookups_scan_the_log_one_at_a_time(tmp_path: Path, scans: _Scans) -> None:
    admin = _admin(tmp_path)

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            first = asyncio.create_task(client.get("/admin/v1/log/requests/a", headers=HEADERS))
            await until_async(lambda: scans.inside == 1, "the first lookup scanning")
            second = asyncio.create_task(client.get("/admin/v1/log/requests/b", headers=HEADERS))
            await until_async(lambda: admin.state.report_waiting == 1, "the second one waiting")
            assert scans.inside == 1
            scans.release.set()
            return [await first, await second]

    answers = asyncio.run(run())
    assert [a.status_code for a in answers] == [404, 404]  # no record of either
    assert scans.most == 1


def test_lookups_beyond_the_waiting_bound_are_told_to_retry(tmp_path: Path, scans: _Scans) -> None:
    admin = _admin(tmp_path)
    admin.state.report_waiting = MAX_WAITING_REPORTS  # as many as may wait already do

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get("/admin/v1/log/requests/a", headers=HEADERS)

    busy = asyncio.run(run())
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
    assert scans.most == 0
