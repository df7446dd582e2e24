"""A chat LiteLLM serves through a Responses API (its bridge) is relayed as finished only
when the response's `status` says it ended (gateway/upstream/finish_reasons.py
`responses_unfinished`), whole or streamed.

LiteLLM 1.108.7 relayed a whole response whose `status` was `failed` (without an error
object), `cancelled`, `in_progress` or `queued` with `"finish_reason": "stop"`, a 200
whose record committed to it, and an `incomplete` one for no stated reason as `length`;
on a stream, `response.incomplete` without a reason as `length` and `[DONE]`, and a
`response.completed` event whose response is not completed as `stop`. Now each is the
provider's failure: a whole one 502, a stream broken off with the gateway's error event.
An incomplete response for `max_output_tokens` is `length`, for `content_filter`
`content_filter`, as before. A scripted provider on a real socket speaks the Responses
API for `openai/o3-pro` (a model LiteLLM bridges).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.hosted_finish import Unfinished
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway, hosted_backend
from tests.helpers.hosted_streams import client_relayed
from tests.helpers.log_truth import logged_hosted_gateway
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer, sse_head

pytestmark = LITELLM_WARNINGS

USAGE = {
    "input_tokens": 3,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 10,
}
TEXT = {"type": "output_text", "text": "half an ans", "annotations": []}
MESSAGE = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def response(status: str, reason: str | None = None) -> dict[str, Any]:
    """A Responses API response with one message of text, in `status`, incomplete for
    `reason` (no `incomplete_details` when None)."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "o3-pro",
        "output": [{**MESSAGE, "content": [TEXT]}],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": USAGE,
        "incomplete_details": None if reason is None else {"reason": reason},
    }


def bridged_backend(url: str) -> dict[str, Any]:
    backend = hosted_backend("hosted", f"{url}/v1")
    backend["models"] = [{"name": "m", "provider_model": "openai/o3-pro"}]
    return backend


def relayed(
    start_raw: Callable[[Answer], RawBackend], answer: Answer, stream: bool
) -> tuple[list[bytes], HostedError | None]:
    """What a `HostedClient` relays of `answer`: a whole answer's body (one item), or a
    stream's events; and the `HostedError` that ended it, if any."""
    provider = start_raw(answer)
    backend = BackendSettings.model_validate(bridged_backend(provider.url))
    client = HostedClient(
        backend, environ={"HOSTED_KEY": "k"}, timeout_s=30, max_answer_bytes=1 << 20
    )
    return client_relayed(client, "chat", {**CHAT, "stream": stream})


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ("failed", None),  # without an error object (with one, LiteLLM raises)
        ("cancelled", None),
        ("in_progress", None),
        ("queued", None),
        ("incomplete", None),  # no reason stated: LiteLLM's `length`
    ],
)
def test_a_whole_response_that_did_not_end_is_not_relayed(
    start_raw: Callable[[Answer], RawBackend], status: str, reason: str | None
) -> None:
    answer = json_answer(json.dumps(response(status, reason)).encode())
    body, failure = relayed(start_raw, answer, stream=False)
    # Before: a 200 with `"finish_reason": "stop"` (`length` for the incomplete one).
    assert isinstance(failure, Unfinished) and failure.kind == "protocol", (body, failure)


@pytest.mark.parametrize(
    ("status", "reason", "finish"),
    [
        ("completed", None, "stop"),
        ("incomplete", "max_output_tokens", "length"),
        ("incomplete", "content_filter", "content_filter"),
    ],
)
def test_a_whole_response_that_ended_is_relayed_with_what_ended_it(
    start_raw: Callable[[Answer], RawBackend], status: str, reason: str | None, finish: str
) -> None:
    answer = json_answer(json.dumps(response(status, reason)).encode())
    (body,), failure = relayed(start_raw, answer, stream=False)
    assert failure is None, failure
    assert json.loads(body)["choices"][0]["finish_reason"] == finish


def test_a_failed_response_is_a_502_and_its_record_commits_to_nothing(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    provider = start_raw(json_answer(json.dumps(response("failed")).encode()))
    backend = bridged_backend(provider.url)
    gateway = logged_hosted_gateway(start_gateway, tmp_path, backend, {"HOSTED_KEY": "k"})
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT, headers=gateway.headers, timeout=60
    )
    # Before: 200, `"finish_reason": "stop"`, recorded 200 with the answer's commitment.
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_error"
    assert "half an ans" not in answer.text
    (record,) = request_records(tmp_path / "log", answer.headers["x-request-id"], "completion")
    assert (record["status"], record["response_commitment"]) == (502, None)


def stream(terminal: str, done: dict[str, Any]) -> Answer:
    """A Responses stream: created, one text delta, then `terminal` with `done`."""
    delta = {"output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "half an ans"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response("in_progress"), "output": []}},
        {"type": "response.output_text.delta", **delta},
        {"type": terminal, "response": done},
    ]
    body = b"".join(
        b"event: "
        + str(e["type"]).encode()
        + b"\ndata: "
        + json.dumps({**e, "sequence_number": n}).encode()
        + b"\n\n"
        for n, e in enumerate(events)
    )

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(sse_head() + body)
        await writer.drain()
        return False

    return answer


def finish_of(events: list[bytes]) -> str | None:
    for event in events:
        for reason in (b"stop", b"length", b"tool_calls", b"content_filter"):
            if b'"finish_reason":"' + reason + b'"' in event:
                return reason.decode()
    return None


@pytest.mark.parametrize(
    ("terminal", "status", "reason"),
    [
        ("response.incomplete", "incomplete", None),  # before: `length`, `[DONE]`
        ("response.completed", "failed", None),  # before: `stop`, `[DONE]`
        ("response.completed", "in_progress", None),  # before: `stop`, `[DONE]`
    ],
)
def test_a_stream_whose_response_did_not_end_is_broken_off(
    start_raw: Callable[[Answer], RawBackend], terminal: str, status: str, reason: str | None
) -> None:
    events, failure = relayed(start_raw, stream(terminal, response(status, reason)), stream=True)
    assert failure is not None and failure.kind == "protocol", (events, failure)
    assert finish_of(events) is None and b"[DONE]" not in b"".join(events)
    assert b"half an ans" in b"".join(events)  # what came was relayed


@pytest.mark.parametrize(
    ("terminal", "status", "reason", "finish"),
    [
        ("response.completed", "completed", None, "stop"),
        ("response.incomplete", "incomplete", "max_output_tokens", "length"),
        ("response.incomplete", "incomplete", "content_filter", "content_filter"),
        ("response.completed", "incomplete", "max_output_tokens", "length"),  # before: `stop`
    ],
)
def test_a_stream_whose_response_ended_ends_with_what_ended_it(
    start_raw: Callable[[Answer], RawBackend],
    terminal: str,
    status: str,
    reason: str | None,
    finish: str,
) -> None:
    events, failure = relayed(start_raw, stream(terminal, response(status, reason)), stream=True)
    assert failure is None, failure
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"
