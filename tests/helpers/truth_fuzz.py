"""Randomized fault injection for the log-truth invariant (test_log_truth_fuzz.py).

Each case is drawn from a seeded RNG: what each of two private backends does with the
request (a whole or streamed answer, split into writes at arbitrary bytes, framed by
length, chunks or the close, with lies and cuts, or an error status), and what the client
does (reads it all, leaves after K body bytes, stops reading a while, streams or not, sends
`Expect: 100-continue`). Backends mark every answer with the case and their name, so the
client's bytes say which backend served it. `Client` keeps the exact body bytes the client
got (after the transfer framing), which the test holds the log's records to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import re
import socket
import struct
import time
from dataclasses import dataclass, field

import httptools

from tests.helpers.raw_backend import Post

__all__ = [
    "STALL_S",
    "BackendPlan",
    "ClientPlan",
    "Got",
    "answer_body",
    "backend_plan",
    "client_plan",
    "hosted_plan",
    "play",
    "request_case",
    "serve",
]

_CASE = re.compile(rb"case-(\d+)")
STALL_S = 1.0  # a backend's stall: past the test gateway's read timeouts


@dataclass(frozen=True)
class BackendPlan:
    kind: str  # "whole", "stream", "error", "silent-close"
    status: int
    framing: str  # "length", "length-lie" (too long), "length-short", "chunked",
    # "chunked-early" (no last chunk), "close"
    chunks: int
    usage: str  # "present", "absent", "malformed", "strings"
    done: bool
    crlf: bool
    splits: tuple[int, ...]  # write boundaries (fractions of the wire, in 1/1000)
    delay_ms: int
    stall: int | None  # stall past the gateway's read timeout before this write (index)
    cut: int | None  # cut the wire after this many thousandths of it
    reset: bool
    keep: bool  # keep the connection open for the gateway's next request
    finish: bool = False  # a finish_reason in the last content chunk (a hosted provider's)
    garble: int | None = None  # this stream chunk (index) is not JSON


@dataclass(frozen=True)
class ClientPlan:
    stream: bool
    include_usage: bool
    expect: bool
    action: str  # "all", "leave", "slow", "vanish" (gone before the answer's head)
    after: int  # body bytes read before leaving or pausing
    pause_ms: int
    reset: bool


def backend_plan(rng: random.Random) -> BackendPlan:
    kind = rng.choices(["whole", "stream", "error", "silent-close"], [4, 6, 2, 1])[0]
    return BackendPlan(
        kind=kind,
        status=rng.choice([400, 404, 429, 500, 502, 503]) if kind == "error" else 200,
        framing=rng.choice(
            ["length", "length-lie", "length-short", "chunked", "chunked-early", "close"]
        ),
        chunks=rng.randint(1, 6),
        usage=rng.choice(["present", "absent", "malformed", "strings"]),
        done=rng.random() < 0.8,
        crlf=rng.random() < 0.25,
        splits=tuple(sorted(rng.randint(1, 999) for _ in range(rng.randint(0, 6)))),
        delay_ms=rng.choice([0, 0, 1, 5, 20]),
        stall=rng.randint(0, 6) if rng.random() < 0.05 else None,
        cut=rng.randint(1, 999) if rng.random() < 0.3 else None,
        reset=rng.random() < 0.5,
        keep=rng.random() < 0.5,
    )


def hosted_plan(rng: random.Random) -> BackendPlan:
    """A hosted provider's answer (an OpenAI-compatible server behind LiteLLM): the faults
    of `backend_plan`, and a finish reason or none, and a chunk that is not JSON."""
    plan = backend_plan(rng)
    garble = rng.randint(0, plan.chunks - 1) if rng.random() < 0.15 else None
    return dataclasses.replace(plan, finish=rng.random() < 0.7, garble=garble)


def client_plan(rng: random.Random) -> ClientPlan:
    return ClientPlan(
        stream=rng.random() < 0.6,
        include_usage=rng.random() < 0.5,
        expect=rng.random() < 0.2,
        action=rng.choices(["all", "leave", "slow", "vanish"], [6, 2, 2, 1])[0],
        after=rng.choice([0, 1, 7, 40, 120, 400]),
        pause_ms=rng.choice([10, 50, 200]),
        reset=rng.random() < 0.5,
    )


def _content(case: int, name: str, part: int) -> str:
    # a multi-byte character in every chunk: splits land inside UTF-8 sequences
    return f"case-{case}-{name}-{part}-é€"


def answer_body(plan: BackendPlan, case: int, name: str, with_usage: bool = True) -> bytes:
    """The response body the backend means to send (before framing); `with_usage` False: a
    stream's without its usage event."""
    usage: object = {"prompt_tokens": 3, "completion_tokens": plan.chunks, "total_tokens": 4}
    if plan.usage == "strings":
        usage = {"prompt_tokens": "3", "completion_tokens": 1.5, "total_tokens": True}
    if plan.kind == "error":
        error = {"message": f"case-{case}-{name} failed", "type": "x", "code": None}
        return json.dumps({"error": error}).encode()
    if plan.kind == "whole":
        text = "".join(_content(case, name, i) for i in range(plan.chunks))
        answer: dict[str, object] = {
            "id": f"c{case}",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    **({"finish_reason": "stop"} if plan.finish else {}),
                }
            ],
        }
        if plan.usage != "absent":
            answer["usage"] = usage
        encoded = json.dumps(answer, ensure_ascii=False).encode()
        return encoded[: len(encoded) // 2] if plan.usage == "malformed" else encoded
    end = b"\r\n" if plan.crlf else b"\n"
    events = []
    for i in range(plan.chunks):
        delta = {"content": _content(case, name, i)}
        choice: dict[str, object] = {"index": 0, "delta": delta}
        if plan.finish and i == plan.chunks - 1:
            choice["finish_reason"] = "stop"
        chunk = {"id": f"c{case}", "object": "chat.completion.chunk", "choices": [choice]}
        if plan.garble == i:
            events.append(b'data: {"id":"c%d","choices":[{"ind' % case + end + end)
            continue
        events.append(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + end + end)
    if not with_usage:
        pass
    elif plan.usage == "malformed":
        events.append(b'data: {"id":"c","choices":[],"usage":{"prompt_tok' + end + end)
    elif plan.usage != "absent":
        events.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + end + end)
    if plan.done:
        events.append(b"data: [DONE]" + end + end)
    return b"".join(events)


def _wire(plan: BackendPlan, body: bytes) -> bytes:
    if plan.kind == "silent-close":
        return b""
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests"}
    ctype = b"text/event-stream" if plan.kind == "stream" else b"application/json"
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (
        plan.status,
        reason.get(plan.status, b"Error"),
        ctype,
    )
    if plan.framing == "length":
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    if plan.framing == "length-lie":
        return head + b"content-length: %d\r\n\r\n" % (len(body) + 17) + body
    if plan.framing == "length-short":
        return head + b"content-length: %d\r\n\r\n" % (len(body) * 2 // 3) + body
    if plan.framing in ("chunked", "chunked-early"):
        pieces = [body[i : i + 50] for i in range(0, len(body), 50)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        if plan.framing == "chunked":
            framed += b"0\r\n\r\n"
        return head + b"transfer-encoding: chunked\r\n\r\n" + framed
    return head + b"connection: close\r\n\r\n" + body


async def serve(
    plans: dict[int, dict[str, BackendPlan]], name: str, writer: asyncio.StreamWriter, post: Post
) -> bool:
    """What backend `name` answers to `post` (a case's request), as its plan says."""
    case = request_case(post.body)
    plan = plans[case][name]
    wire = _wire(plan, answer_body(plan, case, name))
    if plan.cut is not None:
        wire = wire[: len(wire) * plan.cut // 1000]
    bounds = [0, *(len(wire) * s // 1000 for s in plan.splits), len(wire)]
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        if index == plan.stall:
            await asyncio.sleep(STALL_S)
        if end > start:
            writer.write(wire[start:end])
            await writer.drain()
        if plan.delay_ms:
            await asyncio.sleep(plan.delay_ms / 1000)
    if plan.keep and plan.cut is None:
        return True  # the connection stays open: whatever was left over is on it
    if plan.reset:  # close with a reset: what the gateway had not read is lost
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return False


@dataclass
class Got:
    """What one client got."""

    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False
    left: bool = False  # the client went away before the end
    seconds: float = 0.0
    note: str = ""

    def describe(self) -> str:
        left = ", left" if self.left else ""
        return f"{self.status}{left} {self.body[:160]!r}"


class _Parser:
    def __init__(self, got: Got) -> None:
        self.got = got
        self.headed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.got.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.headed = True

    def on_body(self, body: bytes) -> None:
        self.got.body += body

    def on_message_complete(self) -> None:
        self.got.complete = True


def request_case(body: bytes) -> int:
    """The case a request body is for."""
    found = _CASE.search(body)
    assert found is not None, body[:200]
    return int(found[1])


def _request(case: int, plan: ClientPlan, key: str) -> tuple[bytes, bytes]:
    doc: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "user", "content": f"case-{case}"}],
        "stream": plan.stream,
    }
    if plan.stream and plan.include_usage:
        doc["stream_options"] = {"include_usage": True}
    body = json.dumps(doc).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
    )
    if plan.expect:
        head += "expect: 100-continue\r\n"
    return (head + "\r\n").encode(), body


def play(host: str, port: int, key: str, case: int, plan: ClientPlan, limit_s: float) -> Got:
    """One client: its request for `case`, then what its plan says; every read bounded."""
    got = Got()
    started = time.monotonic()
    head, body = _request(case, plan, key)
    with socket.create_connection((host, port), timeout=limit_s) as sock:
        sock.settimeout(limit_s)
        buffered = b""
        if plan.expect:
            sock.sendall(head)
            while b"\r\n\r\n" not in buffered:
                data = sock.recv(65536)
                if not data:
                    break
                buffered += data
            if buffered.startswith(b"HTTP/1.1 100"):
                buffered = buffered.split(b"\r\n\r\n", 1)[1]
                sock.sendall(body)
        else:
            sock.sendall(head + body)
        callbacks = _Parser(got)
        parser = httptools.HttpResponseParser(callbacks)
        if buffered:
            parser.feed_data(buffered)
        paused = False
        if plan.action == "vanish":
            got.left = True
            if plan.reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            got.seconds = time.monotonic() - started
            return got
        try:
            while not got.complete:
                if callbacks.headed and got.status is None:
                    got.status = parser.get_status_code()
                if got.status is not None and len(got.body) >= plan.after:
                    if plan.action == "leave":
                        got.left = True
                        if plan.reset:
                            linger = struct.pack("ii", 1, 0)
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                        break
                    if plan.action == "slow" and not paused:
                        paused = True
                        time.sleep(plan.pause_ms / 1000)  # a slow reader: the behaviour itself
                data = sock.recv(65536)
                if not data:
                    break
                parser.feed_data(data)
        except httptools.HttpParserError as error:
            got.note = f"unparsable answer: {error}"
        except TimeoutError:
            got.note = f"no answer within {limit_s}s"
        except ConnectionResetError:
            got.note = "reset"
        if callbacks.headed and got.status is None:
            got.status = parser.get_status_code()
    got.seconds = time.monotonic() - started
    return got
