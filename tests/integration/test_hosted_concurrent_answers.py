"""Twenty hosted calls at once, two tenants, each with its own prompt: each client gets
its own answer and a receipt whose records open on its own request and answer.

The hosted transport's bounded stream (gateway/upstream/hosted_bound.py) is one class per
HTTP module, made once (branch cycles), where it was a class made per call holding its
stream in closures: a regression check that no call's stream, limits or answer bytes
reach another call through that shared class.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.provenance import load_verifiers, verify_commitment, verify_receipt, write_signing_key
from gateway.tenants import hash_api_key
from gateway.upstream import hosted_bound
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    hosted_backend,
)
from tests.helpers.log_truth import stream_receipt
from tests.helpers.provenance import completion_record, request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_body

pytestmark = LITELLM_WARNINGS

CALLS = 20
ORIGIN = "test.owngate/concurrent-hosted"
TWO_TENANTS = [
    {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
    {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
]


def _answer(content: str) -> bytes:
    body = completion_body(f"echo {content}")
    # chunked, in pieces with turns of the loop between: the calls' reads interleave
    pieces = [body[i : i + 40] for i in range(0, len(body), 40)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + framed


def _events(content: str) -> bytes:
    events = b""
    for word, end in (("echo ", None), (content, None), ("", "stop")):
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": end}],
        }
        events += b"data: %s\n\n" % json.dumps(chunk).encode()
    events += b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(events) + events


async def _echo(writer: asyncio.StreamWriter, post: Post) -> bool:
    request = json.loads(post.body)
    asked: str = request["messages"][0]["content"]
    whole = _events(asked) if request.get("stream") else _answer(asked)
    for i in range(0, len(whole), 64):
        writer.write(whole[i : i + 64])
        await writer.drain()
        await asyncio.sleep(0)
    return True


def _content(response: httpx.Response, stream: bool) -> str:
    if not stream:
        content: str = response.json()["choices"][0]["message"]["content"]
        return content
    said = []
    for line in response.content.split(b"\n"):
        if line.startswith(b"data: {"):
            said += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
    return "".join(said)


@pytest.mark.parametrize("stream", [False, True])
def test_concurrent_hosted_calls_each_get_their_own_answer_and_records(
    stream: bool,
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    provider = start_raw(_echo)
    (tmp_path / "policies").mkdir()
    policy = HOSTED_ONLY_POLICY.replace("tenants: [acme]", "tenants: [acme, other]")
    (tmp_path / "policies" / "hosted.yaml").write_text(policy)
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    gateway = start_gateway(
        [hosted_backend("hosted", provider.url + "/v1", "m")],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
        tenants=TWO_TENANTS,
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )
    asked = [f"prompt-{i:02d}-{'acme' if i % 2 else 'other'}" for i in range(CALLS)]

    async def all_at_once() -> list[tuple[bytes, httpx.Response]]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int) -> tuple[bytes, httpx.Response]:
                key = TENANT_KEY if i % 2 else OTHER_KEY
                body = json.dumps(
                    {
                        "model": "m",
                        "messages": [{"role": "user", "content": asked[i]}],
                        "stream": stream,
                    }
                ).encode()
                response = await client.post(
                    f"{gateway.url}/v1/chat/completions",
                    content=body,
                    headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
                )
                return body, response

            return await asyncio.gather(*(one(i) for i in range(CALLS)))

    answers = asyncio.run(all_at_once())
    assert hosted_bound._BOUNDED, "the calls went through the bounded stream"
    verifiers = load_verifiers([vkey])
    for i, (body, response) in enumerate(answers):
        assert response.status_code == 200, response.text
        assert _content(response, stream) == f"echo {asked[i]}"
        for other in asked:
            if other != asked[i]:
                assert other.encode() not in response.content
        request_id = response.headers["x-request-id"]
        envelope = (
            stream_receipt(response.content)
            if stream
            else base64.b64decode(response.headers["x-owngate-receipt"])
        )
        receipt = verify_receipt(envelope, verifiers)
        record = completion_record(tmp_path / "log", request_id)
        assert record["status"] == 200
        dispatch = request_records(tmp_path / "log", request_id, "dispatch")
        assert [d["backend"]["id"] for d in dispatch] == ["hosted"]
        assert dispatch[0]["tenant"] == ("acme" if i % 2 else "other")
        verify_commitment("request", dispatch[0]["request_commitment"], receipt.salts.request, body)
        verify_commitment(
            "response",
            record["response_commitment"],
            receipt.salts.response,
            response.content.split(b": owngate-receipt ")[0],
        )
