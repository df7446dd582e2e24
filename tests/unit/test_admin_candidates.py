"""The admin API with a candidate config's validation (`AdminControl.validate`) under
the test's control: a client's YAML (a candidate config, policy test cases) is parsed
one request at a time (each can cost seconds of CPU in a worker thread that competes
with the event loop serving tenants), and a fault is an OpenAI error object."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
from collections.abc import Callable
from typing import Literal

import httpx
from fastapi import FastAPI

from gateway.admin.control import AdminControl
from gateway.admin.models import MAX_CANDIDATE_BYTES
from gateway.admin.report import MAX_WAITING_REPORTS
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.admin import CASES
from tests.helpers.gateways import backend
from tests.helpers.waiting import until_async

TOKEN = "og-admin-parse-lock-token"


class _Watched(asyncio.Lock):
    """A lock that counts the callers that asked for it."""

    asked = 0

    async def acquire(self) -> Literal[True]:
        self.asked += 1
        return await super().acquire()


HEADERS = {"authorization": f"Bearer {TOKEN}"}


def _admin(validate: Callable[[str], list[str]]) -> FastAPI:
    """A gateway's admin app (TOKEN: full access) whose validation is `validate`."""
    digest = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
        "admin": {"token_hashes": [digest]},
    }
    admin = admin_app(create_app(GatewaySettings.model_validate(config)))
    control: AdminControl = admin.state.control
    admin.state.control = dataclasses.replace(control, validate=validate)
    return admin


def test_a_policy_test_waits_for_a_running_config_validation() -> None:
    inside, release = threading.Event(), threading.Event()

    def validate(text: str) -> list[str]:  # a slow parse, until the test releases it
        inside.set()
        release.wait(30)
        return []

    admin = _admin(validate)
    lock = admin.state.parse_lock = _Watched()

    async def run() -> None:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            validating = asyncio.create_task(
                client.post("/admin/v1/config/validate", json={"yaml": "{}"}, headers=HEADERS)
            )
            try:
                await until_async(inside.is_set, "the validation running")
                testing = asyncio.create_task(
                    client.post(
                        "/admin/v1/policies/test", json={"cases_yaml": CASES}, headers=HEADERS
                    )
                )
                await until_async(lambda: lock.asked == 2, "the policy test asking for the lock")
                assert not testing.done()
            finally:
                release.set()
            assert (await validating).status_code == 200
            assert (await testing).status_code == 200

    asyncio.run(run())


def test_a_fault_is_an_error_object() -> None:
    def validate(text: str) -> list[str]:
        raise RuntimeError("a bug")

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(_admin(validate), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            body = {"yaml": "{}"}
            return await client.post("/admin/v1/config/validate", json=body, headers=HEADERS)

    answer = asyncio.run(run())
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "internal_error"  # was Starlette's plain text
    assert "a bug" not in answer.text


def test_a_candidate_over_the_bound_is_refused_unparsed() -> None:
    parsed: list[str] = []

    def validate(text: str) -> list[str]:
        parsed.append(text)
        return []

    async def run(size: int) -> httpx.Response:
        transport = httpx.ASGITransport(_admin(validate))
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            body = {"yaml": "#" * size}
            return await client.post("/admin/v1/config/validate", json=body, headers=HEADERS)

    assert asyncio.run(run(MAX_CANDIDATE_BYTES)).status_code == 200
    refused = asyncio.run(run(MAX_CANDIDATE_BYTES + 1))
    assert refused.status_code == 400 and "body.yaml" in refused.json()["error"]["message"]
    assert len(parsed) == 1


def test_reports_beyond_the_waiting_bound_are_told_to_retry() -> None:
    admin = _admin(lambda text: [])
    admin.state.report_waiting = MAX_WAITING_REPORTS  # as many as may wait already do

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get("/admin/v1/log/report", headers=HEADERS)

    busy = asyncio.run(run())
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
    admin.state.report_waiting = 0
    assert asyncio.run(run()).status_code == 404  # then it is served (this gateway: no log)
