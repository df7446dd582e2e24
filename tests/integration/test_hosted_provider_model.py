"""The model a hosted attempt sent its provider, and the model the provider answered with,
in the signed log.

`model` in a dispatch record is the public name the client asked for; gateway.yaml maps it
to a LiteLLM model string per hosted backend (`provider_model`, e.g. `openai/gpt-4o-mini`)
and the provider answers naming the exact model that served (`gpt-4o-mini-2024-07-18`),
the one its usage export bills. An auditor reconciling the log with that export needs
both: the dispatch record names the string sent (`provider_model`), the completion's
`upstream.model` the one the answer the client got names (LiteLLM names a stream's
chunks after the model it asked for, not the provider's: the record says what the
client got). A provider's model that is not a
model name (free text, an escape, past 128 characters) is recorded as null, never written.
Records without either field (older logs, private backends) still verify.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.provenance.errors import RecordError
from gateway.provenance.formats.records import parse_record
from tests.helpers.audit_rig import (
    ANSWER,
    JSON,
    WHOLE,
    assert_logged_as_received,
    client_gets,
    logged,
    request_log,
    whole_answer,
    writes,
)
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS, Gateway, backend
from tests.helpers.gateways import hosted_backend as hosted
from tests.helpers.log_truth import sse_events
from tests.helpers.raw_backend import Answer, Post, RawBackend

pytestmark = LITELLM_WARNINGS

SENT = "openai/gpt-4o-mini"
ANSWERED = "gpt-4o-mini-2024-07-18"
SECRET = "patient-record-4711"


def _provider(model: str, stream: bool, posts: list[Post]) -> Answer:
    """An OpenAI-compatible provider whose answer names `model`."""
    fields = {"id": "chatcmpl-own_0003", "created": 1, "model": model}
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    whole = {**fields, "object": "chat.completion", "usage": usage}
    whole["choices"] = [{**choice, "finish_reason": "stop"}]
    chunk = {**fields, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": usage},
    ]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    sse += b"data: [DONE]\n\n"

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        posts.append(post)
        body, kind = (sse, b"text/event-stream") if stream else (json.dumps(whole).encode(), b"")
        kind = kind or b"application/json"
        writer.write(whole_answer(200, body, b"content-type: " + kind))
        await writer.drain()
        return False

    return answer


def _gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str
) -> tuple[Gateway, str]:
    """A logged gateway whose only backend is a hosted provider at `url` serving `f` as
    `SENT`, and the log's public key."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    provider = {**hosted("hosted", f"{url}/v1"), "models": [{"name": "f", "provider_model": SENT}]}
    return logged(
        start_gateway,
        tmp_path,
        [provider],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
    )


def _named_model(body: bytes, stream: bool) -> object:
    """The model the answer the client got names (a stream: its first event's)."""
    if not stream:
        return json.loads(body)["model"]
    return json.loads(sse_events(body)[0].removeprefix(b"data: "))["model"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_records_name_the_model_sent_and_the_model_that_answered(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stream: bool,
) -> None:
    posts: list[Post] = []
    raw = start_raw(_provider(ANSWERED, stream, posts))
    gateway, vkey = _gateway(start_gateway, tmp_path, raw.url)
    ask: dict[str, Any] = {"model": "f", "messages": [{"role": "user", "content": "hi"}]}
    received = client_gets(gateway, {**ask, "stream": stream})
    assert received.status == 200, received.body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    dispatch, completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert dispatch["model"] == "f"
    # What went on the wire is what LiteLLM sends for `openai/gpt-4o-mini`: its model part.
    assert [json.loads(p.body)["model"] for p in posts] == [SENT.removeprefix("openai/")]
    assert dispatch["provider_model"] == SENT
    # The model the answer the client got names: the provider's own in a whole answer;
    # LiteLLM names a stream's chunks after the model it asked for (their `model` part).
    named = SENT.removeprefix("openai/") if stream else ANSWERED
    assert completion["upstream"]["model"] == named == _named_model(received.body, stream)
    assert main(["audit", "verify", str(tmp_path / "log"), "--key", vkey]) == 0


@pytest.mark.parametrize(
    "model",
    ["gpt-4o \x1b[31m" + SECRET, SECRET + " said hello", "m" * 129, ""],
    ids=["escape", "free-text", "too-long", "empty"],
)
def test_a_provider_model_that_is_not_a_model_name_is_recorded_as_null(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    model: str,
) -> None:
    raw = start_raw(_provider(model, False, []))
    gateway, vkey = _gateway(start_gateway, tmp_path, raw.url)
    received = client_gets(gateway, {"model": "f", "messages": [], "stream": False})
    assert received.status == 200, received.body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["upstream"]["model"] is None
    log = b"".join(p.read_bytes() for p in (tmp_path / "log").rglob("*") if p.is_file())
    assert SECRET.encode() not in log and b"m" * 129 not in log


def test_a_private_dispatch_names_no_provider_model(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(writes(whole_answer(200, ANSWER, JSON)))
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", raw.url, "m")])
    received = client_gets(gateway, WHOLE)
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    dispatch, completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert "provider_model" not in dispatch and "upstream" not in completion


_DISPATCH: dict[str, Any] = {
    "v": 1,
    "type": "dispatch",
    "request_id": "req_000000000000000000000001",
    "time": "2026-01-31T12:00:00.250Z",
    "tenant": "t",
    "model": "f",
    "policy": {"id": "p", "version": "1", "digest": "sha256:0"},
    "trace": [{"backend": "hosted", "verdict": "admitted", "rule": "p/fallback"}],
    "backend": {
        "id": "hosted",
        "tier": "hosted",
        "kind": "hosted",
        "provider": "openai",
        "owner": "provider",
        "region": "eu",
        "retention": {"days": 0, "zero_data_retention": True, "training": False},
    },
    "fallback": None,
    "request_commitment": "0" * 64,
}
_COMPLETION: dict[str, Any] = {
    "v": 1,
    "type": "completion",
    "request_id": "req_000000000000000000000001",
    "time": "2026-01-31T12:00:00.250Z",
    "dispatch": {"index": 0, "hash": "0" * 64},
    "status": 200,
    "error": None,
    "usage": None,
    "latency_ms": 1,
    "response_commitment": None,
    "upstream": {"response_id": None, "request_ids": []},
}


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def test_records_before_the_fields_existed_still_parse_and_new_ones_are_checked() -> None:
    parse_record(_canonical(_DISPATCH))  # a log written before: no provider_model, no model
    parse_record(_canonical(_COMPLETION))
    parse_record(_canonical({**_DISPATCH, "provider_model": SENT}))
    upstream = {**_COMPLETION["upstream"], "model": "claude-3-5-sonnet@20240620"}
    parse_record(_canonical({**_COMPLETION, "upstream": upstream}))
    parse_record(_canonical({**_COMPLETION, "upstream": {**upstream, "model": None}}))
    for wrong in ("", 5, None):
        with pytest.raises(RecordError):
            parse_record(_canonical({**_DISPATCH, "provider_model": wrong}))
    for wrong_model in ("gpt 4o", "m" * 129, "", 5):
        with pytest.raises(RecordError):
            parse_record(
                _canonical({**_COMPLETION, "upstream": {**upstream, "model": wrong_model}})
            )
