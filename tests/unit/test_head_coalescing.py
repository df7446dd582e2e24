"""A response's head goes out with its first body bytes (gateway/coalescing.py), driven
through the listener's protocol with a recording transport (no socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.server import ServerState

from gateway.coalescing import HeadCoalescer
from gateway.config.schema import ListenSettings
from gateway.listener import http_protocol
from gateway.serving import uvicorn_config
from tests.helpers.listener_protocol import RecordingTransport

REQUEST = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"


def _serve(
    app: Any,
    transport: RecordingTransport,
    request: bytes = REQUEST,
    served: list[Any] | None = None,
) -> list[bytes]:
    """What `app` wrote for `request`; `served` gets the protocol instance."""

    async def scenario() -> list[bytes]:
        config = uvicorn_config(app, ListenSettings())
        config.load()
        protocol = http_protocol(ListenSettings())(
            config=config,
            server_state=ServerState(),
            app_state={},
            _loop=asyncio.get_running_loop(),
        )
        if served is not None:
            served.append(protocol)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(request)
        await asyncio.gather(*protocol.tasks)  # the app's task for this request
        assert protocol.cycle.response_complete or served  # else the listener refused
        for _ in range(3):  # let a held head's end-of-turn flush run, should one be left
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport.writes

    return asyncio.run(scenario())


def test_a_whole_answer_is_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
        )
        await send({"type": "http.response.body", "body": b"hello"})

    writes = _serve(app, RecordingTransport())
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\nhello")


def test_a_streams_head_goes_out_at_the_end_of_the_turn_without_waiting_for_a_chunk() -> None:
    transport = RecordingTransport()
    before_first_chunk: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
        await send(start)
        for _ in range(3):
            await asyncio.sleep(0)  # the first chunk is late: other turns of the loop pass
        before_first_chunk.extend(transport.writes)
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    writes = _serve(app, transport)
    assert len(before_first_chunk) == 1 and before_first_chunk[0].startswith(b"HTTP/1.1 200 OK")
    assert b"".join(writes).endswith(b"data: 1\n\n\r\n0\r\n\r\n")


def test_the_coalescer_keeps_order_and_writes_nothing_after_close() -> None:
    async def scenario() -> list[bytes]:
        transport = RecordingTransport()
        coalescer = HeadCoalescer(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        coalescer.write(b"head")
        coalescer.write(b"body")
        coalescer.write(b"more")
        late = HeadCoalescer(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        late.write(b"held")
        coalescer.close()
        await asyncio.sleep(0)  # late's flush runs on a closed transport: dropped
        return transport.writes

    assert asyncio.run(scenario()) == [b"headbody", b"more"]


# A refusal the listener writes itself (gateway/listener.py) goes straight to the
# transport. uvloop reads a socket before it runs the loop's callbacks, so the next bytes
# can be parsed and refused after a cycle's first write was held and before its flush:
# the head of an answer to HEAD (no body write carries it) or a `100 Continue` before a
# body whose framing is broken. The held bytes went out after the refusal, after EOF
# (uvloop raises: a traceback in the loop's log).

HEAD = b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n"
CONTINUED = (
    b"POST /x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _refused_after_a_held_write(request: bytes) -> bytes:
    served: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["method"] == "HEAD":
            headers = [(b"content-length", b"2")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"ok"})  # HEAD: not written
            served[0].data_received(b"\x00 not a request\r\n\r\n")
        else:
            reading = asyncio.ensure_future(receive())  # writes `100 Continue` (held)
            await asyncio.sleep(0)
            served[0].data_received(b"zz\r\n")  # not a chunk size
            await reading

    return b"".join(_serve(app, RecordingTransport(), request, served))


@pytest.mark.parametrize("request_bytes", [HEAD, CONTINUED], ids=["head-of-HEAD", "100-continue"])
def test_a_refusal_never_overtakes_a_held_write(request_bytes: bytes) -> None:
    out = _refused_after_a_held_write(request_bytes)
    held = b"HTTP/1.1 200 OK\r\n" if request_bytes is HEAD else b"HTTP/1.1 100 Continue\r\n\r\n"
    assert out.startswith(held), out[:80]
    assert out.count(b"HTTP/1.1 400 Bad Request") == 1


# uvloop closes a connection its client reset at once (a read fails) and calls the
# protocol's `connection_lost` only on a later turn; a write in between raised
# `RuntimeError` ("the handler is closed"), out of the app's `send`: a whole answer's
# request ended as a gateway fault (500, its record committing to an answer never sent).


def test_an_answer_to_a_connection_reset_before_it_is_told_is_dropped_not_raised() -> None:
    transport = RecordingTransport()  # its write fails once closing, as uvloop's raises
    raised: list[BaseException] = []
    served: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        transport.closing = True  # reset: closed, `connection_lost` not yet delivered
        try:
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await send({**start, "headers": [(b"content-length", b"5")]})
            await send({"type": "http.response.body", "body": b"hello"})
        except BaseException as exc:  # noqa: BLE001 - what the app would see, recorded
            raised.append(exc)

    async def scenario() -> bool:
        protocol = http_protocol(ListenSettings())(
            config=_loaded(app),
            server_state=ServerState(),
            app_state={},
            _loop=asyncio.get_running_loop(),
        )
        served.append(protocol)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        disconnected: bool = protocol.cycle.disconnected  # what the proxy asks (499)
        protocol.connection_lost(ConnectionResetError())
        return disconnected

    assert asyncio.run(scenario()) is True
    assert raised == [] and transport.writes == []


def _loaded(app: Any) -> Any:
    config = uvicorn_config(app, ListenSettings())
    config.load()
    return config


def test_what_the_coalescer_holds_counts_as_unsent() -> None:
    """A held head is in no socket yet: the write buffer size the relay asks before it
    counts a stream's end as delivered (`BodyWriter.unsent`) includes it. Before, the
    coalescer had no `get_write_buffer_size` at all."""

    class Buffering(RecordingTransport):
        def get_write_buffer_size(self) -> int:
            return 7  # what the connection's own buffer holds

    async def scenario() -> tuple[int, int]:
        coalescer = HeadCoalescer(Buffering(), asyncio.get_running_loop())  # type: ignore[arg-type]
        coalescer.write(b"head")  # held until the next write or the turn's end
        held = coalescer.get_write_buffer_size()
        coalescer.flush()
        return held, coalescer.get_write_buffer_size()

    assert asyncio.run(scenario()) == (7 + len(b"head"), 7)
