"""The pools of a config a reload retired, with requests of that config still running.

A reload closes the pools of the backends it removed or rebuilt once the requests that
were running at the swap are done, or after `limits.drain_timeout_s`. A request still
running then (failing over, say) must not open a connection on such a closed pool: under
the settings of a config no longer in force. And while a pool is still open, a later
config's TLS settings for its backend reach it also when the backend was removed in
between (and brought back) or moved to another host or port: a pin withdrawn since is
withdrawn from every request still running (docs/backend-tls.md).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.routing.registry import Registry
from gateway.upstream.http import UpstreamError
from tests.helpers.gateways import Sim, backend, gateway_config
from tests.helpers.tls_rotation import Rotation


def test_a_pool_closed_with_its_retired_config_opens_no_connection(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    rotation = Rotation(start_sim, tmp_path)

    async def run() -> None:
        try:
            first = rotation.pool()
            held = await first.connect()  # a request's, across the reload
            assert await rotation.reload([rotation.pin_a], url=None, spare=True)  # gpu removed
            assert rotation.app.reloader is not None
            # no request was running at the swap: the retired pools are closed at once
            await asyncio.gather(*rotation.app.reloader._tasks)
            with pytest.raises(UpstreamError) as caught:
                await first.connect()  # a request still running past the drain timeout
            assert caught.value.kind == "retired"
            assert first.open_connections == 1  # the held one only: none was opened
            held.release()  # its request ended: closed, never pooled in a closed pool
            assert first.open_connections == 0
        finally:
            await rotation.close()

    asyncio.run(run())


def test_a_backend_removed_and_brought_back_withdraws_the_old_pin_from_its_old_pool(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    rotation = Rotation(start_sim, tmp_path)

    async def run() -> None:
        rotation.hold()  # a request from before the removal runs to the end
        try:
            first = rotation.pool()  # decided under pins [A]
            assert await rotation.peer(first) == rotation.pin_a
            assert await rotation.reload([rotation.pin_a], url=None, spare=True)
            assert await rotation.reload([rotation.pin_b], spare=True)  # back, B alone
            assert await rotation.peer(rotation.pool()) is None  # the backend still shows A
            # The request from before the removal may fail over to gpu again (the newest
            # policy admits it): key A, withdrawn, is refused to it too
            assert await rotation.peer(first) is None
        finally:
            await rotation.close()

    asyncio.run(run())


def test_a_backend_moved_to_another_port_withdraws_the_old_pin_at_the_old_address(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    rotation = Rotation(start_sim, tmp_path)

    async def run() -> None:
        rotation.hold()
        try:
            first = rotation.pool()  # decided under pins [A], at the first front
            assert await rotation.peer(first) == rotation.pin_a
            moved = rotation.start_front(rotation.b)
            assert await rotation.reload([rotation.pin_b], url=moved.url)
            assert await rotation.peer(rotation.pool(), moved) == rotation.pin_b
            # the old address still presents key A, which gpu may no longer present
            assert await rotation.peer(first) is None
        finally:
            await rotation.close()

    asyncio.run(run())


def test_a_removed_backends_pools_reach_a_later_config_each_directly() -> None:
    """gpu rebuilt, then removed, then back: no request uses the config in between any
    more (its pool is collected) while one from the first still runs. The settings of
    the config that brings gpu back must still reach the first pool."""

    def registry(key: int | None) -> Registry:
        """spare, and gpu (unless `key` is None) pinning one made-up key"""
        backends = [backend("spare", "http://127.0.0.1:2", "m")]
        if key is not None:
            pin = "sha256//" + base64.b64encode(bytes([key]) * 32).decode()
            tls = {"pin_spki_sha256": [pin]}
            backends.append(backend("gpu", "https://127.0.0.1:1", "m", tls=tls))
        return Registry.build(gateway_config(backends))

    first, second, removed, back = registry(1), registry(2), registry(None), registry(3)
    pool = first.backends["gpu"].pool
    assert pool is not None
    decided = pool.tls
    first.hand_over_tls(second)
    second.hand_over_tls(removed)
    gone = weakref.ref(second.backends["gpu"].pool)
    del second
    gc.collect()
    assert gone() is None
    removed.hand_over_tls(back)
    latest = back.backends["gpu"].tls
    assert latest is not None and latest is not decided
    assert pool.tls is latest
    assert pool._built_with is decided  # and what its requests were decided under
