"""One tenant's long streams and a private backend's connection pool.

Each private backend has one pool of `limits.max_connections_per_backend` connections
(gateway/upstream/http.py, a semaphore per backend), shared by every tenant, each of
which may hold at most its share of it (gateway/upstream/tenant_share.py). A stream
holds its connection for as long as the backend decodes (and, for a client that reads
nothing, until `listen.write_timeout_s` cuts it off). Here the backend paces tokens
until the test releases it, so the pool is really held; tenant `acme` opens as many
streams as the pool has connections and reads none of them, then `other` sends one
request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import httpx

from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, backend
from tests.helpers.paced_stream import paced
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until_async

TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]
POOL = 2  # limits.max_connections_per_backend


ASK = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


async def _open_unread_streams(acme: httpx.AsyncClient, held: list[httpx.Response]) -> None:
    """`acme` opens POOL long streams and reads none of them (each kept in `held`, for the
    caller to close)."""
    for _ in range(POOL):
        request = acme.build_request(
            "POST",
            "/v1/chat/completions",
            json={**ASK, "stream": True, "max_tokens": 3000},
            headers={"authorization": f"Bearer {TENANT_KEY}"},
        )
        held.append(await acme.send(request, stream=True))  # never read


async def _busy_answer(refused: httpx.Response) -> None:
    """A request refused `busy` is told when to retry: room comes back as a request ends
    (before, the 503 said nothing of when)."""
    await refused.aread()
    assert refused.json()["error"]["code"] == "backend_unavailable", refused.text
    assert refused.headers.get("retry-after") == "1", refused.headers


async def _other_asks(url: str) -> httpx.Response:
    """One ordinary request of the other tenant's."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as other:
        return await other.post(
            "/v1/chat/completions", json=ASK, headers={"authorization": f"Bearer {OTHER_KEY}"}
        )


def test_one_tenants_unread_streams_leave_another_tenant_a_connection_to_the_backend(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    """`acme` opens POOL streams to the one backend and reads none; the backend keeps
    decoding them. With two tenants, `acme` may hold half the pool
    (`limits.tenant_share_of_backend`, default 0.5): its first stream is served, its
    second is `busy` for this backend at once (503 here, with no other backend or
    fallback, and `retry-after: 1`), and `other`'s request finds a connection and is served."""
    released = threading.Event()
    raw = start_raw(paced(released))
    gateway = start_gateway(
        [backend("gpu", raw.url, "m")],
        limits={"max_connections_per_backend": POOL, "connect_timeout_s": 1.0},
        tenants=TWO_TENANTS,
    )

    def streams() -> int:
        return sum(1 for post in raw.posts if json.loads(post.body).get("stream"))

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as acme:
            held: list[httpx.Response] = []
            try:
                await _open_unread_streams(acme, held)
                await until_async(lambda: streams() == 1, "acme's stream at the backend")
                assert [response.status_code for response in held] == [200, 503]
                await _busy_answer(held[1])
                return await _other_asks(gateway.url)
            finally:
                released.set()
                for response in held:
                    await response.aclose()

    theirs = asyncio.run(run())
    assert theirs.status_code == 200, theirs.text


def test_a_tenants_concurrent_requests_below_the_pool_leave_another_tenant_a_connection(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    """What does bound it today: `acme` configured with `limits.concurrent_requests`
    below the pool's size. Its second stream is refused 429 while the first decodes, so
    a connection stays free and `other`'s request is served."""
    released = threading.Event()
    raw = start_raw(paced(released))
    limited = [{**TWO_TENANTS[0], "limits": {"concurrent_requests": POOL - 1}}, TWO_TENANTS[1]]
    gateway = start_gateway(
        [backend("gpu", raw.url, "m")],
        limits={"max_connections_per_backend": POOL, "connect_timeout_s": 1.0},
        tenants=limited,
    )

    async def run() -> tuple[list[int], httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as acme:
            held: list[httpx.Response] = []
            try:
                await _open_unread_streams(acme, held)
                theirs = await _other_asks(gateway.url)
                return [response.status_code for response in held], theirs
            finally:
                released.set()
                for response in held:
                    await response.aclose()

    statuses, theirs = asyncio.run(run())
    assert statuses == [200, 429]
    assert theirs.status_code == 200, theirs.text
