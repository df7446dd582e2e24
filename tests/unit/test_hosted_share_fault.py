"""A hosted connector that fails while a private pool makes room (aiohttp's private fields
not as gateway/upstream/hosted_sockets.py reads them, a connector of a closed loop) fails
that connect, loudly, and does not take the private pool's connection slot with it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.http import HttpPool
from gateway.upstream.sockets import BackendSockets


class _Broken:
    def open_count(self) -> int:
        raise AttributeError("_conns")

    def oldest_idle(self) -> float | None:
        raise AttributeError("_conns")

    def drop_oldest_idle(self) -> None:
        raise AttributeError("_conns")


def test_a_failing_hosted_connector_does_not_leak_a_private_slot() -> None:
    async def scenario() -> None:
        sockets = BackendSockets(10)
        broken = _Broken()
        sockets.join(broken)
        pool, _ = HttpPool.for_url(
            "http://127.0.0.1:9",
            connect_timeout=5.0,
            first_byte_timeout=5.0,
            read_timeout=5.0,
            max_connections=1,
            sockets=sockets,
        )
        for _ in range(2):  # the second waits for a slot the first never gave back
            with pytest.raises(AttributeError, match="_conns"):
                await pool.connect()
        assert pool._limit.locked() is False  # the slot is what leaked
        await pool.close()

    asyncio.run(scenario())
