"""A whole answer the server drops because its client had already gone (uvicorn's `send`
returns without writing once the connection is lost) is not committed to: the trail
forgets it and the exchange ends as a client that left (gateway/api/exchange.py
`send_whole`). Driven through the listener's protocol with a recording transport, the
connection lost in the same loop turn as the answer, before any disconnect watcher ran."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from gateway.api.exchange import Exchange, relayed, send_whole
from gateway.api.trail import Trail
from gateway.body_writer import body_writer
from gateway.provenance import Salts
from tests.unit.test_body_writer import GET, _protocol
from tests.unit.test_head_coalescing import _Transport

ANSWER = b'{"id":"chatcmpl-1","choices":[]}'


def _answer(*, leave_first: bool) -> tuple[Exchange, bytes]:
    """Serve one whole answer; with `leave_first` the client's connection is lost just
    before the answer is sent. The exchange and what the connection wrote."""
    transport = _Transport()
    seen: dict[str, Exchange] = {}

    async def scenario() -> None:
        protocol: Any = None

        async def app(scope: Any, receive: Any, send: Any) -> None:
            exchange = Exchange(b"req_1", 0.0, "chat", writer=body_writer(scope))
            exchange.trail = Trail(Salts.generate(), "")
            seen["exchange"] = exchange
            relayed(exchange, ANSWER, whole=True)
            if leave_first:
                protocol.connection_lost(None)
            await send_whole(send, exchange, 200, ANSWER, b"application/json")

        protocol = _protocol(app)
        protocol.connection_made(transport)
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        if not leave_first:
            protocol.connection_lost(None)

    asyncio.run(scenario())
    return seen["exchange"], b"".join(transport.writes)


def test_a_whole_answer_that_went_out_is_committed_to() -> None:
    exchange, written = _answer(leave_first=False)
    assert written.endswith(ANSWER)
    assert exchange.trail is not None and exchange.trail.sent_bytes == len(ANSWER)
    assert not exchange.client_gone


def test_a_whole_answer_dropped_for_a_client_that_left_is_not_committed_to() -> None:
    exchange, written = _answer(leave_first=True)
    assert ANSWER not in written  # the server wrote nothing of it
    assert exchange.trail is not None
    assert exchange.trail.sent_bytes == 0
    assert exchange.trail.response_hash.digest() == hashlib.sha256(b"").digest()
    assert exchange.client_gone  # recorded as a client that left (499)
