"""The whole answers the sidecar holds at once, across connections
(`--max-held-answer-bytes`): each whole answer is held, from its declared length (else
its bytes as they arrive), until its client has taken it; one that would take the
sidecar past the budget is dropped, its client refused 429 `rate_limit_exceeded` with
`retry-after: 1`, nothing countersigned for it; every way a request ends gives its
bytes back. The first answer is held open by an event the test sets, never by a sleep;
what the sidecar holds is read from its budget counter in-process."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.attest import AttestSettings, AttestThread
from gateway.config.schema import ListenSettings
from gateway.provenance import write_signing_key
from tests.helpers.raw_backend import Post, RawBackend
from tests.helpers.raw_socket import WAIT_S, connect, exchange, parse, read_to_end

MAX_BODY = 4096  # the largest answer relayed
ANSWER = 4000  # each answer fits the per-answer limit ...
BUDGET = MAX_BODY + MAX_BODY // 2  # ... and the budget, but two of them do not
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "%s"}]}'


def _post(word: bytes) -> bytes:
    body = CHAT % word
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


class Backend:
    """Answers ANSWER bytes of JSON: at once, or (`hold` in the request) its first part,
    then the rest once `release` is set; `cut` in the request: the first part, then the
    connection closes. `chunked`: no content-length, chunked framing."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.release = threading.Event()
        self.raw = RawBackend(self._answer).start()

    async def _answer(self, writer: asyncio.StreamWriter, post: Post) -> bool:
        body = b'"' + b"x" * (ANSWER - 2) + b'"'
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        first, rest = body[: ANSWER - 10], body[ANSWER - 10 :]
        if self.chunked:
            head += b"transfer-encoding: chunked\r\n\r\n"
            rest = b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest)
            first = b"%x\r\n%s\r\n" % (len(first), first)
        else:
            head += b"content-length: %d\r\n\r\n" % ANSWER
        if b"hold" not in post.body and b"cut" not in post.body:
            writer.write(head + first + rest)
            await writer.drain()
            return False
        writer.write(head + first)
        await writer.drain()
        if b"cut" in post.body:
            return False  # closed mid-answer
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.release.wait, WAIT_S)
        writer.write(rest)
        await writer.drain()
        return False


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[bool], tuple[Backend, AttestThread]]]:
    started: list[tuple[Backend, AttestThread]] = []

    def start(chunked: bool) -> tuple[Backend, AttestThread]:
        backend = Backend(chunked)
        key = tmp_path / "sidecar.key"
        write_signing_key(key, "sidecar")
        settings = AttestSettings(
            backend=backend.raw.url,
            key_file=key,
            log_dir=tmp_path / "log",
            max_body=MAX_BODY,
            max_held_answer=BUDGET,
        )
        sidecar = AttestThread(settings, listen=ListenSettings()).start()
        started.append((backend, sidecar))
        return backend, sidecar

    yield start
    for backend, sidecar in started:
        backend.release.set()
        sidecar.stop()
        backend.raw.stop()


def _wait_held(sidecar: AttestThread, expected: int) -> None:
    """The sidecar's loop reads and closes asynchronously: wait for it, bounded."""
    deadline = time.monotonic() + WAIT_S
    while sidecar.relay.answers.held != expected and time.monotonic() < deadline:
        select.select([], [], [], 0.01)
    assert sidecar.relay.answers.held == expected


def _countersigned(sidecar: AttestThread) -> int:
    return sidecar.relay.notary._next  # the next statement's counter


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_whole_answers_held_at_once_are_bounded_across_connections(
    start: Callable[[bool], tuple[Backend, AttestThread]], chunked: bool
) -> None:
    backend, sidecar = start(chunked)
    signed = _countersigned(sidecar)
    first = connect(sidecar)
    try:
        first.sendall(_post(b"hold"))
        # held from its declared length, or (chunked) from the bytes that came
        _wait_held(sidecar, ANSWER if not chunked else ANSWER - 10)
        raw = exchange(sidecar, _post(b"now"))  # fits the per-answer limit, not the budget
        status, headers, body = parse(raw)
        assert status == 429, raw[:300]
        assert headers["retry-after"] == "1"
        assert "x-owngate-attest" not in headers
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "rate_limit_exceeded"
        assert "--max-held-answer-bytes" in error["message"]
        assert _countersigned(sidecar) == signed  # nothing signed for the refused answer
        backend.release.set()
        status, headers, body = parse(read_to_end(first))
        assert status == 200
        assert len(body) == ANSWER
        assert headers["x-owngate-attest"]
        assert _countersigned(sidecar) == signed + 1
    finally:
        first.close()
    _wait_held(sidecar, 0)
    # ... so the next one fits again
    assert parse(exchange(sidecar, _post(b"now")))[0] == 200
    _wait_held(sidecar, 0)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_answers_cut_off_or_left_give_their_bytes_back(
    start: Callable[[bool], tuple[Backend, AttestThread]], chunked: bool
) -> None:
    _, sidecar = start(chunked)
    signed = _countersigned(sidecar)
    # The backend breaks off mid-answer: 502, nothing signed, nothing held.
    raw = exchange(sidecar, _post(b"cut"))
    status, headers, _ = parse(raw)
    assert status == 502, raw[:300]
    assert "x-owngate-attest" not in headers
    _wait_held(sidecar, 0)
    # The client leaves while its answer is held: given back, nothing signed.
    with socket.create_connection((sidecar.host, sidecar.port), timeout=WAIT_S) as gone:
        gone.sendall(_post(b"hold"))
        _wait_held(sidecar, ANSWER if not chunked else ANSWER - 10)
    _wait_held(sidecar, 0)
    assert _countersigned(sidecar) == signed
