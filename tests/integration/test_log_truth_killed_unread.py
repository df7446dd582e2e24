"""A whole answer still in the gateway's own write buffer is not an answer the client got.

A client that reads slower than it is answered (here: none of a 6 MB answer, with a small
receive buffer) leaves most of the answer in the gateway's write buffer for the
connection, past what the kernel's socket buffers take. Before, the completion record
saying 200 and committing to the whole answer was written as soon as the answer was
handed to that buffer: `owngate serve` killed (SIGKILL) then took the rest of the answer
with it, and after the restart the signed log said the client got an answer it got a
third of. Now the completion waits until the kernel took the whole answer (a client that
reads it gets it then even if the gateway dies): killed before, the dispatch stays open
(what `audit verify` reports for a request the gateway did not see end), and no record
claims an answer the client never got. A connection lost (reset) before is a client that
left: 499, committing to no answer (before: 200, committing to all of it).
"""

from __future__ import annotations

import select
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.provenance import write_signing_key
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    Gateway,
    Sim,
    backend,
    logged_gateway,
    logged_private_gateway,
)
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.provenance import completion_record, records, run_audit_output
from tests.helpers.waiting import until

ORIGIN = "test.owngate/log/killed-unread"
KEY = "og-killed-unread-key-0123456789abcd"
TOKENS = 1_200_000  # the simulator's answer: about 6 MB of JSON


def _ask(port: int, tokens: int, key: str = KEY) -> socket.socket:
    """A connection that asked for a whole answer of `tokens` tokens and reads nothing yet."""
    body = orjson.dumps(
        {"model": "m", "max_tokens": tokens, "messages": [{"role": "user", "content": "x"}]}
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little
    client.connect(("127.0.0.1", port))
    client.sendall(head.encode() + body)
    return client


def _read_all(client: socket.socket) -> bytes:
    client.settimeout(30)
    got = b""
    while chunk := client.recv(1 << 16):
        got += chunk
    return got


def test_a_gateway_killed_with_an_answer_in_its_write_buffer_records_no_answer(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True, n_ctx=2 * TOKENS)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    port = free_port()
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 10,
        },
    }
    gateway = GatewayProcess(config, tmp_path).start()
    slow = None
    try:
        slow = _ask(port, TOKENS)
        # The answer was handed to the connection: its first bytes reached the client.
        assert select.select([slow], [], [], 60)[0], "no answer began"
        # A later request's completion is durable: before, so was the first one's,
        # queued before it (the log writes its queue in order).
        headers = {"authorization": f"Bearer {KEY}"}
        ask = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "y"}]}
        later = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=ask, headers=headers, timeout=30
        )
        assert later.status_code == 200, later.text
        later_id = later.headers["x-request-id"]

        def later_completed() -> bool:
            return any(
                r["type"] == "completion" and r["request_id"] == later_id
                for r in records(tmp_path / "log")
            )

        until(later_completed, "the later request's completion in a checkpoint", timeout=30)
        gateway.stop(signal.SIGKILL)
        got = _read_all(slow)
    finally:
        if slow is not None:
            slow.close()
        gateway.stop(signal.SIGKILL)
    head, _, body = got.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        .split(b":")[1]
        .strip()
    )
    assert len(body) < length, "the kill left none of the answer unsent: nothing tested"
    slow_id = next(
        line.split(b":")[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id")
    )
    gateway.start()  # recovers the log
    assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
    code, printed = run_audit_output(["verify", str(tmp_path / "log"), "--key", vkey])
    assert code == 0, printed
    said = [r for r in records(tmp_path / "log") if r["request_id"] == slow_id]
    assert [r["type"] for r in said][:1] == ["dispatch"], said
    claims = [r for r in said if r["type"] == "completion"]
    assert not claims, (
        f"the client got {len(body)} of {length} bytes; the log says {claims[0]['status']} "
        f"with a commitment to {claims[0]['response_commitment']}"
    )


def test_a_connection_lost_with_an_answer_in_the_write_buffer_is_a_client_that_left(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True, n_ctx=2 * TOKENS)
    gateway = logged_private_gateway(start_gateway, tmp_path, sim.url, ORIGIN)
    slow = _ask(gateway.server.port, TOKENS, gateway.key)
    try:
        assert select.select([slow], [], [], 60)[0], "no answer began"
        # Held until taken: the answer went to the connection, most of it is in its
        # write buffer in the gateway (the kernel holds at most a few MB).
        until(lambda: gateway.app.answers.held > 0, "the answer held", timeout=30)
        head = slow.recv(4096)
        request_id = next(
            line.split(b":")[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-request-id")
        )
    finally:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        slow.close()  # a reset: what the gateway still buffers never reaches the client
    until(lambda: gateway.app.answers.held == 0, "the answer given back", timeout=30)
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["response_commitment"]) == (499, None), record


def _head(client: socket.socket) -> tuple[bytes, str]:
    """The head of the answer `client` is sent first, and its request id."""
    head = b""
    while b"\r\n\r\n" not in head:
        head += client.recv(4096)
    request_id = next(
        line.split(b":")[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id")
    )
    return head, request_id


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "keep-alive"])
def test_a_connection_lost_while_a_later_request_is_answered_is_a_client_that_left(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    pipelined: bool,
) -> None:
    """The connection's next request (pipelined, or sent on it while the first answer
    waits to be taken) is the one being answered when the connection is lost: the loss
    is the first one's too. Before, only the newest request learnt of it, and the first
    one, its answer still in the write buffer, was recorded 200 committing to all of it."""
    sim = start_sim("vllm", models=("m",), zero_latency=True, n_ctx=2 * TOKENS)
    gateway = logged_private_gateway(start_gateway, tmp_path, sim.url, ORIGIN)
    body = orjson.dumps(
        {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "y"}]}
    )
    later = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: Bearer {gateway.key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    slow = _ask(gateway.server.port, TOKENS, gateway.key)
    try:
        if pipelined:
            slow.sendall(later)
        assert select.select([slow], [], [], 60)[0], "no answer began"
        until(lambda: gateway.app.answers.held > 0, "the first answer held", timeout=30)
        first = gateway.app.answers.held
        _, request_id = _head(slow)
        if not pipelined:
            slow.sendall(later)
        # The later request answered too (its answer held behind the first one's).
        until(lambda: gateway.app.answers.held > first, "the later answer held", timeout=30)
    finally:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        slow.close()  # a reset: what the gateway still buffers never reaches the client
    until(lambda: gateway.app.answers.held == 0, "the answers given back", timeout=30)
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["response_commitment"]) == (499, None), record


def test_an_answer_waiting_to_be_taken_holds_no_backend_slot(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """A whole answer's request waits for its client to take the answer (its completion
    record waits for it), but its backend is done: it is not in flight there. Before, it
    counted until then, so one tenant's clients that read slowly (two, here, on a backend
    of one slot) made the backend saturated for every tenant: a request of anyone's waited
    in the queue until it gave up (503)."""
    sim = start_sim("vllm", models=("m",), zero_latency=True, n_ctx=2 * TOKENS)
    queue = {"threshold": 0.01, "max_wait_s": 1.0}
    one_slot = backend("gpu", sim.url, "m", capacity={"max_concurrency": 1})
    gateway = logged_gateway(
        start_gateway, tmp_path, [one_slot], ORIGIN, routing={"default": {"queue": queue}}
    )
    state = gateway.app.registry.backends["gpu"]
    slow: list[socket.socket] = []

    def held_more(than: int) -> Callable[[], bool]:
        return lambda: gateway.app.answers.held > than

    try:
        for _ in range(2):
            held = gateway.app.answers.held
            slow.append(_ask(gateway.server.port, TOKENS, gateway.key))
            assert select.select([slow[-1]], [], [], 60)[0], "no answer began"
            until(held_more(held), "the answer held", timeout=30)
        assert not [r for r in records(tmp_path / "log") if r["type"] == "completion"]
        until(lambda: state.inflight == 0, "the backend done with both", timeout=30)
        ask = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "y"}]}
        other = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=ask,
            headers={"authorization": f"Bearer {gateway.key}"},
            timeout=30,
        )
        assert other.status_code == 200, other.text
    finally:
        for client in slow:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
    until(lambda: gateway.app.answers.held == 0, "the answers given back", timeout=30)
