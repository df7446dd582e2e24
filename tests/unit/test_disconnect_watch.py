"""The proxy's disconnect watch (`watch_disconnect`, gateway/api/exchange.py) on the
listener's protocol, driven with a recording transport (no socket): the connection's
loss cancels the request's task and marks its client gone, with no task of its own per
request; once the request is over it does nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.server import ServerState

from gateway.api.exchange import Exchange, cut_status, watch_disconnect
from gateway.body_writer import body_writer, drop
from gateway.config.schema import ListenSettings
from gateway.listener import LimitedHttpProtocol, http_protocol
from gateway.serving import uvicorn_config
from tests.helpers.listener_protocol import RecordingTransport

POST = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"


class _ReadingTransport(RecordingTransport):
    """Records whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _protocol(app: Callable[..., Any]) -> LimitedHttpProtocol:
    config = uvicorn_config(app, ListenSettings())
    config.load()
    return http_protocol(ListenSettings())(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )


class _Watched:
    """An app that reads the body, watches for the client leaving and waits for `done`;
    what it saw is kept."""

    def __init__(self) -> None:
        self.watching = asyncio.Event()
        self.done = asyncio.Event()
        self.exchange: Exchange | None = None
        self.tasks_before = self.tasks_after = 0
        self.cancelled = False
        self.before_watch: Callable[[], object] = lambda: None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        exchange = self.exchange = Exchange(b"req_1", 0.0, "chat", writer=body_writer(scope))
        self.before_watch()
        self.tasks_before = len(asyncio.all_tasks())
        unwatch = watch_disconnect(receive, exchange)
        self.tasks_after = len(asyncio.all_tasks())
        try:
            self.watching.set()
            await self.done.wait()
        except asyncio.CancelledError:
            self.cancelled = True
        finally:
            unwatch()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_a_lost_connection_cancels_the_request_with_no_task_per_request() -> None:
    async def scenario() -> _Watched:
        app = _Watched()
        protocol = _protocol(app)
        protocol.connection_made(_ReadingTransport())  # type: ignore[arg-type]
        protocol.data_received(POST)
        await app.watching.wait()
        protocol.connection_lost(None)
        await asyncio.gather(*protocol.tasks)
        return app

    app = asyncio.run(scenario())
    assert app.exchange is not None and app.exchange.client_gone
    assert app.cancelled
    assert app.tasks_after == app.tasks_before  # a callback from the listener, not a task


def test_once_the_request_is_over_a_lost_connection_changes_nothing() -> None:
    async def scenario() -> _Watched:
        app = _Watched()
        protocol = _protocol(app)
        protocol.connection_made(_ReadingTransport())  # type: ignore[arg-type]
        protocol.data_received(POST)
        await app.watching.wait()
        app.done.set()
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(None)
        return app

    app = asyncio.run(scenario())
    assert app.exchange is not None and not app.exchange.client_gone
    assert not app.cancelled


def test_watching_reads_a_paused_connection_again_so_its_loss_is_seen() -> None:
    """uvicorn pauses reading after a large body's last read, or behind a pipelined
    request; a `receive` after the body reads again. The watch must too."""

    async def scenario() -> tuple[bool, _Watched]:
        app = _Watched()
        protocol = _protocol(app)
        transport = _ReadingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        # Paused once the body was read, as after the last read of one past uvicorn's mark.
        app.before_watch = protocol.flow.pause_reading
        protocol.data_received(POST)
        await app.watching.wait()
        for _ in range(3):  # the old watch task's first step, had it one
            await asyncio.sleep(0)
        reading = transport.reading
        app.done.set()
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(None)
        return reading, app

    reading, _app = asyncio.run(scenario())
    assert reading


def _pipelined_then_lost(*, dropped: bool) -> _Watched:
    """Two requests in one read: the first is watched, the second queued behind it
    (uvicorn's newest cycle); the connection is then lost (reset), or dropped by the
    server first (`drop`, a forced shutdown)."""

    async def scenario() -> _Watched:
        app = _Watched()
        protocol = _protocol(app)
        protocol.connection_made(_ReadingTransport())  # type: ignore[arg-type]
        protocol.data_received(POST * 2)
        await app.watching.wait()
        assert protocol.pipeline  # the second waits its turn
        if dropped:
            drop(protocol)
        protocol.connection_lost(ConnectionResetError())
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
        return app

    return asyncio.run(scenario())


def test_a_lost_connection_cancels_the_request_answered_with_one_pipelined_behind() -> None:
    # uvicorn's `connection_lost` marks and wakes only its newest cycle (the one queued):
    # the request being answered was never told, and its backend worked on.
    app = _pipelined_then_lost(dropped=False)
    assert app.exchange is not None and app.exchange.client_gone
    assert app.cancelled
    assert cut_status(app.exchange)[0] == 499


def test_a_dropped_connection_cuts_the_request_answered_with_one_pipelined_behind() -> None:
    # `drop` marked only the newest cycle's request as the gateway's cut.
    app = _pipelined_then_lost(dropped=True)
    assert app.exchange is not None and app.cancelled
    assert cut_status(app.exchange)[0] == 503
