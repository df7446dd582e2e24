"""The prefill backlog the score strategy reads: prompt tokens sent to a backend that has
not answered its first byte yet. Counted at dispatch, uncounted at the first byte or when
the attempt ends however it ends, over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from gateway.sim import Faults
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend
from tests.helpers.waiting import until_async

HEADERS = {"authorization": f"Bearer {TENANT_KEY}"}


def _chat(gateway: Gateway, stream: bool = False, max_tokens: int = 3) -> httpx.Response:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "a longer prompt " * 50}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=30)


def test_a_request_counts_until_its_first_byte_then_never_again(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # One slot, held by a stream too long to end within the test: the second request
    # waits in the server's queue, with no first byte, until the first one's client
    # leaves. (Timed answers made this depend on the test outpacing their decode.)
    sim = start_sim(zero_latency=False, slots=1, decode_tokens_per_s=20.0)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    state = gateway.app.registry.backends["gpu"]

    def body(max_tokens: int) -> dict[str, object]:
        content = "a longer prompt " * 50
        return {
            "model": "sim-model",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
        }

    async def scenario() -> tuple[tuple[int, int], tuple[int, int], int]:
        async with httpx.AsyncClient(base_url=gateway.url, headers=HEADERS, timeout=60) as http:
            async with http.stream("POST", "/v1/chat/completions", json=body(7000)) as first:
                assert first.status_code == 200
                chunks = first.aiter_raw()  # kept: a dropped iterator closes the response
                await anext(chunks)  # its first byte came through
                streaming = (state.inflight, state.prefilling)
                second = asyncio.create_task(http.post("/v1/chat/completions", json=body(3)))
                await until_async(
                    lambda: state.prefilling > 0, "the second was dispatched", timeout=20.0
                )
                queued = (state.inflight, state.prefilling)
            # The first one's client left: the backend frees the slot for the second.
            status = (await second).status_code
            await until_async(lambda: state.inflight == 0, "both attempts ended", timeout=20.0)
            return streaming, queued, status

    streaming, queued, status = asyncio.run(scenario())
    assert streaming == (1, 0)  # streaming, no longer prefilling
    # Queued behind the first: ~4 bytes of request JSON per token, never negative.
    assert queued[0] == 2 and 150 < queued[1] < 400
    assert status == 200
    assert (state.inflight, state.prefilling) == (0, 0)


def test_failed_attempts_leave_no_backlog_behind(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    hanging = start_sim(faults=Faults(hang_rate=1.0))
    failing = start_sim(zero_latency=True, faults=Faults(error_rate=1.0))
    dying = start_sim(zero_latency=True, faults=Faults(die_mid_stream_rate=1.0))
    gateway = start_gateway(
        [
            backend("hang", hanging.url, "sim-model"),
            backend("fail", failing.url, "sim-model"),
            backend("die", dying.url, "sim-model"),
        ],
        limits={"first_byte_timeout_s": 0.3},
    )
    for stream in (False, True, False, True):
        _chat(gateway, stream=stream)
    for state in gateway.app.registry.backends.values():
        assert (state.id, state.inflight, state.prefilling) == (state.id, 0, 0)
