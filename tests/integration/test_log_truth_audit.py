"""An adversarial auditor's check of what the log says a client received: private
backends.

Each case drives a real gateway (provenance on) in front of a scripted backend (or the
simulator), reads the answer as an httpx client receives it (its raw body bytes, status
and headers), and runs `tests/helpers/independent_audit.py`: written from
docs/provenance.md alone, it reads the log from its files with only the public key,
checks the receipt with the docs' recipe, and opens the commitments with the client's
bytes. Every case must come out with no finding: the record's status, backend, usage and
response commitment are what the client got. Hosted providers:
test_log_truth_audit_hosted.py.
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

import pytest

from tests.helpers.audit_rig import (
    ANSWER,
    ASKS_USAGE,
    HOSTED_ASK,
    HOSTED_EVENT,
    JSON,
    USAGE_CHUNK,
    WHOLE,
    assert_logged_as_received,
    chunked,
    client_gets,
    hosted_gateway,
    logged,
    private_answer_logged,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
)
from tests.helpers.independent_audit import audit
from tests.helpers.log_truth import CHAT, DONE, EVENT
from tests.helpers.raw_backend import Answer, Post, RawBackend, sse_head

pytestmark = LITELLM_WARNINGS  # a client that left a hosted stream

TOOL = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t",'
    b'"type":"function","function":{"name":"f","arguments":"{\\"usage\\": 1}"}}]}}]}\n\n'
)
N2 = b'data: {"id":"c","choices":[{"index":1,"delta":{"content":"yo"}}]}\n\n'
GZIPPED = gzip.compress(EVENT + DONE)

STREAMS: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "usage-held-back": (chunked(EVENT, USAGE_CHUNK, DONE), CHAT),
    "usage-asked": (chunked(EVENT, USAGE_CHUNK, DONE), ASKS_USAGE),
    "usage-crlf-asked": (
        chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"), DONE),
        ASKS_USAGE,
    ),
    "usage-crlf-held-back": (
        chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r\n"), DONE.replace(b"\n", b"\r\n")),
        CHAT,
    ),
    "usage-cr-held-back": (
        chunked(EVENT, USAGE_CHUNK.replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r")),
        CHAT,
    ),
    "usage-then-comments-asked": (
        chunked(EVENT, USAGE_CHUNK, b": keep-alive\n\n" * 400, DONE),
        ASKS_USAGE,
    ),
    "usage-long-chunk-asked": (
        chunked(
            EVENT, USAGE_CHUNK.replace(b'"choices"', b'"pad":"%s","choices"' % (b"p" * 5000)), DONE
        ),
        ASKS_USAGE,
    ),
    "usage-null-every-chunk": (
        chunked(EVENT.replace(b"]}", b'],"usage":null}'), USAGE_CHUNK, DONE),
        CHAT,
    ),
    # counts the record cannot state (docs: whole numbers 0..2^53): no usage recorded
    "usage-past-2-53-asked": (
        chunked(EVENT, USAGE_CHUNK.replace(b":3,", b":9007199254740993,"), DONE),
        ASKS_USAGE,
    ),
    "usage-negative-asked": (
        chunked(EVENT, USAGE_CHUNK.replace(b":3,", b":-3,"), DONE),
        ASKS_USAGE,
    ),
    "usage-at-2-53-asked": (
        chunked(EVENT, USAGE_CHUNK.replace(b":3,", b":9007199254740992,"), DONE),
        ASKS_USAGE,
    ),
    "n2-tools": (chunked(EVENT, N2, TOOL, USAGE_CHUNK, DONE), {**CHAT, "n": 2}),
    "tiny-chunks": (
        chunked(*[bytes([b]) for b in (EVENT * 20 + USAGE_CHUNK + DONE)]),
        CHAT,
    ),
    "huge-event": (
        chunked(EVENT.replace(b'"hi"', b'"%s"' % (b"x" * (2 << 20))), DONE),
        CHAT,
    ),
    "cr-done-close": ((sse_head(), EVENT.replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r")), CHAT),
    "malformed-event": (chunked(EVENT, b"data: {not json\n\n", DONE), CHAT),
    "done-missing-chunked": (chunked(EVENT, USAGE_CHUNK), CHAT),
    "done-missing-close": ((sse_head(), EVENT), CHAT),
    "dies-mid-event": (chunked(EVENT, b'data: {"id":"c","cho', last=False), CHAT),
    "backend-receipt-comment": (
        chunked(EVENT, b": owngate-receipt AAAA\n\n", b": ping\n\n", DONE),
        CHAT,
    ),
    "json-200-to-stream": ((whole_answer(200, ANSWER, JSON),), CHAT),
    "text-200-to-stream": ((whole_answer(200, b"hello", b"content-type: text/plain"),), CHAT),
    "gzip-sse": (
        (
            sse_head(b"content-encoding: gzip\r\ncontent-length: %d\r\n" % len(GZIPPED)),
            GZIPPED,
        ),
        CHAT,
    ),
    "whole": ((whole_answer(200, ANSWER, JSON),), WHOLE),
    "whole-gzip": (
        (whole_answer(200, gzip.compress(ANSWER), JSON, b"content-encoding: gzip"),),
        WHOLE,
    ),
    "whole-string-usage": (
        (whole_answer(200, ANSWER.replace(b'"prompt_tokens":3', b'"prompt_tokens":"3"'), JSON),),
        WHOLE,
    ),
    "whole-leading-space": ((whole_answer(200, b"\n  " + ANSWER, JSON),), WHOLE),
    "whole-201": ((whole_answer(201, ANSWER, JSON),), WHOLE),
    "whole-204": ((whole_answer(204, b""),), WHOLE),
    "whole-302": ((whole_answer(302, b"moved", b"location: http://127.0.0.1:9/x"),), WHOLE),
    "stream-206": (
        (sse_head().replace(b"200 OK", b"206 Partial Content"), EVENT, DONE),
        CHAT,
    ),
    "whole-400": ((whole_answer(400, b'{"error":{"message":"bad"}}', JSON),), WHOLE),
    "whole-404": ((whole_answer(404, b'{"error":{"message":"no"}}', JSON),), WHOLE),
    "whole-500": ((whole_answer(500, b'{"error":{"message":"down"}}', JSON),), WHOLE),
    "whole-not-json": ((whole_answer(200, b"<html>hi</html>", b"content-type: text/html"),), WHOLE),
    "stream-400": ((whole_answer(400, b'{"error":{"message":"bad"}}', JSON),), CHAT),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_the_log_says_what_the_client_received_from_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    private_answer_logged(start_raw, start_gateway, tmp_path, *STREAMS[case])


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
        gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
        ask: dict[str, Any] = HOSTED_ASK
    else:
        gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
        ask = CHAT
    received = client_gets(gateway, ask, enough=lambda got: got.endswith(b"\n\n"))
    left.set()
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey, left=True)


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
    answer = whole_answer(200, ANSWER, JSON) if ask is WHOLE else chunked(EVENT, DONE)
    raw = start_raw(writes(*((answer,) if isinstance(answer, bytes) else answer)))
    entry = {"name": "m", "aliases": ["gpt-x"]}
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, entry)])
    received = client_gets(gateway, {**ask, "model": "gpt-x"})
    assert received.status == 200, received.body
    assert json.loads(raw.posts[0].body)["model"] == "m"
    assert json.loads(received.request)["model"] == "gpt-x"
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []


def test_the_auditor_catches_bytes_status_and_request_the_log_does_not_hold(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The check above is no rubber stamp: one changed byte of the backend's part, another
    status, another request body, or usage the record does not state, each is a finding."""
    raw = start_raw(writes(*chunked(EVENT, USAGE_CHUNK, DONE)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, ASKS_USAGE)
    settled(tmp_path / "log", vkey, received.headers["x-request-id"])
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
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", sim.url, "m")])
    received = client_gets(gateway, ask, path)
    assert received.status == 200, received.body
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []


def test_a_refused_request_is_logged_with_the_body_the_client_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The policy admits no backend (the private one declares no zero retention): the
    client's 404 (the model is not in its `/v1/models`) carries the receipt of a refusal
    record, whose request commitment opens with the client's bytes; nothing was sent to
    the backend."""
    raw = start_raw(writes(whole_answer(200, ANSWER, JSON)))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        policy={"paths": [str(tmp_path / "policies")]},
    )
    received = client_gets(gateway, WHOLE)
    assert received.status == 404, received.body  # `m` is not in the tenant's /v1/models
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    assert audit(received, tmp_path / "log", vkey) == []
    assert raw.posts == []


def test_receipts_of_concurrent_requests_open_what_each_client_got(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """Requests at once share committed batches: their receipts are v2 (a batch statement
    and a path), which the docs' recipe checks; each opens its own client's bytes."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", sim.url, "m")])
    asks = [CHAT, ASKS_USAGE, WHOLE, {**CHAT, "n": 2}] * 4
    batched = 0
    for _ in range(10):  # rounds, until some receipts came in a batch
        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda ask: client_gets(gateway, ask), asks))
        for received in answers:
            assert received.status == 200, received.body
            request_id = received.headers["x-request-id"]
            settled(tmp_path / "log", vkey, request_id)
            assert audit(received, tmp_path / "log", vkey) == []
            batched += b'"batch"' in base64.b64decode(
                received.headers.get("x-owngate-receipt", "")
                or received.body.rsplit(b": owngate-receipt ", 1)[1].strip()
            )
        if batched:
            break
    assert batched, "no batch receipt in 10 rounds"
