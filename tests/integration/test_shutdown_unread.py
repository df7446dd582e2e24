"""`owngate serve` shut down by force while a keep-alive client reads nothing: its first,
large answer fills the connection's buffers, so the answer to its next (pipelined)
request waits to be sent, its head not yet out. Before, the completion record of that
second request committed to the 200 answer it never sent, and the process hung after
"Finished server process": the loop's end waited on the client to read.

The gateway runs with a hook (`HOOK`, its `sitecustomize`) that only watches: it says
when the first request waits for its client to take its answer and when the second's
receipt is ready with the client's buffers full, the send that follows then blocking
in the same turn of the loop. The shutdown is forced only after both, so the cut lands
where this test means it to, never while the receipt is still being signed.

The second test asks its second answer with `Expect: 100-continue`: the `100 Continue`
is then the cycle's first write, so the answer's head goes out on its own, not with its
body (gateway/coalescing.py). Its hook (`HEAD_HOOK`) sets the connection's write-buffer
high-water mark just above what the first answer left unread, as a first answer of that
size would leave it: the head alone then fills the buffer, and the body's send waits for
room with the head already handed to the connection. Before, a forced shutdown cutting
that wait left the record committed to the whole answer, body included, which no client
got.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from tests.helpers.hooked_gateway import (
    big_or_small,
    check_first_answered_second_cut,
    start_hooked,
)
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until

KEY = "og-unread-test-key-0123456789abcdef"
BIG = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * (8 << 20)}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
HOOK = """
import sys

from gateway.api import exchange, openai

_receipt_headers = exchange.receipt_headers
_answer_taken = openai._answer_taken


def _say(what):
    print("unread-hook: " + what, file=sys.stderr, flush=True)


async def receipt_headers(ex):
    headers = await _receipt_headers(ex)
    if ex.writer is not None and ex.writer.write_paused:
        _say("a whole answer's send waits for the client")
    return headers


async def answer_taken(ex, answer):
    if ex.writer is not None and ex.writer.write_paused:
        _say("an answer waits to be taken")
    await _answer_taken(ex, answer)


_taken = exchange._taken


async def taken(ex):  # the wait for the kernel to take the answer, before its record
    if ex.writer is not None and ex.writer.write_paused:
        _say("an answer waits to be taken")
    await _taken(ex)


exchange.receipt_headers = receipt_headers
openai._answer_taken = answer_taken
exchange._taken = taken
"""
SMALL = json.dumps(
    {
        "id": "d",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def test_a_forced_shutdown_with_a_client_that_reads_nothing_ends_and_says_what_went_out(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    raw = start_raw(big_or_small(BIG, SMALL))
    gateway = start_hooked(raw.url, tmp_path, HOOK, KEY)
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def req(text: str) -> bytes:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        return (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
        ) + body

    try:
        sock.sendall(req("first"))
        until(lambda: len(raw.posts) == 1, "first asked", timeout=30)
        sock.sendall(req("second"))
        until(lambda: len(raw.posts) == 2, "second asked", timeout=30)
        # The first request's task waits for its client to take its answer, and the
        # second's send for room: a forced shutdown now cuts both there.
        taken, waits = "an answer waits to be taken", "a whole answer's send waits"
        until(lambda: taken in gateway.stderr(), taken, timeout=30, detail=gateway.output)
        until(lambda: waits in gateway.stderr(), waits, timeout=30, detail=gateway.output)
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        until(lambda: "draining" in gateway.output(), "the drain began", timeout=30)
        gateway.proc.send_signal(signal.SIGINT)
        until(lambda: "Shutting down" in gateway.output(), "uvicorn's shutdown", timeout=30)
        gateway.proc.send_signal(signal.SIGINT)
        code = gateway.wait(30)  # the forced end is bounded (5 s twice), not the client's
        # What the kernel still holds of the first answer comes after the exit; its start
        # is enough (all of it, ~4 MB through a 4 KiB window, took 100 s; the second answer's
        # head could only follow its 8 MiB, most of which the dropped connection lost).
        got = bytearray()
        sock.settimeout(10)
        for _ in range(64):
            try:
                piece = sock.recv(4096)
            except (TimeoutError, ConnectionResetError):
                break
            got.extend(piece)
            if not piece or len(got) >= 4096:
                break
    finally:
        sock.close()
        gateway.stop()
    assert code == 0, gateway.output()
    assert got.startswith(b"HTTP/1.1 200 OK"), bytes(got[:200])
    # The first request ends as answered, quietly: its wait for the client, cut, is no
    # "Exception in ASGI application" with a CancelledError's traceback.
    printed = gateway.stdout() + gateway.stderr()
    assert "Traceback" not in printed and "Exception in ASGI" not in printed, printed[-3000:]
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line.get("level") in ("error", "critical")], lines
    # The gateway cut it (its 503), never the 200 it did not send nor a client that left.
    # The first answer's tail was never taken, and the forced end dropped the connection
    # holding it: a cut (503) committing to none of it. Before, its record said 200 and
    # committed to the whole 8 MiB answer, most of which the drop threw away.
    check_first_answered_second_cut(tmp_path, first_status=503)


HEAD_HOOK = """
import sys

from gateway import coalescing
from gateway.api import passthrough

_write = coalescing.HeadCoalescer.write
_send_whole = passthrough.send_whole


def _say(what):
    print("head-hook: " + what, file=sys.stderr, flush=True)


def write(self, data):
    transport = self._transport
    if not self._started:  # an answer's first write: the first answer fits unpaused
        transport.set_write_buffer_limits(high=64 << 20)
    elif self._held is None and data.startswith(b"HTTP/1.1 200"):
        # A head written on its own (after `100 Continue`): it lands past the mark.
        transport.set_write_buffer_limits(high=transport.get_write_buffer_size() + 1, low=0)
    _write(self, data)


async def send_whole(send, ex, *args):
    async def watched(message):
        if message["type"] == "http.response.body" and ex.writer.write_paused:
            _say("a whole answer's body waits for room after its head")
        await send(message)

    await _send_whole(watched, ex, *args)


coalescing.HeadCoalescer.write = write
passthrough.send_whole = send_whole
"""


def test_a_forced_shutdown_cutting_a_body_whose_head_went_alone_records_no_answer(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    raw = start_raw(big_or_small(BIG, SMALL))
    gateway = start_hooked(raw.url, tmp_path, HEAD_HOOK, KEY)
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def req(text: str, extra: bytes = b"") -> bytes:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n" % len(body)
        )
        return head + extra + b"\r\n" + body

    try:
        sock.sendall(req("first"))
        until(lambda: len(raw.posts) == 1, "first asked", timeout=30)
        sock.sendall(req("second", b"expect: 100-continue\r\n"))
        until(lambda: len(raw.posts) == 2, "second asked", timeout=30)
        waits = "a whole answer's body waits for room after its head"
        until(lambda: waits in gateway.stderr(), waits, timeout=30, detail=gateway.output)
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        until(lambda: "draining" in gateway.output(), "the drain began", timeout=30)
        gateway.proc.send_signal(signal.SIGINT)
        until(lambda: "Shutting down" in gateway.output(), "uvicorn's shutdown", timeout=30)
        gateway.proc.send_signal(signal.SIGINT)
        code = gateway.wait(30)  # the forced end is bounded (5 s twice)
    finally:
        sock.close()
        gateway.stop()
    assert code == 0, gateway.output()
    printed = gateway.stdout() + gateway.stderr()
    assert "Traceback" not in printed and "Exception in ASGI" not in printed, printed[-3000:]
    # Its head went to the connection, none of its body did (the dropped connection
    # lost both): the record commits to no answer, not to the body the client never got.
    # The first answer's tail was never taken, and the forced end dropped the connection
    # holding it: a cut (503) committing to none of it. Before, its record said 200 and
    # committed to the whole 8 MiB answer, most of which the drop threw away.
    check_first_answered_second_cut(tmp_path, first_status=503)
