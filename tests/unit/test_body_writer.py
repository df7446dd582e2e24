"""`BodyWriter` (gateway/body_writer.py): a started stream's chunks written straight to
the connection, exactly as uvicorn's `send` frames them, driven through the listener's
protocol with a recording transport (no socket)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from typing import Any

import httptools
import pytest

from gateway.api.exchange import Exchange, cut_status
from gateway.api.stream_writes import break_stream, end_stream
from gateway.body_writer import BodyWriter, body_writer
from gateway.coalescing import HeadCoalescer
from gateway.errors import ErrorCode, GatewayError
from tests.helpers.listener_protocol import GET, App, RecordingTransport, listener_protocol

HEAD = b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n"
SSE = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}
END = {"type": "http.response.body", "body": b"", "more_body": False}


def _serve(app: App, request: bytes = GET, transport: RecordingTransport | None = None) -> bytes:
    """What the connection writes while `app` answers `request`."""
    transport = transport or RecordingTransport()

    async def scenario() -> bytes:
        protocol = listener_protocol(app)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(request)
        await asyncio.gather(*protocol.tasks)
        for _ in range(3):  # a held head's end-of-turn flush, should one be left
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return b"".join(transport.writes)

    return asyncio.run(scenario())


def _body(wire: bytes) -> tuple[int, bytes]:
    """The status and the de-chunked body an HTTP client reads from `wire`."""
    got: dict[str, Any] = {"body": b""}

    class Reader:
        def on_body(self, body: bytes) -> None:
            got["body"] += body

        def on_message_complete(self) -> None:
            got["complete"] = True

    parser = httptools.HttpResponseParser(Reader())
    parser.feed_data(wire)
    assert got.get("complete"), wire
    return parser.get_status_code(), got["body"]


def test_chunks_written_directly_read_as_the_body_send_would_have_sent() -> None:
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        writer = body_writer(scope)
        assert isinstance(writer, BodyWriter)
        seen.append(writer.ready())  # before the head: not yet
        await send(SSE)
        seen.append(writer.ready())
        assert writer.write(b"data: 1\n\n") and writer.write(b"data: 2\n\n")
        assert writer.write(b"")  # nothing written: an empty chunk would end the body
        await send({"type": "http.response.body", "body": b"data: 3\n\n", "more_body": True})
        await send(END)
        seen.append(writer.ready())  # the body ended: never again

    wire = _serve(app)
    assert seen == [False, True, False]
    assert _body(wire) == (200, b"data: 1\n\ndata: 2\n\ndata: 3\n\n")
    assert wire.count(b"HTTP/1.1 200 OK") == 1  # the held head went out first, once


def test_not_ready_for_an_answer_with_a_length_or_to_a_head_request() -> None:
    seen: list[bool] = []

    async def sized(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        seen.append(body_writer(scope).ready())  # type: ignore[union-attr]
        await send({"type": "http.response.body", "body": b"ok"})

    async def head(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        seen.append(body_writer(scope).ready())  # type: ignore[union-attr]
        await send(END)

    _serve(sized)
    _serve(head, HEAD)
    assert seen == [False, False]


def test_a_client_that_left_gets_nothing_written() -> None:
    transport = RecordingTransport()
    outcome: list[bool | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        writer = body_writer(scope)
        assert writer is not None
        assert (await receive())["type"] == "http.request"
        protocol_lost.set()
        await client_gone.wait()
        before = len(transport.writes)
        outcome.append(writer.write(b"data: late\n\n"))
        outcome.append(len(transport.writes) == before)

    protocol_lost = asyncio.Event()
    client_gone = asyncio.Event()

    async def scenario() -> None:
        protocol = listener_protocol(app)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(GET)
        await protocol_lost.wait()
        protocol.connection_lost(None)
        client_gone.set()
        await asyncio.gather(*protocol.tasks)

    asyncio.run(scenario())
    assert outcome == [None, True]  # None: gone, nothing written


def test_write_paused_follows_the_client_s_buffers_and_drain_waits_for_them() -> None:
    states: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        writer = body_writer(scope)
        assert writer is not None
        states.append(writer.write_paused)
        paused.set()
        await resumed.wait()
        states.append(writer.write_paused)
        states.append(writer.write(b"data: 1\n\n"))  # written, and the client is full
        await asyncio.wait_for(writer.drain(), 5)
        states.append("drained")
        states.append(writer.write(b"data: 2\n\n"))  # it can take more
        await send(END)

    paused = asyncio.Event()
    resumed = asyncio.Event()

    async def scenario() -> None:
        protocol = listener_protocol(app)
        protocol.connection_made(RecordingTransport())  # type: ignore[arg-type]
        protocol.data_received(GET)
        await paused.wait()
        protocol.pause_writing()
        resumed.set()
        for _ in range(5):  # the app reads write_paused and waits in drain()
            await asyncio.sleep(0)
        assert "drained" not in states
        protocol.resume_writing()
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(None)

    asyncio.run(scenario())
    assert states == [False, True, False, "drained", True]


def test_a_finished_request_s_cycle_is_freed_without_the_garbage_collector() -> None:
    # The writer lives in its cycle's scope: were it to hold the cycle, every request
    # would leave a reference cycle (cycle, scope, writer) that only the cyclic GC frees,
    # and a long stream's would be promoted to the oldest generation while it runs.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        assert body_writer(scope) is not None
        await send(END)

    async def scenario() -> weakref.ref[Any]:
        protocol = listener_protocol(app)
        protocol.connection_made(RecordingTransport())  # type: ignore[arg-type]
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        first = weakref.ref(protocol.cycle)
        protocol.data_received(GET)  # the next request's cycle takes its place
        await asyncio.gather(*protocol.tasks)
        for _ in range(3):  # a held head's end-of-turn flush
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return first

    gc.disable()
    try:
        first = asyncio.run(scenario())
        assert first() is None, gc.get_referrers(first())
    finally:
        gc.enable()


def test_once_the_head_went_out_chunks_skip_the_coalescer_and_keep_their_order() -> None:
    # A paced stream's every chunk used to pass through `HeadCoalescer.write`, a Python
    # frame that only passed it on once the head had gone out.
    transports: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        writer = body_writer(scope)
        assert writer is not None
        await send(SSE)
        assert writer.ready()  # the head is still held: the coalescer stays
        transports.append(type(_cycle_of(writer).transport))
        assert writer.write(b"data: 1\n\n")  # goes out after the held head
        assert writer.ready()  # now nothing is held: the connection's own transport
        transports.append(type(_cycle_of(writer).transport))
        assert writer.write(b"data: 2\n\n")
        await send({"type": "http.response.body", "body": b"data: 3\n\n", "more_body": True})
        await send(END)

    wire = _serve(app)
    assert transports == [HeadCoalescer, RecordingTransport]
    assert _body(wire) == (200, b"data: 1\n\ndata: 2\n\ndata: 3\n\n")
    assert wire.startswith(b"HTTP/1.1 200 OK") and wire.count(b"HTTP/1.1 200 OK") == 1


def _cycle_of(writer: BodyWriter) -> Any:
    cycle = writer._cycle()
    assert cycle is not None
    return cycle


def test_close_ends_a_sized_answer_whose_head_went_out_by_closing_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A whole answer cut after its head (`TenantSurface._cut`): no ASGI message can end it
    # (an empty last body falls short of its content-length), so the connection is closed
    # (not aborted: what it buffers still goes out), as the gateway's cut, and uvicorn
    # takes the app's return as the request's end.
    transport = RecordingTransport()
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        writer = body_writer(scope)
        assert writer is not None
        await asyncio.sleep(0)  # the held head goes out at the end of the turn
        seen.append(writer.head_sent and not writer.body_sent)
        writer.close()
        seen.extend([writer.dropped, writer.gone])

    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        wire = _serve(app, transport=transport)
    assert seen == [True, True, True]
    assert transport.closing and not transport.aborted
    assert wire.startswith(b"HTTP/1.1 200 OK\r\n") and wire.endswith(b"\r\n\r\n"), wire
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_chunk_to_a_connection_reset_before_it_is_told_is_dropped_not_raised() -> None:
    """uvloop closes a reset connection at once and tells the protocol a turn later: a
    chunk written in between raised (`RuntimeError`); it is dropped, the client gone."""
    transport = RecordingTransport()  # its write fails once closing, as uvloop's raises
    outcome: list[object] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        writer = body_writer(scope)
        assert writer is not None
        assert (await receive())["type"] == "http.request"
        assert writer.write(b"data: 1\n\n") is True
        transport.closing = True  # reset: closed, `connection_lost` not yet delivered
        before = len(transport.writes)
        try:
            outcome.append(writer.write(b"data: 2\n\n"))
        except BaseException as exc:  # noqa: BLE001 - what the relay would see, recorded
            outcome.append(exc)
        outcome.extend([len(transport.writes) == before, writer.gone])

    async def scenario() -> None:
        protocol = listener_protocol(app)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(ConnectionResetError())

    asyncio.run(scenario())
    assert outcome == [None, True, True]  # None: gone, nothing written


@pytest.mark.parametrize("ending", ["end", "error"])
def test_a_streams_end_to_a_connection_reset_before_it_is_told_is_a_client_that_left(
    ending: str,
) -> None:
    """Once the stream's head went out, `ready` gives the cycle the connection's own
    transport: the stream's end (its receipt line, or an error event) went through
    uvicorn's `send` straight to it. Reset and not yet told (uvloop), that write raised out
    of the relay (`RuntimeError`, here the transport's assertion). Once the relay's pump
    is done (`guard`) it is a client that left (`CancelledError`, 499), nothing written."""
    transport = RecordingTransport()  # its write fails once closing, as uvloop's raises
    outcome: list[object] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE)
        writer = body_writer(scope)
        assert writer is not None
        assert (await receive())["type"] == "http.request"
        assert writer.ready() and writer.write(b"data: 1\n\n") is True  # with the head
        assert writer.ready()  # the head went out: the cycle has the connection's own
        assert not isinstance(scope_transport(writer), HeadCoalescer)
        writer.guard()  # the relay's pump is done (gateway/api/stream_relay.py)
        transport.closing = True  # reset: closed, `connection_lost` not yet delivered
        before = len(transport.writes)
        exchange = Exchange(b"req_1", 0.0, "chat", writer=writer)
        try:
            if ending == "end":
                await end_stream(send, exchange)
            else:
                await break_stream(send, exchange, GatewayError(ErrorCode.upstream_error, "x"))
                await end_stream(send, exchange)
        except BaseException as exc:  # noqa: BLE001 - what the relay would see, recorded
            outcome.append(type(exc))
        outcome.extend([len(transport.writes) == before, cut_status(exchange)[0]])

    async def scenario() -> None:
        protocol = listener_protocol(app)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(ConnectionResetError())

    asyncio.run(scenario())
    assert outcome == [asyncio.CancelledError, True, 499]


def scope_transport(writer: BodyWriter) -> Any:
    cycle = writer._cycle()  # which transport the cycle writes to
    assert cycle is not None
    return cycle.transport
