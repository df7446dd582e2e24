"""Streams are relayed as they arrive, and a client that leaves cancels the backend work."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import httpx
import pytest

from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend
from tests.helpers.waiting import until


def _stream_body(max_tokens: int) -> bytes:
    return (
        b'{"model": "sim-model", "stream": true, "max_tokens": %d,'
        b' "messages": [{"role": "user", "content": "hi"}]}' % max_tokens
    )


def _raw_stream_request(max_tokens: int) -> bytes:
    """A stream request as raw HTTP/1.1, for tests that hold the socket themselves."""
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-length: %d\r\n\r\n" % len(_stream_body(max_tokens))
    ) + _stream_body(max_tokens)


def test_chunks_arrive_while_the_backend_is_still_generating(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # 10 tokens/s: the backend takes ~2 s over 20 tokens. A relay that buffered the answer
    # would hand the client its first chunk only once the backend had finished; this one
    # must hand it over while the backend still has the request (counted, not timed:
    # before, arrival times against the whole stream's, which a loaded machine skewed).
    sim = start_sim(decode_tokens_per_s=10.0, prefill_tokens_per_s=1e6)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    chunks = 0
    generating_at_first: int | None = None
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        content=_stream_body(20),
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=30,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: {"):
                if chunks == 0:
                    generating_at_first = sim.app.stats.in_flight
                chunks += 1
    assert chunks >= 20
    assert generating_at_first == 1  # the first token out before the last one existed


def _leave_mid_stream(sim: Sim, gateway: Gateway, requests: int) -> None:
    """Send `requests` stream requests at once on one connection (the later ones wait
    their turn behind the first), leave once the first stream runs: the backend's work
    must be dropped within moments."""
    with socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10) as sock:
        sock.sendall(_raw_stream_request(400) * requests)
        received = b""
        while b"data: {" not in received:  # the stream is running
            chunk = sock.recv(65536)
            assert chunk, "gateway closed the stream"
            received += chunk
        until(lambda: sim.app.stats.in_flight == 1, "one request at the backend", timeout=30.0)
    until(lambda: sim.app.stats.in_flight == 0, "the upstream request dropped", timeout=30.0)
    assert sim.app.stats.cancelled == 1
    assert sim.app.stats.completed == 0
    assert gateway.app.registry.backends["gpu"].inflight == 0


def test_client_disconnect_cancels_the_upstream_request(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(decode_tokens_per_s=20.0, prefill_tokens_per_s=1e6)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    _leave_mid_stream(sim, gateway, 1)


def test_non_stream_disconnect_cancels_too(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(decode_tokens_per_s=20.0, prefill_tokens_per_s=1e6)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    body = _stream_body(400).replace(b'"stream": true', b'"stream": false')
    with socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
            + TENANT_KEY.encode()
            + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
            + body
        )
        until(lambda: sim.app.stats.in_flight == 1, "one request at the backend", timeout=30.0)
    until(lambda: sim.app.stats.in_flight == 0, "the upstream request dropped", timeout=30.0)
    assert sim.app.stats.cancelled == 1


def test_a_client_that_leaves_with_a_request_pipelined_behind_a_stream_cancels_it(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # uvicorn keeps only a connection's newest request as its current cycle, so a review
    # suspected that a disconnect would leave the stream being answered running on: the
    # stream's backend work must stop as when nothing is queued behind it.
    sim = start_sim(decode_tokens_per_s=20.0, prefill_tokens_per_s=1e6)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    _leave_mid_stream(sim, gateway, 2)


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_a_client_that_leaves_with_a_request_pipelined_behind_a_whole_answer_cancels_it(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], reset: bool
) -> None:
    # uvicorn's `connection_lost` marks and wakes only the connection's newest cycle (the
    # request queued behind), so the request being answered, which writes nothing until
    # its whole answer is in, was never told: its backend generated all of it (20 s here)
    # for a client long gone.
    sim = start_sim(decode_tokens_per_s=20.0, prefill_tokens_per_s=1e6)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    body = _stream_body(400).replace(b'"stream": true', b'"stream": false')
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
        + TENANT_KEY.encode()
        + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
        + body
    )
    with socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10) as sock:
        sock.sendall(request * 2)  # the second waits its turn behind the first
        until(lambda: sim.app.stats.in_flight == 1, "one request at the backend", timeout=30.0)
        if reset:  # SO_LINGER 0: the close is a reset, not a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    until(lambda: sim.app.stats.in_flight == 0, "the upstream request dropped", timeout=30.0)
    assert sim.app.stats.cancelled == 1
    assert sim.app.stats.completed == 0
    assert gateway.app.registry.backends["gpu"].inflight == 0
