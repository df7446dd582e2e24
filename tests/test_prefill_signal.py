"""The prefill backlog the score strategy reads: prompt tokens sent to a backend that has
not answered its first byte yet. Counted at dispatch, uncounted at the first byte or when
the attempt ends however it ends, over real sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from gateway.sim import Faults
from tests.conftest import TENANT_KEY, Gateway, Sim, backend

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
    # One slot and a slow decode: the second request waits in the server's queue, so it
    # has no first byte for a while, and the first streams for a while after its own.
    sim = start_sim(zero_latency=False, slots=1, decode_tokens_per_s=20.0)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    state = gateway.app.registry.backends["gpu"]
    first = threading.Thread(target=_chat, args=(gateway, True, 40))
    second = threading.Thread(target=_chat, args=(gateway, True, 3))
    first.start()
    deadline = time.monotonic() + 10
    while state.inflight < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    while state.prefilling > 0 and time.monotonic() < deadline:  # its first byte came
        time.sleep(0.005)
    assert (state.inflight, state.prefilling) == (1, 0)  # streaming, no longer prefilling
    second.start()
    while state.inflight < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    # Queued behind the first: ~4 bytes of request JSON per token, never negative.
    assert 150 < state.prefilling < 400
    first.join(30)
    second.join(30)
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
