"""A hosted stream of several choices (`n` > 1) is refused before it is sent: LiteLLM
relays it with one finish reason, so neither the client nor the record could tell a
choice the provider cut short from a finished one.

LiteLLM 1.108.7's stream wrapper reads the finish reason of a chunk's first choice only,
whichever choice that is, keeps the first it meets and ends the stream with it on index 0
(`CustomStreamWrapper.finish_reason_handler`): the other choices never get theirs. So a
provider that finished choice 0 and closed the connection in the middle of choice 1 was
relayed as a whole answer (`data: [DONE]`), and its completion record said 200, the
status of an answer read to its end. A whole answer of several choices is relayed as the
provider sent it, and still served.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.helpers.audit_rig import (
    HOSTED_ASK,
    HOSTED_EVENT,
    HOSTED_N2,
    JSON,
    assert_logged_as_received,
    chunked,
    client_gets,
    hosted_gateway,
    openai_chunk,
    request_log,
    whole_answer,
    writes,
)
from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS

# Choice 0 finished; choice 1 cut in its middle: no finish reason for it, no `[DONE]`.
FIRST_FINISHED = openai_chunk(b'[{"index":0,"delta":{},"finish_reason":"stop"}]')
CUT_IN_CHOICE_1 = chunked(HOSTED_EVENT, HOSTED_N2, FIRST_FINISHED)
TWO_CHOICES = (
    b'{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"f","choices":['
    b'{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"},'
    b'{"index":1,"message":{"role":"assistant","content":"yo"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}'
)


def test_a_stream_of_several_choices_is_refused_unsent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    posts: list[bytes] = []
    cut = writes(*CUT_IN_CHOICE_1)

    async def provider(writer, post):  # type: ignore[no-untyped-def]
        posts.append(post.body)
        return await cut(writer, post)

    raw = start_raw(provider)
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, raw.url)
    received = client_gets(gateway, {**HOSTED_ASK, "n": 2})
    # Before: 200, both choices' text and `data: [DONE]`, recorded 200 as read whole.
    assert b"[DONE]" not in received.body
    assert received.status == 400, (received.status, received.body)
    error = json.loads(received.body)["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", "n")
    assert "not sent" in error["message"]
    assert posts == []  # nothing reached the provider
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    records = request_log(tmp_path / "log", vkey, received.headers["x-request-id"])
    assert [r["type"] for r in records] == ["refusal"]


def test_a_whole_answer_of_several_choices_is_served_as_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    whole = start_raw(writes(whole_answer(200, TWO_CHOICES, JSON)))
    gateway, vkey = hosted_gateway(start_gateway, tmp_path, whole.url)
    received = client_gets(gateway, {**HOSTED_ASK, "n": 2, "stream": False})
    assert received.status == 200, received.body
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    choices = json.loads(received.body)["choices"]
    assert [c["finish_reason"] for c in choices] == ["stop", "length"]
