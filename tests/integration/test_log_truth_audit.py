"""An adversarial auditor's check of what the log says a client received.

Each case drives a real gateway (provenance on) in front of a scripted backend, reads the
answer as an httpx client receives it (its raw body bytes, its status and headers), and
runs `tests/helpers/independent_audit.py`: written from docs/provenance.md alone, it
reads the log from its files with only the public key, checks the receipt with the docs'
recipe, and opens the commitments with the client's bytes. Every case must come out with
no finding: the record's status, backend, usage and response commitment are what the
client got.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import (
    EU_ZERO,
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    anthropic_backend,
    backend,
    hosted_backend,
)
from tests.helpers.independent_audit import Received, audit, log_records
from tests.helpers.log_truth import CHAT, DONE, EVENT, ORIGIN
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

USAGE = b'{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'
USAGE_CHUNK = b'data: {"id":"c","choices":[],"usage":' + USAGE + b"}\n\n"
ASKS_USAGE = {**CHAT, "stream_options": {"include_usage": True}}
WHOLE = {**CHAT, "stream": False}
ANSWER = b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":'
ANSWER += b'{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":' + USAGE + b"}"


def _logged(
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


def _ask(gateway: Gateway, ask: dict[str, Any], path: str = "/v1/chat/completions") -> Received:
    """The answer as the client's connection delivered it (body bytes undecoded)."""
    request = json.dumps(ask).encode()
    with httpx.stream(
        "POST",
        f"{gateway.url}{path}",
        content=request,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    ) as response:
        body = b"".join(response.iter_raw())
    return Received(response.status_code, dict(response.headers), body, request)


def _settled(logdir: Path, vkey: str, request_id: str) -> None:
    """Wait until a signed checkpoint covers a completion for every dispatch of the request."""

    def done() -> bool:
        if not (logdir / "checkpoint").exists():
            return False
        mine = [json.loads(e) for e in log_records(logdir, vkey)]
        mine = [r for r in mine if r["request_id"] == request_id]
        kinds = [r["type"] for r in mine]
        return "refusal" in kinds or (
            bool(kinds) and kinds.count("dispatch") == kinds.count("completion")
        )

    until(done, f"the records of {request_id} signed", timeout=30)


def _later_receipt(gateway: Gateway, request_id: str) -> bytes:
    return httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}", headers=gateway.headers, timeout=10
    ).content


def _writes(*pieces: bytes) -> Answer:
    """An answer that writes `pieces` (each drained) and closes the connection."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        return False

    return answer


def _chunked(*events: bytes, last: bool = True) -> tuple[bytes, ...]:
    """A chunked SSE answer of `events`, one chunk each (`last`: the last chunk sent)."""
    chunks = tuple(b"%x\r\n%s\r\n" % (len(e), e) for e in events if e)
    end = (b"0\r\n\r\n",) if last else ()
    return (sse_head(b"transfer-encoding: chunked\r\n"), *chunks, *end)


def _whole(status: int, body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n" % (status, len(body))
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


TOOL = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t",'
    b'"type":"function","function":{"name":"f","arguments":"{\\"usage\\": 1}"}}]}}]}\n\n'
)
N2 = b'data: {"id":"c","choices":[{"index":1,"delta":{"content":"yo"}}]}\n\n'
JSON = b"content-type: application/json"
GZIPPED = gzip.compress(EVENT + DONE)

STREAMS: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "usage-held-back": (_chunked(EVENT, USAGE_CHUNK, DONE), CHAT),
    "usage-asked": (_chunked(EVENT, USAGE_CHUNK, DONE), ASKS_USAGE),
    "usage-crlf-asked": (
        _chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"), DONE),
        ASKS_USAGE,
    ),
    "usage-crlf-held-back": (
        _chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r\n"), DONE.replace(b"\n", b"\r\n")),
        CHAT,
    ),
    "usage-cr-held-back": (
        _chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r")),
        CHAT,
    ),
    "usage-then-comments-asked": (
        _chunked(EVENT, USAGE_CHUNK, b": keep-alive\n\n" * 400, DONE),
        ASKS_USAGE,
    ),
    "usage-long-chunk-asked": (
        _chunked(
            EVENT, USAGE_CHUNK.replace(b'"choices"', b'"pad":"%s","choices"' % (b"p" * 5000)), DONE
        ),
        ASKS_USAGE,
    ),
    "usage-null-every-chunk": (
        _chunked(EVENT.replace(b"]}", b'],"usage":null}'), USAGE_CHUNK, DONE),
        CHAT,
    ),
    "n2-tools": (_chunked(EVENT, N2, TOOL, USAGE_CHUNK, DONE), {**CHAT, "n": 2}),
    "tiny-chunks": (
        _chunked(*[bytes([b]) for b in (EVENT * 20 + USAGE_CHUNK + DONE)]),
        CHAT,
    ),
    "huge-event": (
        _chunked(EVENT.replace(b'"hi"', b'"%s"' % (b"x" * (2 << 20))), DONE),
        CHAT,
    ),
    "cr-done-close": ((sse_head(), EVENT.replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r")), CHAT),
    "malformed-event": (_chunked(EVENT, b"data: {not json\n\n", DONE), CHAT),
    "done-missing-chunked": (_chunked(EVENT, USAGE_CHUNK), CHAT),
    "done-missing-close": ((sse_head(), EVENT), CHAT),
    "dies-mid-event": (_chunked(EVENT, b'data: {"id":"c","cho', last=False), CHAT),
    "backend-receipt-comment": (
        _chunked(EVENT, b": owngate-receipt AAAA\n\n", b": ping\n\n", DONE),
        CHAT,
    ),
    "json-200-to-stream": ((_whole(200, ANSWER, JSON),), CHAT),
    "text-200-to-stream": ((_whole(200, b"hello", b"content-type: text/plain"),), CHAT),
    "gzip-sse": (
        (
            sse_head(b"content-encoding: gzip\r\ncontent-length: %d\r\n" % len(GZIPPED)),
            GZIPPED,
        ),
        CHAT,
    ),
    "whole": ((_whole(200, ANSWER, JSON),), WHOLE),
    "whole-gzip": ((_whole(200, gzip.compress(ANSWER), JSON, b"content-encoding: gzip"),), WHOLE),
    "whole-string-usage": (
        (_whole(200, ANSWER.replace(b'"prompt_tokens":3', b'"prompt_tokens":"3"'), JSON),),
        WHOLE,
    ),
    "whole-leading-space": ((_whole(200, b"\n  " + ANSWER, JSON),), WHOLE),
    "whole-201": ((_whole(201, ANSWER, JSON),), WHOLE),
    "whole-204": ((_whole(204, b""),), WHOLE),
    "whole-302": ((_whole(302, b"moved", b"location: http://127.0.0.1:9/x"),), WHOLE),
    "stream-206": (
        (sse_head().replace(b"200 OK", b"206 Partial Content"), EVENT, DONE),
        CHAT,
    ),
    "whole-400": ((_whole(400, b'{"error":{"message":"bad"}}', JSON),), WHOLE),
    "whole-404": ((_whole(404, b'{"error":{"message":"no"}}', JSON),), WHOLE),
    "whole-500": ((_whole(500, b'{"error":{"message":"down"}}', JSON),), WHOLE),
    "whole-not-json": ((_whole(200, b"<html>hi</html>", b"content-type: text/html"),), WHOLE),
    "stream-400": ((_whole(400, b'{"error":{"message":"bad"}}', JSON),), CHAT),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_the_log_says_what_the_client_received_from_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    pieces, ask = STREAMS[case]
    raw = start_raw(_writes(*pieces))
    gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = _ask(gateway, ask)
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    later = _later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []


def _chunk(choices: bytes, usage: bytes = b"") -> bytes:
    head = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"f",'
    return head + b'"choices":' + choices + (b',"usage":' + usage if usage else b"") + b"}\n\n"


HOSTED_EVENT = _chunk(b'[{"index":0,"delta":{"role":"assistant","content":"hi"}}]')
HOSTED_END = _chunk(b'[{"index":0,"delta":{},"finish_reason":"stop"}]')
HOSTED_USAGE = _chunk(b"[]", USAGE)
HOSTED_N2 = _chunk(b'[{"index":1,"delta":{"role":"assistant","content":"yo"}}]')
HOSTED_TOOL = _chunk(
    b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
    b'"function":{"name":"f","arguments":"{\\"a\\": 1}"}}]}}]'
)
HOSTED_ANSWER = ANSWER.replace(b'"id":"c"', b'"id":"chatcmpl-x","created":1,"model":"f"')
HOSTED_ASK = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "stream": True}

HOSTED: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "stream": (_chunked(HOSTED_EVENT, HOSTED_END, HOSTED_USAGE, DONE), HOSTED_ASK),
    "stream-usage-asked": (
        _chunked(HOSTED_EVENT, HOSTED_END, HOSTED_USAGE, DONE),
        {**HOSTED_ASK, "stream_options": {"include_usage": True}},
    ),
    "stream-n2-tools": (
        _chunked(HOSTED_EVENT, HOSTED_N2, HOSTED_TOOL, HOSTED_END, HOSTED_USAGE, DONE),
        {**HOSTED_ASK, "n": 2, "stream_options": {"include_usage": True}},
    ),
    "stream-malformed": (_chunked(HOSTED_EVENT, b"data: {not json\n\n", DONE), HOSTED_ASK),
    "stream-done-missing": (_chunked(HOSTED_EVENT, HOSTED_END), HOSTED_ASK),
    "stream-dies": (_chunked(HOSTED_EVENT, last=False), HOSTED_ASK),
    "whole": ((_whole(200, HOSTED_ANSWER, JSON),), {**HOSTED_ASK, "stream": False}),
    "whole-no-usage": (
        (_whole(200, HOSTED_ANSWER.split(b',"usage"')[0] + b"}", JSON),),
        {**HOSTED_ASK, "stream": False},
    ),
    "stream-no-usage-asked": (
        _chunked(HOSTED_EVENT, HOSTED_END, DONE),
        {**HOSTED_ASK, "stream_options": {"include_usage": True}},
    ),
    "whole-gzip": (
        (_whole(200, gzip.compress(HOSTED_ANSWER), JSON, b"content-encoding: gzip"),),
        {**HOSTED_ASK, "stream": False},
    ),
    "whole-400": ((_whole(400, b'{"error":{"message":"bad"}}', JSON),), HOSTED_ASK),
    "whole-500": ((_whole(500, b'{"error":{"message":"down"}}', JSON),), HOSTED_ASK),
}


def _hosted(start_gateway: Callable[..., Gateway], tmp_path: Path, url: str) -> tuple[Gateway, str]:
    """A logged gateway whose only backend is a hosted OpenAI-compatible provider at `url`
    serving `f`, and the log's public key."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    return _logged(
        start_gateway,
        tmp_path,
        [hosted_backend("hosted", f"{url}/v1", "f")],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
    )


@pytest.mark.parametrize("case", list(HOSTED))
def test_the_log_says_what_the_client_received_from_a_hosted_provider(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """An OpenAI-compatible provider (scripted) behind LiteLLM: the commitment is over the
    OpenAI body the gateway encoded for the client."""
    pieces, ask = HOSTED[case]
    raw = start_raw(_writes(*pieces))
    gateway, vkey = _hosted(start_gateway, tmp_path, raw.url)
    received = _ask(gateway, ask)
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    later = _later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_log_says_what_the_client_received_from_a_translated_provider(
    start_gateway: Callable[..., Gateway], tmp_path: Path, stream: bool
) -> None:
    """Anthropic's Messages API (the mock) translated to OpenAI's shape by LiteLLM."""
    mock = AnthropicMock(api_key="sk-mock")
    with ServerThread(mock) as server:
        (tmp_path / "policies").mkdir()
        policy = HOSTED_ONLY_POLICY.replace("backend: hosted", "backend: claude")
        (tmp_path / "policies" / "hosted.yaml").write_text(policy)
        gateway, vkey = _logged(
            start_gateway,
            tmp_path,
            [anthropic_backend("claude", server.url)],
            environ={"MOCK_ANTHROPIC_KEY": "sk-mock"},
            policy={"paths": [str(tmp_path / "policies")]},
        )
        ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        received = _ask(gateway, {**ask, "stream": stream})
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    later = _later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []


def test_a_fallback_to_a_hosted_provider_is_logged_as_what_the_client_got(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The private backend answers 503, the policy falls back to a hosted provider: the
    receipt names the hosted dispatch, whose completion is the request's last record."""
    down = start_raw(_writes(_whole(503, b"")))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway, vkey = _logged(
        start_gateway,
        tmp_path,
        [
            backend("gpu", down.url, "m", **EU_ZERO),
            hosted_backend("hosted", f"{hosted.url}/v1", "m"),
        ],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for stream in (False, True):
        received = _ask(gateway, {**ask, "stream": stream})
        assert received.status == 200, received.body
        request_id = received.headers["x-request-id"]
        _settled(tmp_path / "log", vkey, request_id)
        mine = [json.loads(e) for e in log_records(tmp_path / "log", vkey)]
        kinds = [r["type"] for r in mine if r["request_id"] == request_id]
        assert kinds == ["dispatch", "completion"] * 2, kinds  # the 503, then the provider
        later = _later_receipt(gateway, request_id)
        assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []


def test_receipts_of_concurrent_requests_open_what_each_client_got(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """Requests at once share committed batches: their receipts are v2 (a batch statement
    and a path), which the docs' recipe checks; each opens its own client's bytes."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", sim.url, "m")])
    asks = [CHAT, ASKS_USAGE, WHOLE, {**CHAT, "n": 2}] * 4
    batched = 0
    for _ in range(10):  # rounds, until some receipts came in a batch
        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda ask: _ask(gateway, ask), asks))
        for received in answers:
            assert received.status == 200, received.body
            request_id = received.headers["x-request-id"]
            _settled(tmp_path / "log", vkey, request_id)
            assert audit(received, tmp_path / "log", vkey) == []
            batched += b'"batch"' in base64.b64decode(
                received.headers.get("x-owngate-receipt", "")
                or received.body.rsplit(b": owngate-receipt ", 1)[1].strip()
            )
        if batched:
            break
    assert batched, "no batch receipt in 10 rounds"


@pytest.mark.parametrize("hosted", [False, True], ids=["private", "hosted"])
def test_a_client_that_left_mid_stream_is_logged_with_what_it_was_handed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    hosted: bool,
) -> None:
    """The client reads the first event and closes; the backend holds its stream open
    until then. The record says 499 and commits to that event (as the gateway encoded
    it, from a hosted provider)."""
    left = threading.Event()

    async def hangs(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + (HOSTED_EVENT if hosted else EVENT))
        await writer.drain()
        await asyncio.get_running_loop().run_in_executor(None, left.wait, 30)
        return False

    raw = start_raw(hangs)
    if hosted:
        gateway, vkey = _hosted(start_gateway, tmp_path, raw.url)
        ask: dict[str, Any] = HOSTED_ASK
    else:
        gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
        ask = CHAT
    request = json.dumps(ask).encode()
    got = b""
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        content=request,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    ) as response:
        for piece in response.iter_raw():
            got += piece
            if got.endswith(b"\n\n"):
                break
        headers = dict(response.headers)
    left.set()
    received = Received(response.status_code, headers, got, request)
    request_id = headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    later = _later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later, left=True) == []


@pytest.mark.parametrize("ask", [WHOLE, CHAT], ids=["whole", "stream"])
def test_an_aliased_request_commits_to_the_clients_body_not_the_rewritten_one(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    ask: dict[str, Any],
) -> None:
    """The client asks for an alias; the backend gets its model's own name (the gateway
    rewrites `model`) and answers under it, which the client gets unchanged: the request
    commitment opens with the client's bytes, the response one with the answer as sent."""
    answer = _whole(200, ANSWER, JSON) if ask is WHOLE else _chunked(EVENT, DONE)
    raw = start_raw(_writes(*((answer,) if isinstance(answer, bytes) else answer)))
    entry = {"name": "m", "aliases": ["gpt-x"]}
    gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", raw.url, entry)])
    received = _ask(gateway, {**ask, "model": "gpt-x"})
    assert received.status == 200, received.body
    assert json.loads(raw.posts[0].body)["model"] == "m"
    assert json.loads(received.request)["model"] == "gpt-x"
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []


def test_the_auditor_catches_bytes_status_and_request_the_log_does_not_hold(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The check above is no rubber stamp: one changed byte of the backend's part, another
    status, another request body, or usage the record does not state, each is a finding."""
    raw = start_raw(_writes(*_chunked(EVENT, USAGE_CHUNK, DONE)))
    gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = _ask(gateway, ASKS_USAGE)
    _settled(tmp_path / "log", vkey, received.headers["x-request-id"])
    logdir = tmp_path / "log"
    assert audit(received, logdir, vkey) == []
    flipped = received.body.replace(b'"hi"', b'"ho"', 1)
    shown = received.body.replace(b'"prompt_tokens":3', b'"prompt_tokens":4', 1)
    assert audit(replace(received, body=flipped), logdir, vkey) == [
        "the response commitment does not open with the bytes received"
    ]
    assert audit(replace(received, status=201), logdir, vkey) == [
        "the record says status 200, the client got 201"
    ]
    assert audit(replace(received, request=received.request + b" "), logdir, vkey) == [
        "the request commitment does not open with the bytes sent"
    ]
    assert "usage" in audit(replace(received, body=shown), logdir, vkey)[-1]


@pytest.mark.parametrize(
    ("path", "ask"),
    [
        ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"], "max_tokens": 4}),
        ("/v1/embeddings", {"model": "m", "input": ["a", "b"]}),
    ],
    ids=["completions-stream", "completions-batch", "embeddings"],
)
def test_the_other_endpoints_are_logged_as_the_client_got_them(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    path: str,
    ask: dict[str, Any],
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway, vkey = _logged(start_gateway, tmp_path, [backend("gpu", sim.url, "m")])
    received = _ask(gateway, ask, path)
    assert received.status == 200, received.body
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []


def test_a_refused_request_is_logged_with_the_body_the_client_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The policy admits no backend (the private one declares no zero retention): the
    client's 403 carries the receipt of a refusal record, whose request commitment opens
    with the client's bytes; nothing was sent to the backend."""
    raw = start_raw(_writes(_whole(200, ANSWER, JSON)))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway, vkey = _logged(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        policy={"paths": [str(tmp_path / "policies")]},
    )
    received = _ask(gateway, WHOLE)
    assert received.status == 403, received.body
    request_id = received.headers["x-request-id"]
    _settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    assert raw.posts == []
