"""The request bodies a gateway process holds at once are bounded across connections
(`limits.max_held_body_bytes`, gateway/body_budget.py): a client holding a large body
open makes others wait (429, `retry-after`), never grows the process past the budget."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway.api.app import GatewayApp
from gateway.api.body import held_bound, scan_body
from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Sim, backend, gateway_config
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.raw_socket import WAIT_S, connect, parse
from tests.helpers.waiting import until

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


def test_one_tenant_s_bodies_leave_the_other_tenants_room(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    """A body of tiny values holds what parsing it may take until its request ends, the
    whole answer included: one tenant's request that a backend answers slowly could hold
    the process's whole budget, and every other tenant got 429 meanwhile. A tenant's
    requests now hold at most its part (half the budget, by default): past it, 413 (this
    one body could never fit), and the other tenant is served."""
    released = threading.Event()

    async def slow_first(writer: asyncio.StreamWriter, post: Post) -> bool:
        if b'"x":[{}' in post.body:  # acme's: answered once the test is over
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 60)
        body = b'{"object":"chat.completion","choices":[]}'
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(body) + body)
        await writer.drain()
        return False

    raw = start_raw(slow_first)
    budget = 256 * 1024
    tiny, other_body = _tiny_values(1264), _chat(1000)
    # acme's body fits the whole budget, and leaves no room for beta's.
    held = held_bound(tiny, scan_body(tiny))
    assert budget - held_bound(other_body, scan_body(other_body)) < held <= budget
    tenants = [
        {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
        {"id": "beta", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]},
    ]
    limits = {"max_body_bytes": 64 * 1024, "max_held_body_bytes": budget}
    config = gateway_config([backend("gpu", raw.url, "sim-model")], limits=limits, tenants=tenants)
    app = create_app(config, environ={})
    url_of = "http://{}:{}/v1/chat/completions"
    with ServerThread(app, listen=config.listen) as server:
        url = url_of.format(server.host, server.port)
        first: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: first.append(
                httpx.post(
                    url,
                    content=tiny,
                    headers={"authorization": f"Bearer {TENANT_KEY}"},
                    timeout=60,
                )
            )
        )
        sender.start()
        try:
            until(lambda: bool(raw.posts or first), "acme's request served or refused")
            other = httpx.post(
                url,
                content=other_body,
                headers={"authorization": f"Bearer {OTHER_KEY}"},
                timeout=WAIT_S,
            )
            assert other.status_code == 200, other.text
        finally:
            released.set()
            sender.join(timeout=60)
        assert first[0].status_code == 413, first[0].text
        assert "max_held_body_bytes_per_tenant" in first[0].json()["error"]["message"]
