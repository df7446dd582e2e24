"""A failed attempt leaves no reference cycle holding its caller's frames (the request's
body among their locals): `recorded` (gateway/api/recorded_attempt.py) kept the `TryNext`
of a failed connect, and the error of a key that lapsed, where the frames it raised them
through could reach them (tests/integration/test_request_cycles.py runs every outcome
through a gateway)."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import cast

import pytest

from gateway.api.exchange import Exchange, TryNext
from gateway.api.metrics import GatewayMetrics
from gateway.api.recorded_attempt import recorded
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.registry import BackendState
from gateway.upstream.http import Connection
from tests.helpers.cycles import holders

MARK = b"ATTEMPT-CYCLE-MARK"


async def _request(connect_fails: bool, lapses_after: int | None) -> None:
    """A request's frame (its body a local) making one attempt that fails."""
    body = MARK * 10_000
    calls = 0

    def lapsed() -> GatewayError | None:
        nonlocal calls
        calls += 1
        if lapses_after is not None and calls > lapses_after:
            return GatewayError(ErrorCode.invalid_api_key, "the key was revoked")
        return None

    async def connect() -> Connection:
        raise TryNext("b: connect")

    async def attempt(_connection: Connection | None) -> None:
        raise TryNext(f"b: HTTP 503 ({len(body)} bytes sent)")

    with contextlib.suppress(TryNext, GatewayError):  # the client's error: the frame ends
        await recorded(
            None,
            cast("GatewayMetrics", SimpleNamespace()),
            Exchange(b"req_1", 0.0, "chat"),
            cast("BackendState", SimpleNamespace(id="b")),
            attempt,
            connect if connect_fails else None,
            lapsed=lapsed,
        )


@pytest.mark.parametrize(
    ("connect_fails", "lapses_after"),
    [(True, None), (False, None), (False, 1), (True, 1)],
    ids=["connect fails", "attempt fails", "key lapses after dispatch", "both"],
)
def test_a_failed_attempt_leaves_no_cycle_holding_the_body(
    collector_off: None, connect_fails: bool, lapses_after: int | None
) -> None:
    holders(MARK.decode())
    asyncio.run(_request(connect_fails, lapses_after))
    assert holders(MARK.decode()) == []
