"""The request bodies a gateway process holds at once are bounded across connections
(`limits.max_held_body_bytes`, gateway/body_budget.py): a client holding a large body
open makes others wait (429, `retry-after`), never grows the process past the budget."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway.api.app import GatewayApp
from gateway.api.body import held_bound, scan_body
from gateway.app import create_app
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.raw_socket import WAIT_S, connect, parse

BUDGET = 128 * 1024  # a 40,000-byte chat request holds at most 121,536 (`held_bound`)


def _chat(size: int) -> bytes:
    """A valid chat request of exactly `size` bytes: a short prompt, then the white space
    JSON allows after a value (a long prompt would pass the simulator's context)."""
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return json.dumps(body).encode().ljust(size)


def _head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + TENANT_KEY.encode() + b"\r\n"
        b"content-length: %d\r\n\r\n" % length
    )


@pytest.fixture
def gateway(start_sim: Callable[..., Sim]) -> Iterator[tuple[ServerThread, GatewayApp]]:
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    limits = {"max_body_bytes": BUDGET, "max_held_body_bytes": BUDGET}
    config = gateway_config([backend("gpu", sim.url, "sim-model")], limits=limits)
    app = create_app(config, environ={})
    server = ServerThread(app, listen=config.listen).start()
    yield server, app
    server.stop()


def _answer_status(sock: socket.socket) -> int:
    """The status of one answer on a kept-alive connection (read to its content-length)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, "closed before an answer"
        raw += chunk
    status, headers, body = parse(raw)
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "closed inside an answer"
        body += chunk
    return status


def _wait_held(app: GatewayApp, size: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while app.bodies.held != size:
        assert time.monotonic() < deadline, f"held {app.bodies.held}, waited for {size}"
        time.sleep(0.01)


def test_a_body_held_open_makes_others_wait_within_the_budget(
    gateway: tuple[ServerThread, GatewayApp],
) -> None:
    server, app = gateway
    slow = _chat(40_000)
    url = f"http://{server.host}:{server.port}/v1/chat/completions"
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    with connect(server) as holder:
        holder.sendall(_head(len(slow)) + slow[:1000])  # declared, then held back
        _wait_held(app, len(slow))
        refused = httpx.post(url, content=_chat(100_000), headers=headers, timeout=WAIT_S)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["retry-after"] == "1"
        assert app.bodies.held == len(slow)  # the refusal took nothing
        holder.sendall(slow[1000:])
        assert _answer_status(holder) == 200
    _wait_held(app, 0)  # given back when its request ended
    served = httpx.post(url, content=_chat(30_000), headers=headers, timeout=WAIT_S)
    assert served.status_code == 200, served.text
    _wait_held(app, 0)


def _tiny_values(size: int) -> bytes:
    """A chat request of `size` bytes whose `logit_bias`-like padding is empty objects:
    bytes that fit the budget, parsed objects that would not."""
    head = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"x":['
    count = (size - len(head) - 2) // 3
    return (head + b",".join([b"{}"] * count) + b"]}").ljust(size)


def test_a_body_of_tiny_values_is_charged_what_parsing_it_holds(
    gateway: tuple[ServerThread, GatewayApp],
) -> None:
    server, app = gateway
    url = f"http://{server.host}:{server.port}/v1/chat/completions"
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    # Its bytes fit the whole budget; what it parses into could never: 413, unparsed.
    alone = httpx.post(url, content=_tiny_values(30_000), headers=headers, timeout=WAIT_S)
    assert alone.status_code == 413, alone.text
    assert alone.json()["error"]["code"] == "request_too_large"
    _wait_held(app, 0)
    slow = _chat(40_000)
    with connect(server) as holder:
        holder.sendall(_head(len(slow)) + slow[:1000])
        _wait_held(app, len(slow))
        # 40,000 + 600 bytes fit; 40,000 + what 600 bytes of `{}` parse into do not.
        small = _tiny_values(600)
        assert (
            held_bound(small, scan_body(small)) + len(slow)
            > BUDGET
            >= held_bound(small, scan_body(small))
        )
        refused = httpx.post(url, content=small, headers=headers, timeout=WAIT_S)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert app.bodies.held == len(slow)
        holder.sendall(slow[1000:])
        assert _answer_status(holder) == 200
    _wait_held(app, 0)
    served = httpx.post(url, content=small, headers=headers, timeout=WAIT_S)
    assert served.status_code == 200, served.text  # alone, it fits
    _wait_held(app, 0)
