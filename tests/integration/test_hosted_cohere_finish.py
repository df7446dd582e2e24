"""A Cohere chat answer is relayed as finished only for a `finish_reason` that ends it,
as what that reason means (gateway/upstream/finish_reasons.py `COHERE_FINISHED`).

LiteLLM 1.108.7 reads no `finish_reason` of a whole Cohere answer, v1 or v2: every one
was relayed as `"stop"` (an `ERROR` or `TIMEOUT` answer as complete, `MAX_TOKENS` as
`stop`, not `length`), and the completion record committed to it. A stream's it maps with
`map_finish_reason`, which makes `ERROR` (and any reason it does not know) `"stop"`,
relayed with `[DONE]`. Now an answer that ended for `ERROR`, `TIMEOUT`, `USER_CANCEL`,
none or one unknown is the provider's failure (a whole one 502, a stream broken off), and
`MAX_TOKENS`, `TOOL_CALL`, `ERROR_TOXIC`, `ERROR_LIMIT` are relayed as `length`,
`tool_calls`, `content_filter`, `length`.

The provider is a raw backend (tests/helpers/raw_backend.py) at the backend's
`base_url`, which LiteLLM posts Cohere's chat to as it is.
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
from tests.helpers.hosted_streams import relayed
from tests.helpers.log_truth import logged_hosted_gateway
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

V1 = "cohere_chat/v1/command-r"  # LiteLLM's v1 route: a model that names `v1/`
V2 = "cohere_chat/command-r"
ROUTES = [V1, V2, "cohere/command-r"]
USAGE = {"tokens": {"input_tokens": 1, "output_tokens": 2}}


def whole(model: str, reason: str | None) -> dict[str, Any]:
    """A whole Cohere chat answer in `model`'s API version, ended for `reason`."""
    if "v1/" in model:
        doc: dict[str, Any] = {"response_id": "r", "generation_id": "g", "text": "half an ans"}
        doc["meta"] = {"billed_units": {"input_tokens": 1, "output_tokens": 2}}
    else:
        content = [{"type": "text", "text": "half an ans"}]
        doc = {"id": "c1", "message": {"role": "assistant", "content": content}, "usage": USAGE}
    return doc if reason is None else {**doc, "finish_reason": reason}


def cohere_backend(url: str, model: str) -> dict[str, Any]:
    return hosted_backend(
        "hosted",  # the backend HOSTED_ONLY_POLICY falls back to
        url,
        provider="cohere",
        owner="cohere",
        models=[{"name": "m", "provider_model": model}],
    )


def answered(start_raw: Callable[[Answer], RawBackend], model: str, doc: dict[str, Any]) -> str:
    """The finish reason a `HostedClient` relays for Cohere's whole answer `doc`."""
    provider = start_raw(json_answer(json.dumps(doc).encode()))
    backend = BackendSettings.model_validate(cohere_backend(f"{provider.url}/v2/chat", model))
    client = HostedClient(
        backend, environ={"HOSTED_KEY": "k"}, timeout_s=10, max_answer_bytes=1 << 20
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def send() -> str:
        try:
            response = await client.send("chat", ask, "m")
            return str(json.loads(response.body or b"{}")["choices"][0]["finish_reason"])
        finally:
            await client.aclose()

    return asyncio.run(send())


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("COMPLETE", "stop"),
        ("STOP_SEQUENCE", "stop"),
        ("MAX_TOKENS", "length"),  # before: "stop"
        ("TOOL_CALL", "tool_calls"),  # before: "stop"
        ("ERROR_TOXIC", "content_filter"),  # before: "stop"
        ("ERROR_LIMIT", "length"),  # before: "stop"
    ],
)
def test_a_whole_cohere_answer_is_relayed_with_what_ended_it(
    start_raw: Callable[[Answer], RawBackend], model: str, reason: str, finish: str
) -> None:
    assert answered(start_raw, model, whole(model, reason)) == finish


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("reason", ["ERROR", "TIMEOUT", "USER_CANCEL", "A_REASON_FROM_2027", None])
def test_a_whole_cohere_answer_that_did_not_finish_is_not_relayed(
    start_raw: Callable[[Answer], RawBackend], model: str, reason: str | None
) -> None:
    with pytest.raises(HostedError) as refused:  # before: "stop", a 200
        answered(start_raw, model, whole(model, reason))
    assert (refused.value.kind, type(refused.value)) == ("protocol", Unfinished)


def test_a_cohere_error_answer_is_a_502_and_its_record_commits_to_nothing(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    provider = start_raw(json_answer(json.dumps(whole(V2, "ERROR")).encode()))
    backend = cohere_backend(f"{provider.url}/v2/chat", V2)
    gateway = logged_hosted_gateway(start_gateway, tmp_path, backend, {"HOSTED_KEY": "k"})
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=ask, headers=gateway.headers, timeout=60
    )
    # Before: 200, `"finish_reason": "stop"`, recorded 200 with the answer's commitment.
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_error"
    assert "half an ans" not in response.text
    (record,) = request_records(tmp_path / "log", response.headers["x-request-id"], "completion")
    assert (record["status"], record["response_commitment"]) == (502, None)


def ndjson(events: list[dict[str, Any]]) -> Answer:
    """A stream of `events`, one JSON document a line, as Cohere's v1 chat streams."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/stream+json\r\nconnection: close\r\n\r\n"
    body = b"".join(json.dumps(e).encode() + b"\n" for e in events)

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        writer.write(head + body)
        await writer.drain()
        return False

    return answer


def stream_events(model: str, reason: str | None) -> list[dict[str, Any]]:
    """Text, then the stream's end with `reason` (none when None), in the shape LiteLLM's
    parser of `model`'s version reads."""
    if "v1/" in model:
        text = {"event_type": "text-generation", "is_finished": False, "text": "half an ans"}
        end: dict[str, Any] = {"event_type": "stream-end", "is_finished": True, "response": {}}
        return [text, {**end, "finish_reason": reason}]
    content = {"message": {"content": {"type": "text", "text": "half an ans"}}}
    delta: dict[str, Any] = {} if reason is None else {"finish_reason": reason}
    return [
        {"type": "content-delta", "index": 0, "delta": content},
        {"event": "message-end", "data": {"delta": delta}},
    ]


def finish_of(events: list[bytes]) -> str | None:
    for event in events:
        for reason in (b"stop", b"length", b"tool_calls", b"content_filter"):
            if b'"finish_reason":"' + reason + b'"' in event:
                return reason.decode()
    return None


@pytest.mark.parametrize("model", [V1, V2])
@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("COMPLETE", "stop"),
        ("MAX_TOKENS", "length"),
        ("ERROR_TOXIC", "content_filter"),
        ("ERROR_LIMIT", "length"),  # before: "stop"
        ("TOOL_CALL", "tool_calls"),  # before: "stop"
    ],
)
def test_a_cohere_stream_that_finished_ends_with_its_reason(
    start_raw: Callable[[Answer], RawBackend], model: str, reason: str, finish: str
) -> None:
    events, failure = relayed(start_raw, ndjson(stream_events(model, reason)), "cohere", model)
    assert failure is None, failure
    assert finish_of(events) == finish
    assert events[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize("model", [V1, V2])
@pytest.mark.parametrize("reason", ["ERROR", "TIMEOUT", "USER_CANCEL", "A_REASON_FROM_2027"])
def test_a_cohere_stream_that_did_not_finish_is_broken_off(
    start_raw: Callable[[Answer], RawBackend], model: str, reason: str
) -> None:
    events, failure = relayed(start_raw, ndjson(stream_events(model, reason)), "cohere", model)
    # Before: `"finish_reason":"stop"` and `[DONE]`.
    assert failure is not None and failure.kind == "protocol", (events, failure)
    assert finish_of(events) is None and b"[DONE]" not in b"".join(events)
    assert b"half an ans" in b"".join(events)  # what came was relayed


def test_a_v2_cohere_stream_end_without_a_reason_is_broken_off(
    start_raw: Callable[[Answer], RawBackend],
) -> None:
    # LiteLLM's v2 parser gives a `message-end` without `finish_reason` its "stop".
    answer = ndjson(stream_events(V2, None))
    events, failure = relayed(start_raw, answer, "cohere", V2)
    assert failure is not None and finish_of(events) is None, (events, failure)
