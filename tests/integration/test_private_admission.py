"""A private backend whose breaker admits no request when a request's turn to try it comes
is skipped: no dispatch record names it (nothing was sent to it), its reason still
reaches the client, as a hosted provider's does (tests/integration/test_hosted_breaker.py).

Model `m` is served by `slow` and then `broken` (round robin: a fresh gateway's first
order is the config's). Request A for `m` meets `slow`, which holds it until the test lets
go and then closes the connection with no answer (a failure before the client saw a
byte: A fails over). Meanwhile a request for model `n`, which only `broken` serves, gets
a 500 from it, and that opens `broken`'s breaker (threshold 1): with one tenant the
backend's own, with two the tenant's own on it (gateway/routing/tenant_breakers.py).
Both backends are scripted raw backends on loopback.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    admin_status,
    backend,
    logged_gateway,
)
from tests.helpers.provenance import records, request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until, until_async

ORIGIN = "owngate.test/private-admission"
ERROR = b'{"error": {"message": "the server choked", "type": "server_error"}}'
ONE_TENANT = [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}]
TWO_TENANTS = [
    *ONE_TENANT,
    {"id": "globex", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]},
]


async def error_500(writer: asyncio.StreamWriter, _post: Post) -> bool:
    writer.write(
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(ERROR) + ERROR
    )
    await writer.drain()
    return False


def chat(gateway: Gateway, model: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers=gateway.headers,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("tenants", "closed_to"),
    [
        (ONE_TENANT, "backend"),  # the backend's own breaker
        (TWO_TENANTS, "tenant"),  # the breaker of the tenant whose request failed
    ],
    ids=["backend-breaker", "tenant-breaker"],
)
def test_a_private_backend_its_breaker_refuses_is_skipped_with_no_dispatch_record(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    tenants: list[dict[str, Any]],
    closed_to: str,
) -> None:
    released = threading.Event()

    async def hold_then_close(_writer: asyncio.StreamWriter, _post: Post) -> bool:
        await until_async(released.is_set, "the test to let `slow` answer", timeout=60)
        return False  # closed, no answer: nothing reached the client, the next may serve

    slow, broken = start_raw(hold_then_close), start_raw(error_500)
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        [backend("slow", slow.url, "m"), backend("broken", broken.url, "m", "n")],
        ORIGIN,
        tenants=tenants,
        routing={
            "pools": {"m": {"strategy": "round_robin"}},
            "breaker": {"failure_threshold": 1, "cooldown_s": 600, "max_cooldown_s": 600},
        },
    )
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(chat, gateway, "m")
            until(lambda: len(slow.posts) == 1, "request A held by `slow`", timeout=30)
            assert chat(gateway, "n").status_code >= 500  # `broken` failed it: open now
            assert len(broken.posts) == 1
            released.set()
            response = pending.result(timeout=60)
    finally:
        released.set()
    # Nothing of A went to `broken`, and no record says it did: one dispatch, to `slow`.
    assert len(broken.posts) == 1
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_unavailable"
    # Why it was skipped is the operator's (/admin/status), never in the client's error.
    assert "broken" not in error["message"] and "breaker" not in error["message"], error
    (entry,) = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "broken"]
    if closed_to == "backend":
        assert entry["breaker"]["state"] == "open", entry
    else:
        assert [t["state"] for t in entry["breaker"]["tenants"]] == ["open"], entry
    # A later request (`broken` is down at its planning: refused, with a refusal record):
    # once a checkpoint covers its record, it covers every record of A, written before.
    later = chat(gateway, "n")
    assert later.status_code == 503, later.text
    log = tmp_path / "log"
    request_records(log, later.headers["x-request-id"])
    request_id = response.headers["x-request-id"]
    found = [r for r in records(log) if r["request_id"] == request_id]
    assert [r["type"] for r in found] == ["dispatch", "completion"]
    assert found[0]["backend"]["id"] == "slow"
    assert found[1]["status"] == 503  # the last completion: what the client got
