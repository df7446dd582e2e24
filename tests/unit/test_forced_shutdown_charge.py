"""uvicorn's forced shutdown (`DrainingServer._end_now`) cancels the requests still
running; one making its tenant's charge (`settle`: on Redis, one script call) must not
be cut inside it, as no other cancellation is (`gateway.api.exchange.cancel`): cancelled
partway, the charge is lost (`Admission.release` runs once) and the tenant used tokens it
is never charged for."""

from __future__ import annotations

import asyncio

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
