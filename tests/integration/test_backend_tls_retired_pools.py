"""The pools of a config a reload retired, with requests of that config still running.

A reload closes the pools of the backends it removed or rebuilt once the requests that
were running at the swap are done, or after `limits.drain_timeout_s`. A request still
running then (failing over, say) must not open a connection on such a closed pool: under
the settings of a config no longer in force (docs/backend-tls.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.upstream.http import UpstreamError
from tests.helpers.gateways import Sim
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
