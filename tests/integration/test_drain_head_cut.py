"""`owngate serve` draining (SIGTERM, no forced shutdown) while a keep-alive client reads
nothing: its drain deadline cuts a whole answer whose head went out alone (the request
asked `Expect: 100-continue`, so `100 Continue` was the cycle's first write) and whose
body's send waits for room. The record says 503 and commits to none of the answer (the
flakecut fix, `send_whole`); the client must see that cut: its connection closed.

Before, the cut (`TenantSurface._cut`) ended that response with an empty last body,
short of the content-length its head declared: once the client read, uvicorn raised
"Response content shorter than Content-Length" and logged "Exception in ASGI
application" with its traceback.

The gateway runs with a hook (`HOOK`, its `sitecustomize`), as in
tests/integration/test_shutdown_unread.py: it shrinks the connection's kernel send
buffer, sets the write-buffer high-water mark just above what the first answer left
unsent when the second's head is written alone, so the head fills the buffer and the
body's send waits with the head handed to the connection, and says when that wait began
and when the drain's cut reached the request. The client reads only after that.

A client that never reads: the closed connection still holds what it buffers (the first
answer's tail, the second's head) until the client takes it; `listen.write_timeout_s`
(`LimitedHttpProtocol._write_late`) drops it, so uvicorn's shutdown, which waits for
every connection, ends then, not at its graceful timeout's forced end.
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
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import Answer, RawBackend
from tests.helpers.waiting import until

KEY = "og-drain-head-test-key-0123456789abcdef"


def _answer(content: str) -> bytes:
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


# Far more than a 4 KiB kernel send buffer and the client's 64 KiB receive buffer hold.
BIG, SMALL = _answer("x" * (1 << 20)), _answer("ok")
HOOK = """
import socket
import sys

from gateway import coalescing
from gateway.api import openai, passthrough

_write = coalescing.HeadCoalescer.write
_send_whole = passthrough.send_whole
_cut = openai.TenantSurface._cut


def _say(what):
    print("drain-hook: " + what, file=sys.stderr, flush=True)


def write(self, data):
    transport = self._transport
    if not self._started:  # an answer's first write: the first answer fits unpaused
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
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


async def cut(self, ex, send, *, wait):
    _say("the drain's cut reached the request")
    await _cut(self, ex, send, wait=wait)


coalescing.HeadCoalescer.write = write
passthrough.send_whole = send_whole
openai.TenantSurface._cut = cut
"""


# For a client that never reads: the write timeout (armed when the head filled the
# buffers, before the cut) is let reach the connection only once the cut has closed it,
# re-armed as `pause_writing` arms it; it says when it did. Each answer's release of its
# share of the answer budget says what the process still holds.
UNREAD_HOOK = (
    HOOK
    + """
from gateway import listener

_write_late = listener.LimitedHttpProtocol._write_late
_answer_taken = openai._answer_taken
_cut_seen = []


async def cut_seen(self, ex, send, *, wait):
    _cut_seen.append(True)
    await cut(self, ex, send, wait=wait)


def write_late(self):
    if not _cut_seen:
        self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_late)
        return
    _say("the write timeout reached the connection after the cut")
    _write_late(self)


async def answer_taken(exchange, answer):
    try:
        await _answer_taken(exchange, answer)
    finally:
        _say("an answer was released: whole answers held %d" % answer._budget.held)


openai.TenantSurface._cut = cut_seen
listener.LimitedHttpProtocol._write_late = write_late
openai._answer_taken = answer_taken
"""
)


def _read_all(sock: socket.socket) -> tuple[bytes, bool]:
    """What the client reads until its connection ends (bounded), and whether it ended."""
    got = bytearray()
    sock.settimeout(30)
    for _ in range(4096):  # 1 MiB and a head, 64 KiB a read at least
        try:
            piece = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(got), True
        except TimeoutError:
            return bytes(got), False
        if not piece:
            return bytes(got), True
        got.extend(piece)
    return bytes(got), False


def _connect(gateway: GatewayProcess) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.connect(("127.0.0.1", gateway.port))
    return sock


def _req(text: str, extra: bytes = b"") -> bytes:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n" % len(body)
    )
    return head + extra + b"\r\n" + body


def _cut_the_second(sock: socket.socket, raw: RawBackend, gateway: GatewayProcess) -> None:
    """Ask twice on `sock`, reading nothing, the second's head going out alone and its
    body waiting for room; then SIGTERM, and wait for the drain's cut of the second."""
    sock.sendall(_req("first"))
    until(lambda: len(raw.posts) == 1, "first asked", timeout=30)
    sock.sendall(_req("second", b"expect: 100-continue\r\n"))
    until(lambda: len(raw.posts) == 2, "second asked", timeout=30)
    waits = "a whole answer's body waits for room after its head"
    until(lambda: waits in gateway.stderr(), waits, timeout=30, detail=gateway.output)
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGTERM)  # a drain only: its deadline cuts
    cut = "the drain's cut reached the request"
    until(lambda: cut in gateway.stderr(), cut, timeout=30, detail=gateway.output)


def test_a_drain_cut_of_a_body_whose_head_went_alone_closes_the_connection_quietly(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    raw = start_raw(big_or_small(BIG, SMALL))
    gateway = start_hooked(raw.url, tmp_path, HOOK, KEY, write_timeout_s=600, drain_timeout_s=1)
    sock = _connect(gateway)
    try:
        _cut_the_second(sock, raw, gateway)
        got, ended = _read_all(sock)  # the client reads now: before, uvicorn then raised
        code = gateway.wait(30)
    finally:
        sock.close()
        gateway.stop()
    assert code == 0, gateway.output()
    assert ended, got[-300:]  # the connection was closed, not left hanging
    # The first answer went out whole (its record says 200, committed to all of it): the
    # cut of the second must not drop what of it the connection still buffered.
    head1, _, rest = got.partition(b"\r\n\r\n")
    assert head1.startswith(b"HTTP/1.1 200"), got[:300]
    assert rest[: len(BIG)] == BIG, (len(got), len(rest))
    # The second answer's head may have reached the client, never all of its body.
    second = got.find(b"HTTP/1.1 200", 1)
    if second >= 0:
        head, _, body = got[second:].partition(b"\r\n\r\n")
        assert b"content-length: %d" % len(SMALL) in head.lower(), head
        assert len(body) < len(SMALL), got[second:]
    printed = gateway.stdout() + gateway.stderr()
    assert "Traceback" not in printed and "Exception in ASGI" not in printed, printed[-3000:]
    assert "shorter than Content-Length" not in printed, printed[-3000:]
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line.get("level") in ("error", "critical")], lines
    check_first_answered_second_cut(tmp_path)


def test_a_drain_cut_closing_a_connection_whose_client_never_reads_ends_at_its_write_timeout(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    """The cut closes the connection (`BodyWriter.close`), which then waits for the client
    to take what it buffers: a client that never reads must not keep it (its buffered
    answer, the shutdown waiting for it) past `listen.write_timeout_s`. uvicorn's shutdown
    waits for every connection to end, up to its graceful timeout (drain + 5 s): ended by
    the write timeout, the connection is gone long before, so that wait ends without
    uvicorn's "timeout graceful shutdown exceeded" error and the forced end
    (`DrainingServer._end_now`) that follows it. Neither answer's share of the answer
    budget waits for the client: the first was handed over unpaused, the cut second
    never ended (`_answer_taken`)."""
    raw = start_raw(big_or_small(BIG, SMALL))
    gateway = start_hooked(
        raw.url, tmp_path, UNREAD_HOOK, KEY, write_timeout_s=2, drain_timeout_s=1
    )
    sock = _connect(gateway)
    try:
        _cut_the_second(sock, raw, gateway)
        late = "the write timeout reached the connection after the cut"
        until(lambda: late in gateway.stderr(), late, timeout=30, detail=gateway.output)
        code = gateway.wait(30)  # the client still reads nothing
        got, ended = _read_all(sock)
    finally:
        sock.close()
        gateway.stop()
    assert code == 0, gateway.output()
    assert ended, got[-300:]  # the connection was torn down, not left hanging
    printed = gateway.stdout() + gateway.stderr()
    assert "timeout graceful shutdown exceeded" not in printed, printed[-3000:]
    assert "Traceback" not in printed and "Exception in ASGI" not in printed, printed[-3000:]
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line.get("level") in ("error", "critical")], lines
    enforced = [line for line in lines if line.get("event") == "listener limits enforced"]
    assert [line.get("latest") for line in enforced] == ["write_timeout"], enforced
    # Both requests gave their share of the answer budget back: none is held any more.
    released = [line for line in printed.splitlines() if "an answer was released" in line]
    assert len(released) == 2, released
    assert released[-1].endswith("whole answers held 0"), released
    # The client never took the first answer: its connection dropped by the write
    # timeout, it is a client that left (499), committing to none of it. Before, the
    # drain's cut of the wait for it to be taken recorded 200 with all of it.
    check_first_answered_second_cut(tmp_path, first_status=499)
