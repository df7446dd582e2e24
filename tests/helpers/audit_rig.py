"""Driving a logged gateway for the independent audit (tests/integration/
test_log_truth_audit*.py): scripted backend answers, the answer as an httpx client
receives it, and waiting until the log's signed checkpoint covers a request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from gateway.provenance import write_signing_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY, Gateway, backend, hosted_backend
from tests.helpers.independent_audit import Received, audit, log_records
from tests.helpers.log_truth import CHAT, ORIGIN
from tests.helpers.raw_backend import ERROR_BODY, Answer, Post, RawBackend, json_answer, sse_head
from tests.helpers.waiting import until

__all__ = [
    "ANSWER",
    "ASKS_USAGE",
    "HOSTED_ANSWER",
    "HOSTED_ASK",
    "HOSTED_END",
    "HOSTED_EVENT",
    "HOSTED_N2",
    "HOSTED_TOOL",
    "HOSTED_USAGE",
    "JSON",
    "USAGE",
    "USAGE_CHUNK",
    "WHOLE",
    "assert_logged_as_received",
    "chunked",
    "client_gets",
    "hosted_gateway",
    "later_receipt",
    "logged",
    "openai_chunk",
    "private_answer_logged",
    "settled",
    "whole_answer",
    "writes",
]

JSON = b"content-type: application/json"
USAGE = b'{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'
USAGE_CHUNK = b'data: {"id":"c","choices":[],"usage":' + USAGE + b"}\n\n"
ASKS_USAGE = {**CHAT, "stream_options": {"include_usage": True}}
WHOLE = {**CHAT, "stream": False}
ANSWER = b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":'
ANSWER += b'{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":' + USAGE + b"}"


def logged(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    backends: list[dict[str, Any]],
    **extra: Any,
) -> tuple[Gateway, str]:
    """A gateway with its log in `tmp_path / "log"`, and the log's public key."""
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    provenance = {
        "dir": str(tmp_path / "log"),
        "origin": ORIGIN,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
    }
    return start_gateway(backends, provenance=provenance, **extra), vkey


def failing_over_onto_the_log(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    arm: Callable[[], None],
    **extra: Any,
) -> tuple[Gateway, str, RawBackend, RawBackend]:
    """A logged gateway before two private backends taken in turn: `a` answers 502
    after calling `arm` (its dispatch record is durable: a disk the caller put under the
    log fails or hangs from the next write on, that of the next attempt's dispatch
    record), and `b` must get nothing. The gateway, the log's key, `a` and `b`."""
    failing = json_answer(ERROR_BODY, b"502 Bad Gateway")

    async def fails_and_arms(writer: asyncio.StreamWriter, post: Post) -> bool:
        arm()
        return await failing(writer, post)

    async def serves(_writer: asyncio.StreamWriter, _post: Post) -> bool:
        raise AssertionError("the second backend got a request no record logged")

    a, b = start_raw(fails_and_arms), start_raw(serves)
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [backend("a", a.url, "m"), backend("b", b.url, "m")],
        routing={"default": {"strategy": "round_robin"}},
        **extra,
    )
    return gateway, vkey, a, b


def client_gets(
    gateway: Gateway,
    ask: dict[str, Any],
    path: str = "/v1/chat/completions",
    *,
    enough: Callable[[bytes], bool] | None = None,
) -> Received:
    """The answer as the client's connection delivered it (body bytes undecoded).
    `enough`, if given, sees the body read so far after each read: once it says True the
    client reads no more and closes the connection."""
    request = json.dumps(ask).encode()
    body = bytearray()
    with httpx.stream(
        "POST",
        f"{gateway.url}{path}",
        content=request,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    ) as response:
        for piece in response.iter_raw():
            body += piece
            if enough is not None and enough(bytes(body)):
                break
        headers = dict(response.headers)
    return Received(response.status_code, headers, bytes(body), request)


def request_log(logdir: Path, vkey: str, request_id: str) -> list[dict[str, Any]]:
    """The records of `request_id` among those the checkpoint signed by `vkey` covers, read
    by the independent reader (`log_records`: the root recomputed and compared)."""
    found = [json.loads(e) for e in log_records(logdir, vkey)]
    return [r for r in found if r["request_id"] == request_id]


def settled(logdir: Path, vkey: str, request_id: str) -> None:
    """Wait until a signed checkpoint covers a completion for every dispatch of the request."""

    def done() -> bool:
        if not (logdir / "checkpoint").exists():
            return False
        kinds = [r["type"] for r in request_log(logdir, vkey, request_id)]
        return "refusal" in kinds or (
            bool(kinds) and kinds.count("dispatch") == kinds.count("completion")
        )

    until(done, f"the records of {request_id} signed", timeout=30)


def first_request_settled(logdir: Path, vkey: str) -> str:
    """The id of the log's first request, once a signed checkpoint covers a completion for
    every dispatch of it (a test that sends one request: its id, though the client never
    read it)."""
    until(lambda: bool(log_records(logdir, vkey)), "its records signed", timeout=30)
    request_id: str = json.loads(log_records(logdir, vkey)[0])["request_id"]
    settled(logdir, vkey, request_id)
    return request_id


def later_receipt(gateway: Gateway, request_id: str) -> bytes:
    return httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}", headers=gateway.headers, timeout=10
    ).content


def assert_logged_as_received(
    received: Received, gateway: Gateway, logdir: Path, vkey: str, *, left: bool = False
) -> None:
    """Once a signed checkpoint covers `received`'s request, the independent audit finds
    nothing wrong between what the client received, the receipt it fetches again and the
    log (`left`: the client closed before its stream's end)."""
    request_id = received.headers["x-request-id"]
    settled(logdir, vkey, request_id)
    later = later_receipt(gateway, request_id)
    assert audit(received, logdir, vkey, later_receipt=later, left=left) == []


def assert_shape_failure_recorded(received: Received, logdir: Path, vkey: str) -> None:
    """`received` is the 502 `upstream_error` of an answer of the wrong shape, and once a
    signed checkpoint covers it the log says just that: a completion of 502, nothing
    committed and no usage."""
    assert received.status == 502, (received.status, received.headers, received.body)
    error = json.loads(received.body)["error"]
    assert error["code"] == "upstream_error" and "wrong shape" in error["message"]
    request_id = received.headers["x-request-id"]
    settled(logdir, vkey, request_id)
    assert audit(received, logdir, vkey) == []
    completion = request_log(logdir, vkey, request_id)[-1]
    assert (completion["type"], completion["status"]) == ("completion", 502)
    assert completion["response_commitment"] is None and completion["usage"] is None


def private_answer_logged(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    pieces: tuple[bytes, ...],
    ask: dict[str, Any],
) -> tuple[Received, str]:
    """What a client asking `ask` got from a logged gateway in front of a raw backend `gpu`
    (serving `m`) that writes `pieces`, once the audit found the log says just that; and
    the log's public key."""
    raw = start_raw(writes(*pieces))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ask)
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    return received, vkey


def writes(*pieces: bytes) -> Answer:
    """An answer that writes `pieces` (each drained) and closes the connection."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        return False

    return answer


def chunked(*events: bytes, last: bool = True) -> tuple[bytes, ...]:
    """A chunked SSE answer of `events`, one chunk each (`last`: the last chunk sent)."""
    chunks = tuple(b"%x\r\n%s\r\n" % (len(e), e) for e in events if e)
    end = (b"0\r\n\r\n",) if last else ()
    return (sse_head(b"transfer-encoding: chunked\r\n"), *chunks, *end)


def whole_answer(status: int, body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n" % (status, len(body))
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def openai_chunk(choices: bytes, usage: bytes = b"") -> bytes:
    head = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"f",'
    return head + b'"choices":' + choices + (b',"usage":' + usage if usage else b"") + b"}\n\n"


HOSTED_EVENT = openai_chunk(b'[{"index":0,"delta":{"role":"assistant","content":"hi"}}]')
HOSTED_END = openai_chunk(b'[{"index":0,"delta":{},"finish_reason":"stop"}]')
HOSTED_USAGE = openai_chunk(b"[]", USAGE)
HOSTED_N2 = openai_chunk(b'[{"index":1,"delta":{"role":"assistant","content":"yo"}}]')
HOSTED_TOOL = openai_chunk(
    b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
    b'"function":{"name":"f","arguments":"{\\"a\\": 1}"}}]}}]'
)
HOSTED_ANSWER = ANSWER.replace(b'"id":"c"', b'"id":"chatcmpl-x","created":1,"model":"f"')
HOSTED_ASK = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def hosted_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str
) -> tuple[Gateway, str]:
    """A logged gateway whose only backend is a hosted OpenAI-compatible provider at `url`
    serving `f`, and the log's public key."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    return logged(
        start_gateway,
        tmp_path,
        [hosted_backend("hosted", f"{url}/v1", "f")],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
    )


def first_then(
    posts: list[str], name: str, first: Sequence[bytes], then: Sequence[bytes]
) -> Answer:
    """Backend `name`'s answer, for backends that share `posts`: `writes(*first)` to the
    first request any of them gets, `writes(*then)` to every later one; each request
    appends the name of the backend it reached to `posts`."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        posts.append(name)
        return await writes(*(first if len(posts) == 1 else then))(writer, post)

    return answer
