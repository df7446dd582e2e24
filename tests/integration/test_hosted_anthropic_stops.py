"""An Anthropic answer is relayed as finished only for a stop reason that says it is
(gateway/upstream/anthropic_stops.py).

LiteLLM 1.108.7 maps a `stop_reason` it does not know to `"stop"`, and its stream parser
a `message_delta` whose `stop_reason` is null the same way: a turn Anthropic paused
(`pause_turn`: the client is to send the answer back to continue it) reached the client
as a complete answer, `[DONE]` and all, and its completion record said 200. Such an
answer is now unfinished: a stream ends with the gateway's error event (502
`upstream_error` in the record), a whole answer is 502. `model_context_window_exceeded`
(the context window, not `max_tokens`, ended the answer) is relayed as `length`, and the
reasons LiteLLM maps to what they mean as they were.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.provenance import commit
from gateway.serving import ServerThread
from tests.helpers.anthropic_mock import AnthropicMock
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    hosted_backend,
    logged_gateway,
)
from tests.helpers.log_truth import CHAT, ORIGIN, salt_of, sse_events, stream_receipt
from tests.helpers.provenance import completion_record

pytestmark = LITELLM_WARNINGS

KEY = "sk-ant-test"
WHOLE = {**CHAT, "stream": False}


def served(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stop_reason: str | None,
    doc: dict[str, Any],
    second: tuple[str | None] | None = None,
    pings: int = 0,
) -> httpx.Response:
    """What the client got for `doc` from Anthropic answering with `stop_reason` (and a
    second `message_delta` with `second`, when given; `pings` ping events after the
    first)."""
    mock = AnthropicMock(api_key=KEY, reply="one two three")
    mock.stop_reason = (stop_reason,)
    mock.second_stop_reason = second
    mock.pings_after_stop = pings
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    with ServerThread(mock) as provider:
        anthropic = hosted_backend(
            "hosted",
            provider.url,
            provider="anthropic",
            models=[{"name": "m", "provider_model": "anthropic/claude-mock-1"}],
        )
        gateway = logged_gateway(
            start_gateway,
            tmp_path,
            [anthropic],
            ORIGIN,
            environ={"HOSTED_KEY": KEY},
            policy={"paths": [str(tmp_path / "policies")]},
        )
        return httpx.post(
            f"{gateway.url}/v1/chat/completions", json=doc, headers=gateway.headers, timeout=60
        )


@pytest.mark.parametrize("stop_reason", ["pause_turn", None, "a_reason_from_next_year"])
def test_a_stream_anthropic_did_not_finish_is_broken_off(
    start_gateway: Callable[..., Gateway], tmp_path: Path, stop_reason: str | None
) -> None:
    response = served(start_gateway, tmp_path, stop_reason, CHAT)
    assert response.status_code == 200  # the headers went out with the first delta
    seen, error, _ = response.content.partition(b'data: {"error"')
    # Before: a `finish_reason: "stop"` chunk and `data: [DONE]`, recorded 200.
    assert error, response.content
    assert b"[DONE]" not in response.content
    assert b'"finish_reason":"' not in seen  # none but null
    last = json.loads(sse_events(response.content)[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_error"
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (502, "upstream_error")
    assert record["response_commitment"] == commit("response", salt, seen)


@pytest.mark.parametrize(
    ("first", "second"),
    [("end_turn", "max_tokens"), ("max_tokens", "end_turn"), ("pause_turn", "end_turn")],
)
def test_a_stream_whose_message_deltas_give_two_stop_reasons_is_broken_off(
    start_gateway: Callable[..., Gateway], tmp_path: Path, first: str, second: str
) -> None:
    # An honest stream gives one. Before: the first that ends the turn was relayed
    # (LiteLLM read no further), `[DONE]` and all, recorded 200.
    response = served(start_gateway, tmp_path, first, CHAT, second=(second,))
    assert response.status_code == 200  # the headers went out with the first delta
    seen, error, _ = response.content.partition(b'data: {"error"')
    assert error, response.content
    assert b"[DONE]" not in response.content
    assert b'"finish_reason":"' not in seen  # the finish is not relayed either
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (502, "upstream_error")
    assert record["response_commitment"] == commit("response", salt, seen)


@pytest.mark.parametrize(
    ("second", "pings"), [(("max_tokens",), 25), (None, 25), (("end_turn",), 25)]
)
def test_a_stream_that_goes_on_long_past_its_stop_reason_is_broken_off(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    second: tuple[str | None] | None,
    pings: int,
) -> None:
    # 25 pings (75 lines) between the stop reason and what follows it. Before: the parser
    # read on 64 lines and handed the finish on: `end_turn` then `max_tokens` was relayed
    # `stop`, `[DONE]` and all, recorded 200. An honest stream sends `message_stop` next.
    response = served(start_gateway, tmp_path, "end_turn", CHAT, second=second, pings=pings)
    assert response.status_code == 200  # the headers went out with the first delta
    seen, error, _ = response.content.partition(b'data: {"error"')
    assert error, response.content
    assert b"[DONE]" not in response.content
    assert b'"finish_reason":"' not in seen
    request_id, salt = salt_of(stream_receipt(response.content))
    record = completion_record(tmp_path / "log", request_id)
    assert (record["status"], record["error"]) == (502, "upstream_error")
    assert record["response_commitment"] == commit("response", salt, seen)


@pytest.mark.parametrize("pings", [1, 3])
def test_a_stream_with_pings_after_its_stop_reason_is_finished(
    start_gateway: Callable[..., Gateway], tmp_path: Path, pings: int
) -> None:
    response = served(start_gateway, tmp_path, "end_turn", CHAT, pings=pings)
    assert response.status_code == 200
    assert b"data: [DONE]" in response.content, response.content
    assert b'"finish_reason":"stop"' in response.content


@pytest.mark.parametrize("again", ["end_turn", None])
def test_a_stream_that_repeats_its_stop_reason_is_finished(
    start_gateway: Callable[..., Gateway], tmp_path: Path, again: str | None
) -> None:
    # The same reason again, or a null one after it, contradicts nothing.
    response = served(start_gateway, tmp_path, "end_turn", CHAT, second=(again,))
    assert response.status_code == 200
    assert b"data: [DONE]" in response.content, response.content
    assert b'"finish_reason":"stop"' in response.content


@pytest.mark.parametrize("stop_reason", ["pause_turn", "a_reason_from_next_year"])
def test_a_whole_answer_anthropic_did_not_finish_is_not_relayed(
    start_gateway: Callable[..., Gateway], tmp_path: Path, stop_reason: str
) -> None:
    response = served(start_gateway, tmp_path, stop_reason, WHOLE)
    assert response.status_code == 502, response.text  # before: 200, `"finish_reason": "stop"`
    assert response.json()["error"]["code"] == "upstream_error"
    assert "one two" not in response.text
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert (record["status"], record["response_commitment"]) == (502, None)


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("model_context_window_exceeded", "length"),
    ],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_finished_answer_is_relayed_with_what_ended_it(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    stop_reason: str,
    finish_reason: str,
    stream: bool,
) -> None:
    response = served(start_gateway, tmp_path, stop_reason, {**CHAT, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        assert b"[DONE]" in response.content
        assert f'"finish_reason":"{finish_reason}"'.encode() in response.content
        return
    assert response.json()["choices"][0]["finish_reason"] == finish_reason
    record = completion_record(tmp_path / "log", response.headers["x-request-id"])
    assert record["status"] == 200
