"""What the simulator keeps of the requests it received is bounded in bytes, not only in
count: `owngate demo` serves its tenants from simulators, and 256 bodies at the gateway's
8 MiB limit held 2 GiB (the prompts included) long after their answers."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.sim import SimSettings, create_sim_app

CAPTURED_BYTES = 32 << 20  # docs/simulator.md: the bodies kept, the newest one aside


async def _post(app: Any, path: str, body: bytes) -> int:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


def test_the_requests_kept_are_bounded_in_bytes() -> None:
    app = create_sim_app(SimSettings.for_kind("vllm", models=("m",)))
    size = 1 << 20
    count = 300  # more bodies than the count bound, together far over the byte bound

    async def run() -> list[int]:
        return [await _post(app, "/nowhere", bytes([65 + i % 26]) * size) for i in range(count)]

    assert set(asyncio.run(run())) == {404}
    kept = app.captured()
    assert sum(len(r.body) for r in kept) <= CAPTURED_BYTES
    assert kept, "the newest requests are still kept"
    assert kept[-1].body == bytes([65 + (count - 1) % 26]) * size  # the latest, whole


def test_a_body_over_the_bound_is_kept_alone() -> None:
    """A test that sends one body larger than the bound still reads it back whole."""
    app = create_sim_app(SimSettings.for_kind("vllm", models=("m",)))
    big = b"x" * (CAPTURED_BYTES + 1)

    async def run() -> None:
        await _post(app, "/nowhere", b"small")
        await _post(app, "/nowhere", big)

    asyncio.run(run())
    assert [r.body for r in app.captured()] == [big]
