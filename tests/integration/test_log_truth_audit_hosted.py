"""An adversarial auditor's check of what the log says a client received: hosted
providers behind LiteLLM (a scripted OpenAI-compatible one, the Anthropic mock) and a
fallback to one. The commitment is over the OpenAI body the gateway encoded for the
client. See test_log_truth_audit.py for the check itself.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.audit_rig import (
    HOSTED_ANSWER,
    HOSTED_ASK,
    HOSTED_END,
    HOSTED_EVENT,
    HOSTED_N2,
    HOSTED_TOOL,
    HOSTED_USAGE,
    JSON,
    assert_logged_as_received,
    chunked,
    client_gets,
    hosted_gateway,
    logged,
    request_log,
    whole_answer,
    writes,
)
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
from tests.helpers.independent_audit import log_records
from tests.helpers.log_truth import DONE
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS

HOSTED: dict[str, tuple[tuple[bytes, ...], dict[str, Any]]] = {
    "stream": (chunked(HOSTED_EVENT, HOSTED_END, HOSTED_USAGE, DONE), HOSTED_ASK),
    "stream-usage-asked": (
        chunked(HOSTED_EVENT, HOSTED_END, HOSTED_USAGE, DONE),
        {**HOSTED_ASK, "stream_options": {"include_usage": True}},
    ),
    "stream-tools": (
        chunked(HOSTED_EVENT, HOSTED_TOOL, HOSTED_END, HOSTED_USAGE, DONE),
        {**HOSTED_ASK, "stream_options": {"include_usage": True}},
    ),
    # Refused unsent (tests/integration/test_hosted_stream_choices.py): a refusal record.
    "stream-n2-refused": (
        chunked(HOSTED_EVENT, HOSTED_N2, HOSTED_TOOL, HOSTED_END, HOSTED_USAGE, DONE),
        {**HOSTED_ASK, "n": 2, "stream_options": {"include_usage": True}},
    ),
    "stream-malformed": (chunked(HOSTED_EVENT, b"data: {not json\n\n", DONE), HOSTED_ASK),
    "stream-done-missing": (chunked(HOSTED_EVENT, HOSTED_END), HOSTED_ASK),
    "stream-dies": (chunked(HOSTED_EVENT, last=False), HOSTED_ASK),
    "whole": ((whole_answer(200, HOSTED_ANSWER, JSON),), {**HOSTED_ASK, "stream": False}),
    "whole-no-usage": (
        (whole_answer(200, HOSTED_ANSWER.split(b',"usage"')[0] + b"}", JSON),),
        {**HOSTED_ASK, "stream": False},
    ),
    "stream-no-usage-asked": (
        chunked(HOSTED_EVENT, HOSTED_END, DONE),
        {**HOSTED_ASK, "stream_options": {"include_usage": True}},
    ),
    "whole-gzip": (
        (whole_answer(200, gzip.compress(HOSTED_ANSWER), JSON, b"content-encoding: gzip"),),
        {**HOSTED_ASK, "stream": False},
    ),
    "whole-400": ((whole_answer(400, b'{"error":{"message":"bad"}}', JSON),), HOSTED_ASK),
    "whole-500": ((whole_answer(500, b'{"error":{"message":"down"}}', JSON),), HOSTED_ASK),
}


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
    raw = start_raw(writes(*pieces))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    received = client_gets(gateway, ask)
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


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
        gateway, vkey = logged(
            start_gateway,
            tmp_path,
            [anthropic_backend("claude", server.url)],
            environ={"MOCK_ANTHROPIC_KEY": "sk-mock"},
            policy={"paths": [str(tmp_path / "policies")]},
        )
        ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        received = client_gets(gateway, {**ask, "stream": stream})
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


def test_a_fallback_to_a_hosted_provider_is_logged_as_what_the_client_got(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The private backend answers 503, the policy falls back to a hosted provider: the
    receipt names the hosted dispatch, whose completion is the request's last record."""
    down = start_raw(writes(whole_answer(503, b"")))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway, vkey = logged(
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
        received = client_gets(gateway, {**ask, "stream": stream})
        assert received.status == 200, received.body
        assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
        request_id = received.headers["x-request-id"]
        mine = [json.loads(e) for e in log_records(tmp_path / "log", vkey)]
        kinds = [r["type"] for r in mine if r["request_id"] == request_id]
        assert kinds == ["dispatch", "completion"] * 2, kinds  # the 503, then the provider


def _text_chunk(choices: bytes) -> bytes:
    return (
        b'data: {"id":"cmpl-x","object":"text_completion","created":1,"model":"f","choices":%s}\n\n'
        % choices
    )


TEXT_EVENT = _text_chunk(b'[{"index":0,"text":"hi","finish_reason":null}]')
TEXT_END = _text_chunk(b'[{"index":0,"text":"","finish_reason":"stop"}]')
TEXT_ASK = {"model": "f", "prompt": "hi", "stream": True}
EMBEDDINGS = (
    b'{"object":"list","model":"f","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}'
)
NO_USAGE: dict[str, tuple[tuple[bytes, ...], dict[str, Any], str]] = {
    "completions-stream-usage-asked": (
        chunked(TEXT_EVENT, TEXT_END, DONE),
        {**TEXT_ASK, "stream_options": {"include_usage": True}},
        "/v1/completions",
    ),
    "completions-stream": (chunked(TEXT_EVENT, TEXT_END, DONE), TEXT_ASK, "/v1/completions"),
    "completions-stream-unfinished": (chunked(TEXT_EVENT, DONE), TEXT_ASK, "/v1/completions"),
    "embeddings": (
        (whole_answer(200, EMBEDDINGS, JSON),),
        {"model": "f", "input": "hi"},
        "/v1/embeddings",
    ),
}


@pytest.mark.parametrize("case", list(NO_USAGE))
def test_usage_a_provider_did_not_report_is_neither_shown_nor_recorded(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """The provider reports no usage. LiteLLM then makes its own up: for a text
    completion stream a count of its own (its usage chunk, a client that asked for usage
    was shown it, and the record stated it as the provider's: the gateway looked for that
    count on the chat stream LiteLLM wraps, which it did not find in the generator a text
    completion stream holds), for embeddings zeros (kept in the answer, so the record said
    the provider reported 0 tokens). Neither is the provider's: the client is shown no
    usage and the record says none (docs/provenance.md, the completion's `usage`)."""
    pieces, ask, path = NO_USAGE[case]
    raw = start_raw(writes(*pieces))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    received = client_gets(gateway, ask, path)
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    shown = received.body.split(b": owngate-receipt ")[0]
    assert b'"usage"' not in shown, shown
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert completion["type"] == "completion" and completion["usage"] is None, completion
    assert completion["status"] == (502 if case.endswith("unfinished") else 200)


def test_usage_is_not_believed_where_litellms_stream_wrapper_is_not_found(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A text completion stream's wrapper, which alone tells LiteLLM's count of the
    tokens from the provider's usage, is read from LiteLLM's generators
    (hosted_stream.py `_wrapper`). A LiteLLM that holds it one generator deeper, or under
    another name, hid it: LiteLLM's count then went to the client and the record as the
    provider's (the lookup failed open). Now usage on a stream whose wrapper is not found
    is not believed: none is shown or recorded."""
    import litellm.main

    streaming: Callable[..., Any] = litellm.main._async_streaming

    async def deeper(**kwargs: Any) -> Any:  # one generator more, `response` not a local
        async for line in streaming(**kwargs):
            yield line

    monkeypatch.setattr(litellm.main, "_async_streaming", deeper)
    raw = start_raw(writes(*chunked(TEXT_EVENT, TEXT_END, DONE)))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    ask = {**TEXT_ASK, "stream_options": {"include_usage": True}}
    received = client_gets(gateway, ask, "/v1/completions")
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    shown = received.body.split(b": owngate-receipt ")[0]
    assert b'"usage"' not in shown, shown
    assert b'"finish_reason":"stop"' in shown and shown.endswith(DONE), shown
    completion = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])[-1]
    assert (completion["status"], completion["usage"]) == (200, None), completion
