"""uvicorn's forced shutdown (`DrainingServer._end_now`) cancels the requests still
running; one making its tenant's charge (`settle`: on Redis, one script call) must not
be cut inside it, as no other cancellation is (`gateway.api.exchange.cancel`): cancelled
partway, the charge is lost (`Admission.release` runs once) and the tenant used tokens it
is never charged for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import uvicorn

from gateway.api.exchange import Exchange, settle
from gateway.serving import DrainingServer


class _Lifespan:
    async def shutdown(self) -> None:
        return None


def test_a_forced_shutdown_lets_a_charge_being_made_finish() -> None:
    async def run() -> tuple[bool, bool]:
        entered, go_on = asyncio.Event(), asyncio.Event()
        charged = False

        async def charge() -> None:
            nonlocal charged
            entered.set()
            await go_on.wait()  # the Redis call in flight
            charged = True

        exchange = Exchange(b"req_x", 0.0, "chat")
        exchange.charge = charge
        # log_config=None, as gateway.serving does: uvicorn's default dictConfig would
        # give the process's `uvicorn` logger its own handler and stop it propagating
        config = uvicorn.Config(app=lambda *_: None, log_config=None)
        server = DrainingServer(config, on_drain=lambda: None)
        server.lifespan = _Lifespan()
        request = asyncio.create_task(settle(exchange))
        server.server_state.tasks.add(request)
        await entered.wait()
        ending = asyncio.create_task(server._end_now())
        await asyncio.sleep(0)  # one loop turn: the cancellation asked for
        go_on.set()
        await ending
        return charged, request.cancelled()

    charged, cancelled = asyncio.run(run())
    assert charged  # made whole, then the cancellation raised
    assert cancelled


class _Recorded:
    """The lifespan shutdown (it closes the provenance log), noting whether `request`
    had ended when it began."""

    def __init__(self) -> None:
        self.request: asyncio.Task[None] | None = None
        self.request_ended: bool | None = None

    async def shutdown(self) -> None:
        assert self.request is not None
        self.request_ended = self.request.done()


class _OnCut(logging.Handler):
    """Calls `then` when uvicorn's graceful timeout says it cancels the requests."""

    def __init__(self, then: Callable[[], None]) -> None:
        super().__init__()
        self._then = then

    def emit(self, record: logging.LogRecord) -> None:
        if "timeout graceful shutdown exceeded" in record.getMessage():
            self._then()


def test_a_graceful_timeout_lets_a_charge_finish_and_the_request_end_before_the_log_closes() -> (
    None
):
    """uvicorn's graceful timeout running out cancelled the requests still running the
    plain way (`task.cancel`: a charge in flight was lost) and ran the lifespan shutdown
    (which closes the log) at once, before their cut answers and records were made."""

    async def run() -> tuple[bool, bool, bool | None]:
        entered, go_on = asyncio.Event(), asyncio.Event()
        charged = False

        async def charge() -> None:
            nonlocal charged
            entered.set()
            await go_on.wait()  # the Redis call in flight when the timeout passes
            charged = True

        exchange = Exchange(b"req_x", 0.0, "chat")
        exchange.charge = charge
        config = uvicorn.Config(app=lambda *_: None, timeout_graceful_shutdown=0, log_config=None)
        server = DrainingServer(config, on_drain=lambda: None)
        server.servers = []  # (uvicorn sets them when it starts listening)
        lifespan = server.lifespan = _Recorded()
        request = lifespan.request = asyncio.create_task(settle(exchange))
        server.server_state.tasks.add(request)
        request.add_done_callback(server.server_state.tasks.discard)
        await entered.wait()
        handler = _OnCut(go_on.set)
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addHandler(handler)
        try:
            await server.shutdown()
        finally:
            uvicorn_log.removeHandler(handler)
        return charged, request.cancelled(), lifespan.request_ended

    charged, cancelled, ended_first = asyncio.run(run())
    assert charged  # made whole, then the cancellation raised
    assert cancelled
    assert ended_first  # the log closed only after the request ended
