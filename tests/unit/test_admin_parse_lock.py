"""The admin API parses a client's YAML (a candidate config, policy test cases) one
request at a time: each can cost seconds of CPU in a worker thread that competes with
the event loop serving tenants, so parallel requests must not multiply it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading

import httpx

from gateway.admin.app import AdminControl
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.admin import CASES
from tests.helpers.gateways import backend
from tests.helpers.waiting import until_async

TOKEN = "og-admin-parse-lock-token"


class _Watched(asyncio.Lock):
    """A lock that counts the callers that asked for it."""

    asked = 0

    async def acquire(self) -> bool:
        self.asked += 1
        return await super().acquire()


def test_a_policy_test_waits_for_a_running_config_validation() -> None:
    digest = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
        "admin": {"token_hashes": [digest]},
    }
    admin = admin_app(create_app(GatewaySettings.model_validate(config)))
    inside, release = threading.Event(), threading.Event()

    def validate(text: str) -> list[str]:  # a slow parse, until the test releases it
        inside.set()
        release.wait(30)
        return []

    control: AdminControl = admin.state.control
    admin.state.control = dataclasses.replace(control, validate=validate)
    lock = admin.state.parse_lock = _Watched()
    headers = {"authorization": f"Bearer {TOKEN}"}

    async def run() -> None:
        transport = httpx.ASGITransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            validating = asyncio.create_task(
                client.post("/admin/v1/config/validate", json={"yaml": "{}"}, headers=headers)
            )
            try:
                await until_async(inside.is_set, "the validation running")
                testing = asyncio.create_task(
                    client.post(
                        "/admin/v1/policies/test", json={"cases_yaml": CASES}, headers=headers
                    )
                )
                await until_async(lambda: lock.asked == 2, "the policy test asking for the lock")
                assert not testing.done()
            finally:
                release.set()
            assert (await validating).status_code == 200
            assert (await testing).status_code == 200

    asyncio.run(run())
