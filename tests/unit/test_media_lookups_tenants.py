"""One tenant's slow URL lookups leave the other tenants lookup threads (a red-team pass
over the boundary between tenants, kept as regressions).

A hosted request's media URLs are resolved on `MAX_LOOKUPS` threads shared by every
tenant (gateway/upstream/media_urls.py). A name whose DNS server never answers holds its
thread for the resolver's whole timeout, whether or not the request still waits: one
tenant sending four such requests at a time held every thread, and every other tenant's
URL check waited behind them (and was refused when its 5 s were spent). Now one tenant's
lookups hold at most `MAX_LOOKUPS_PER_TENANT` threads, until each thread returns.

`socket.getaddrinfo` is replaced by one that holds `slow.*` names until the test lets
them go (every wait bounded) and answers a public address for any other name.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.upstream.media_urls import (
    MAX_LOOKUPS,
    MAX_LOOKUPS_PER_TENANT,
    check_media_urls,
    tenant_resolver,
)
from tests.helpers.waiting import until_async

PUBLIC = "93.184.216.34"


class _Resolver:
    """A stand-in for `socket.getaddrinfo`: `slow.*` names held until `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0  # slow lookups running on a thread now
        self._lock = threading.Lock()

    def __call__(self, host: str, port: int, *_args: Any, **_kwargs: Any) -> list[Any]:
        if host.startswith("slow."):
            with self._lock:
                self.held += 1
            self.release.wait(30)  # bounded: the fixture sets it at the end
            with self._lock:
                self.held -= 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port))]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Resolver]:
    resolver = _Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        yield resolver
    finally:
        resolver.release.set()


def _image(host: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": f"https://{host}/a.png"}}
    return {"messages": [{"role": "user", "content": [part]}]}


async def _check(tenant: str, host: str) -> None:
    await check_media_urls(_image(host), "anthropic", tenant_resolver(tenant))


def test_one_tenants_slow_lookups_leave_another_tenant_a_thread(dns: _Resolver) -> None:
    """`acme` sends as many slow lookups as there are threads; `other`'s lookup of a name
    that answers at once is answered while they still hang. Before, acme's held every
    thread and other's waited behind them."""

    async def main() -> None:
        hanging = [
            asyncio.create_task(_check("acme", f"slow.{n}.example")) for n in range(MAX_LOOKUPS)
        ]
        await until_async(lambda: dns.held >= MAX_LOOKUPS_PER_TENANT, "acme's part is held")
        try:
            answered = asyncio.create_task(_check("other", "images.example"))
            await until_async(answered.done, "other's lookup answered while acme's hang")
            answered.result()  # a public host: the URL passes
            assert dns.held == MAX_LOOKUPS_PER_TENANT  # acme's others still wait their turn
        finally:
            dns.release.set()
        await asyncio.gather(*hanging)

    asyncio.run(main())


def test_a_lookup_its_request_gave_up_on_still_holds_the_tenants_place(dns: _Resolver) -> None:
    """A request whose budget ran out stops waiting, but its thread still hangs in the
    resolver: the place stays taken until the thread returns, so a tenant cannot cycle
    requests to hold more threads than its part. Before, acme's abandoned lookups and its
    next ones took every thread."""

    async def main() -> None:
        abandoned = [
            asyncio.create_task(_check("acme", f"slow.{n}.example"))
            for n in range(MAX_LOOKUPS_PER_TENANT)
        ]
        await until_async(lambda: dns.held >= MAX_LOOKUPS_PER_TENANT, "acme's part is held")
        for task in abandoned:  # as its request's budget running out cancels the wait
            task.cancel()
        await asyncio.gather(*abandoned, return_exceptions=True)
        assert dns.held == MAX_LOOKUPS_PER_TENANT  # their threads still hang
        more = [
            asyncio.create_task(_check("acme", f"slow.again.{n}.example"))
            for n in range(MAX_LOOKUPS - MAX_LOOKUPS_PER_TENANT)
        ]
        try:
            answered = asyncio.create_task(_check("other", "images.example"))
            await until_async(answered.done, "other's lookup answered while acme's hang")
            answered.result()
            assert dns.held == MAX_LOOKUPS_PER_TENANT
        finally:
            dns.release.set()
        await asyncio.gather(*more)

    asyncio.run(main())
