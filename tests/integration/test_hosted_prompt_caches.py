"""A client cannot lengthen how long a hosted provider keeps its prompt: a prompt cache it
asks for is refused on the hosted attempt, before LiteLLM is called
(gateway/upstream/hosted_fields.py).

The policy admits the Anthropic mock for its declared zero-day, zero-data-retention
terms. LiteLLM forwards `cache_control` to Anthropic as written, so `{"type":
"ephemeral", "ttl": "1h"}` on a content part had the provider keep the prompt an hour;
`prompt_cache_retention: "24h"` (OpenAI's day-long cache) was dropped without a word.
Now both are 400 naming where they were, the provider gets nothing and the signed log
says so: no dispatch record (nothing was sent), a refusal record with the 400 the client
got; the same request without the marker is served, and what reaches the provider
carries no cache marker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.upstream.litellm_runtime import load_litellm
from tests.helpers.anthropic_stack import Stack, anthropic_stack, chat
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
)
from tests.helpers.provenance import request_records

pytestmark = LITELLM_WARNINGS

HOUR = {"type": "ephemeral", "ttl": "1h"}
DOCUMENT = {"type": "text", "text": "a long contract to keep for an hour"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with anthropic_stack(tmp_path_factory.mktemp("retention"), "test.owngate/retention") as served:
        yield served


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": user({**DOCUMENT, "cache_control": HOUR})},
         "messages[0].content[0].cache_control"),
        ({"messages": [{"role": "system", "content": [{**DOCUMENT, "cache_control": HOUR}]},
                       {"role": "user", "content": "hi"}]},
         "messages[0].content[0].cache_control"),
        ({"messages": user(DOCUMENT), "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object"}, "cache_control": HOUR}}]},
         "tools[0].function.cache_control"),
        ({"messages": user(DOCUMENT), "prompt_cache_retention": "24h"},
         "prompt_cache_retention"),
    ],
)  # fmt: skip
def test_a_prompt_cache_is_refused_and_the_provider_gets_nothing(
    stack: Stack, fields: dict[str, Any], param: str
) -> None:
    refused = chat(stack, **fields)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "upstream_bad_request",
        param,
    )
    assert "not sent" in error["message"] and "keep the prompt" in error["message"]
    assert stack.anthropic.received == []
    request_id = refused.headers["x-request-id"]
    (refusal,) = request_records(stack.log, request_id, "refusal")
    assert (refusal["reason"], refusal["rule"]) == (
        "upstream_bad_request",
        "owngate/hosted_request",
    )
    assert {r["type"] for r in request_records(stack.log, request_id)} == {"refusal"}


def test_the_same_request_without_a_cache_is_served_without_one(stack: Stack) -> None:
    answer = chat(
        stack,
        messages=user({**DOCUMENT, "cache_control": None}),
        prompt_cache_retention="in_memory",
    )
    assert answer.status_code == 200, answer.text
    (received,) = stack.anthropic.received
    assert "cache_control" not in str(received.body)
    assert received.body["messages"][0]["content"][0]["text"] == DOCUMENT["text"]


def test_litellm_makes_no_context_cache_of_a_marked_message() -> None:
    # Behind the refusal: LiteLLM as the gateway configures it never reads a marker as
    # a Gemini/Vertex context cache to create (a stored resource with the client's ttl).
    litellm = load_litellm()
    marked = {"role": "user", "content": [{**DOCUMENT, "cache_control": HOUR}]}
    assert litellm.utils.is_cached_message(marked) is False
