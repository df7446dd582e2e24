"""The sidecar's request bodies held at once, across connections (`--max-held-body-bytes`,
gateway/body_budget.py): many connections each declaring a large body and sending it
slowly hold what they declared, and no more than the budget in all; one past it is
refused 429 `rate_limit_exceeded` with `retry-after: 1` before its body is read, and every
way a request ends (answered, client gone, backend down) gives its bytes back. What the
sidecar holds is read from its budget counter in-process, never timed."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.attest import AttestSettings, AttestThread
from gateway.config.schema import ListenSettings
from gateway.provenance import write_signing_key
from tests.helpers.gateways import Sim
from tests.helpers.raw_socket import WAIT_S, connect, exchange, parse, read_to_end

MAX_BODY = 4096
SLOTS = 4  # bodies of MAX_BODY the budget holds at once
CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


def _head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % length
    )


def _padded() -> bytes:
    """A chat request of exactly MAX_BODY bytes (JSON whitespace after the object)."""
    return CHAT + b" " * (MAX_BODY - len(CHAT))


@pytest.fixture
def start_sidecar(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> Iterator[Callable[..., AttestThread]]:
    started: list[AttestThread] = []

    def start(backend: str | None = None) -> AttestThread:
        if backend is None:
            backend = start_sim("vllm", models=("sim-model",), zero_latency=True).url
        key = tmp_path / f"sidecar{len(started)}.key"
        write_signing_key(key, "sidecar")
        settings = AttestSettings(
            backend=backend,
            key_file=key,
            log_dir=tmp_path / f"log{len(started)}",
            max_body=MAX_BODY,
            max_held_body=SLOTS * MAX_BODY,
        )
        listen = ListenSettings(header_timeout_s=30, body_timeout_s=30)
        sidecar = AttestThread(settings, listen=listen).start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


def _held(sidecar: AttestThread) -> int:
    return sidecar.listener.bodies.held


def _wait_held(sidecar: AttestThread, expected: int) -> None:
    """The sidecar's loop sees reads and closes asynchronously: wait, bounded."""
    deadline = time.monotonic() + WAIT_S
    while _held(sidecar) != expected and time.monotonic() < deadline:
        select.select([], [], [], 0.01)
    assert _held(sidecar) == expected


def test_slow_bodies_on_many_connections_hold_at_most_the_budget(
    start_sidecar: Callable[..., AttestThread],
) -> None:
    sidecar = start_sidecar()
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOTS):  # each declares MAX_BODY and sends a little of it
            sock = connect(sidecar)
            sock.sendall(_head(MAX_BODY) + b"{")
            slow.append(sock)
        # Measured: the declared lengths are held before the bodies arrive.
        _wait_held(sidecar, SLOTS * MAX_BODY)
        # One more declared body: refused before it is read, as a rate limit.
        raw = exchange(sidecar, _head(MAX_BODY))
        status, headers, body = parse(raw)
        assert status == 429, raw[:300]
        assert headers["retry-after"] == "1"
        assert headers["connection"] == "close"
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "rate_limit_exceeded"
        assert "--max-held-body-bytes" in error["message"]
        assert _held(sidecar) == SLOTS * MAX_BODY  # the refused body took nothing
        # A chunked body counts as it arrives: refused once it passes the budget.
        chunked = b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        raw = exchange(sidecar, chunked + b"1\r\n{\r\n")
        assert parse(raw)[0] == 429
        # Completed: answered, and its bytes given back.
        first = slow.pop(0)
        first.sendall(_padded()[1:])
        assert parse(read_to_end(first))[0] == 200
        first.close()
        _wait_held(sidecar, (SLOTS - 1) * MAX_BODY)
        # ... so the retried request fits now.
        assert parse(exchange(sidecar, _head(MAX_BODY) + _padded()))[0] == 200
        _wait_held(sidecar, (SLOTS - 1) * MAX_BODY)
        # Clients gone mid-body: their bytes are given back too.
        for sock in slow:
            sock.close()
        slow.clear()
        _wait_held(sidecar, 0)
    finally:
        for sock in slow:
            sock.close()


def test_a_backend_failure_gives_the_body_back(
    start_sidecar: Callable[..., AttestThread],
) -> None:
    # A port bound, never listening, held for the whole test: the backend is down. Released
    # at once (as it was), the sidecar's own bind(0) or another server's could take it.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        sidecar = start_sidecar(backend=f"http://127.0.0.1:{port}")
        for _ in range(SLOTS + 1):  # more than the budget holds, one after another
            raw = exchange(sidecar, _head(MAX_BODY) + _padded())
            assert parse(raw)[0] == 503, raw[:300]
            _wait_held(sidecar, 0)
