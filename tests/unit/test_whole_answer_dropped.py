"""A whole answer the server drops because its client had already gone (uvicorn's `send`
returns without writing once the connection is lost) is not committed to: the trail
forgets it and the exchange ends as a client that left (gateway/api/exchange.py
`send_whole`); a stream whose end is dropped so ends too (`end_stream`), and both are
recorded 499. Driven through the listener's protocol with a recording transport, the
connection lost in the same loop turn as the answer, before any disconnect watcher ran."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

from gateway.api.exchange import Exchange, relayed, send_relayed, send_whole
from gateway.api.metrics import GatewayMetrics
from gateway.api.recorded_attempt import recorded_on
from gateway.api.recorder import Recorder
from gateway.api.stream_writes import end_stream, start_stream
from gateway.api.trail import Trail
from gateway.body_writer import body_writer
from gateway.policy import Decision
from gateway.provenance import Salts
from gateway.routing.registry import BackendState
from tests.helpers.listener_protocol import GET, RecordingTransport, listener_protocol

ANSWER = b'{"id":"chatcmpl-1","choices":[]}'
CHUNK = b'data: {"choices":[]}\n\n'

Leave = Callable[[], None]
Handler = Callable[[Exchange, Any, Leave], Awaitable[None]]


def _serve(handle: Handler, transport: RecordingTransport | None = None) -> None:
    """Serve one GET through the listener's protocol: `handle(exchange, send, leave)`
    answers it (`leave()` loses the client's connection there and then, in the answer's
    loop turn; otherwise it is lost after the answer)."""

    async def scenario() -> None:
        protocol: Any = None
        left: list[bool] = []

        def leave() -> None:
            left.append(True)
            protocol.connection_lost(None)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            exchange = Exchange(b"req_1", 0.0, "chat", writer=body_writer(scope))
            exchange.trail = Trail(Salts.generate(), "")
            await handle(exchange, send, leave)

        protocol = listener_protocol(app)
        protocol.connection_made(transport or RecordingTransport())
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        if not left:
            protocol.connection_lost(None)

    asyncio.run(scenario())


def _answer(*, leave_first: bool) -> tuple[Exchange, bytes, Exchange | None]:
    """Serve one whole answer; with `leave_first` the client's connection is lost just
    before the answer is sent. The exchange, what the connection wrote, and the exchange
    again if sending it was cancelled."""
    transport = RecordingTransport()
    seen: dict[str, Exchange] = {}

    async def handle(exchange: Exchange, send: Any, leave: Leave) -> None:
        seen["exchange"] = exchange
        relayed(exchange, ANSWER, whole=True)
        if leave_first:
            leave()
        try:
            await send_whole(send, exchange, 200, ANSWER, b"application/json")
        except asyncio.CancelledError:  # a client that left: the proxy absorbs it
            seen["cancelled"] = exchange

    _serve(handle, transport)
    return seen["exchange"], b"".join(transport.writes), seen.get("cancelled")


def test_a_whole_answer_that_went_out_is_committed_to() -> None:
    exchange, written, cancelled = _answer(leave_first=False)
    assert written.endswith(ANSWER)
    assert exchange.trail is not None and exchange.trail.sent_bytes == len(ANSWER)
    assert not exchange.client_gone and cancelled is None


def test_a_whole_answer_dropped_for_a_client_that_left_is_not_committed_to() -> None:
    exchange, written, cancelled = _answer(leave_first=True)
    assert ANSWER not in written  # the server wrote nothing of it
    assert exchange.trail is not None
    assert exchange.trail.sent_bytes == 0
    assert exchange.trail.response_hash.digest() == hashlib.sha256(b"").digest()
    assert exchange.client_gone  # recorded as a client that left (499)
    assert cancelled is exchange and not exchange.response_started


class _Recorder:
    """What `recorded_on` uses of the recorder: the completion's status kept."""

    def __init__(self) -> None:
        self.completed: list[tuple[int, str | None]] = []

    async def dispatch(self, *args: object) -> None:
        return None

    def complete(
        self,
        exchange: Exchange,
        trail: Trail,
        *,
        status: int,
        error: str | None,
        held: bool = False,
    ) -> None:
        # None of these fail over: held only when nothing went out and the app's answer
        # is still to come, here a whole answer whose client left (`Proxy.answered` then
        # writes it with the 499 it holds).
        assert not held or (exchange.client_gone and not exchange.response_started)
        self.completed.append((status, error))


def _recorded(
    steps: Callable[[Exchange, Any, Leave], Awaitable[None]],
) -> tuple[list[tuple[int, str | None]], int]:
    """The completion records of one attempt whose `steps` run inside
    `recorded_on` (the bracket every attempt runs in), and the bytes its trail committed
    to."""
    recorder = _Recorder()
    metrics = SimpleNamespace(observe_dispatch_wait=id)
    sent: list[int] = []

    async def handle(exchange: Exchange, send: Any, leave: Leave) -> None:
        exchange.decision = cast("Decision", object())
        backend = cast("BackendState", SimpleNamespace(id="b"))
        with contextlib.suppress(asyncio.CancelledError):  # the proxy absorbs it (499)
            await recorded_on(
                cast("Recorder", recorder),
                cast("GatewayMetrics", metrics),
                exchange,
                backend,
                lambda: steps(exchange, send, leave),
                None,
            )
        assert exchange.trail is not None
        sent.append(exchange.trail.sent_bytes)

    _serve(handle)
    return recorder.completed, sent[0]


def _recorded_answer(*, leave_first: bool) -> list[tuple[int, str | None]]:
    """The completion records of one whole answer; with `leave_first`, the client's
    connection is lost just before the answer is sent."""

    async def steps(exchange: Exchange, send: Any, leave: Leave) -> None:
        exchange.status = 200
        exchange.response_started = True
        relayed(exchange, ANSWER, whole=True)
        if leave_first:
            leave()
        await send_whole(send, exchange, 200, ANSWER, b"application/json")

    return _recorded(steps)[0]


def _recorded_stream(*, leave_first: bool) -> tuple[list[tuple[int, str | None]], int]:
    """The completion records of a relayed stream whose client's connection is lost (with
    `leave_first`) after its first chunk went out and before its end, all in one loop
    turn; and the bytes its trail committed to."""

    async def steps(exchange: Exchange, send: Any, leave: Leave) -> None:
        await start_stream(send, exchange, 200, b"text/event-stream")
        await send_relayed(send, exchange, CHUNK)
        if leave_first:
            leave()
        await send_relayed(send, exchange, CHUNK)
        await end_stream(send, exchange)

    return _recorded(steps)


def test_the_record_of_a_whole_answer_that_went_out_says_its_status() -> None:
    assert _recorded_answer(leave_first=False) == [(200, None)]


def test_the_record_of_a_whole_answer_dropped_for_a_client_that_left_says_499() -> None:
    # The signed log must say what the client got: nothing, the client having left, not
    # a 200 whose response commitment is empty.
    assert _recorded_answer(leave_first=True) == [(499, "client closed the request")]


def test_the_record_of_a_stream_that_ended_says_its_status() -> None:
    assert _recorded_stream(leave_first=False) == ([(200, None)], 2 * len(CHUNK))


def test_the_record_of_a_stream_whose_client_left_before_its_end_says_499() -> None:
    # The client got the first chunk and then nothing: not a stream that ended (200).
    assert _recorded_stream(leave_first=True) == (
        [(499, "client closed the request")],
        len(CHUNK),
    )
