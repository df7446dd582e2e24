"""A key pin rotated over two reloads, with requests still running on older configs.

The rotation: gateway.yaml pins key A; a reload pins [A, B]; the backend moves to
certificate B; a reload pins [B] alone. Key A is withdrawn from then on (it may be the
reason for the rotation: a leaked key). Requests that began under an older config finish
on its backend pool, and a failover attempt of theirs opens (or reuses) a connection
from it; each such connection must pass the latest settings and the ones the request was
decided under (docs/backend-tls.md): a pool that only saw the first reload kept the
settings of that reload, and went on accepting key A after the second.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.http import HttpPool, UpstreamError
from gateway.upstream.tls import system_tls
from tests.helpers.gateways import Sim
from tests.helpers.tls_rotation import Rotation


def test_a_pin_rotated_over_two_reloads_withdraws_the_old_key_from_every_pool(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    rotation = Rotation(start_sim, tmp_path)

    async def run() -> None:
        rotation.hold()  # a request from before the first reload runs to the end
        try:
            first = rotation.pool()  # its requests were decided under pins [A]
            assert await rotation.peer(first) == rotation.pin_a
            assert await rotation.reload([rotation.pin_a, rotation.pin_b])
            second = rotation.pool()  # decided under [A, B]
            assert await rotation.peer(first) == rotation.pin_a
            assert await rotation.peer(second) == rotation.pin_a
            rotation.front.swap(rotation.b)  # the backend moves to certificate B
            assert await rotation.peer(second) == rotation.pin_b
            assert await rotation.peer(first) is None  # not among the pins it was decided on
            assert await rotation.reload([rotation.pin_b])
            third = rotation.pool()
            # B passes the latest pins and [A, B]: the second reload does not refuse it to
            # the requests decided under the first
            assert await rotation.peer(third) == rotation.pin_b
            assert await rotation.peer(second) == rotation.pin_b
            # Key A, withdrawn by the second reload, is refused by every pool: also by the
            # one that only its requests from before the first reload still use
            rotation.front.swap(rotation.a)
            assert await rotation.peer(third) is None
            assert await rotation.peer(second) is None
            assert await rotation.peer(first) is None
        finally:
            await rotation.close()

    asyncio.run(run())


@pytest.mark.parametrize("between", [{"first_byte_timeout_s": 7}, {}], ids=["changed", "same"])
def test_an_idle_connection_under_the_withdrawn_key_is_not_reused(
    start_sim: Callable[..., Sim], tmp_path: Path, between: dict[str, Any]
) -> None:
    # A first reload that rebuilds the backend with the same TLS settings (another
    # setting changed), or keeps it; then pins [B] alone, while the backend still
    # presents A. A connection authenticated under A and idle in the oldest pool must
    # not be handed out again, nor a new one to A opened.
    rotation = Rotation(start_sim, tmp_path)

    async def run() -> None:
        rotation.hold()  # a request from before the first reload runs to the end
        try:
            first = rotation.pool()
            idle = await first.connect()
            held = await first.connect()  # a request holds it across both reloads
            idle.release()
            # rebuilt (a new pool), or nothing to reload (the same pool)
            assert await rotation.reload([rotation.pin_a], **between) == bool(between)
            assert (rotation.pool() is first) != bool(between)
            assert await rotation.reload([rotation.pin_b], **between)
            held.release()  # its request ended: closed, not pooled
            with pytest.raises(UpstreamError) as caught:
                await first.connect()
            assert caught.value.kind == "tls"
            assert "is not among tls.pin_spki_sha256" in caught.value.detail
            assert first.open_connections == 0
        finally:
            await rotation.close()

    asyncio.run(run())


def test_a_pool_replaced_twice_is_retrusted_when_the_one_in_between_is_gone() -> None:
    """Three reloads that each rebuilt the backend: no request uses the middle config any
    more (its pool is collected) while one from the first still runs. The third reload's
    settings must still reach the first pool."""

    def pool() -> HttpPool:
        return HttpPool(
            "127.0.0.1",
            1,
            tls=system_tls("127.0.0.1"),
            connect_timeout=1,
            first_byte_timeout=1,
            read_timeout=1,
            max_connections=1,
        )

    first, second, third = pool(), pool(), pool()
    decided = first.tls
    second.succeed(first)
    third.succeed(second)
    gone = weakref.ref(second)
    del second
    gc.collect()
    assert gone() is None
    latest = system_tls("127.0.0.1")
    third.retrust(latest)
    assert first.tls is latest
    assert first._built_with is decided  # and what its requests were decided under
