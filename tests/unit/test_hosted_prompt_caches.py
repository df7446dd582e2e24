"""A client cannot have a hosted provider keep its prompt as a cache
(gateway/upstream/hosted_fields.py): `cache_control` anywhere LiteLLM reads it and a
`prompt_cache_retention` past in-memory are refused naming where they are; checked
without LiteLLM or a network."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.hosted_fields import RefusedField, refuse_provider_actions

USER = {"role": "user", "content": "hi"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
FUNCTION = {"name": "f", "parameters": {"type": "object"}}


def text(**more: Any) -> dict[str, Any]:
    return {"type": "text", "text": "long document", **more}


def refused(doc: dict[str, Any]) -> RefusedField:
    with pytest.raises(RefusedField) as caught:
        refuse_provider_actions({"model": "m", **doc})
    return caught.value


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        # Anthropic's one-hour cache on a content part (LiteLLM forwards it as written).
        ({"messages": [{"role": "user", "content": [text(cache_control=HOUR)]}]},
         "messages[0].content[0].cache_control"),
        # The default five minutes is a cache all the same; so is Gemini's, made a stored
        # `cachedContents` resource for as long as the `ttl` says.
        ({"messages": [USER, {"role": "system", "content": [
            text(cache_control={"type": "ephemeral"})]}]},
         "messages[1].content[0].cache_control"),
        ({"messages": [{"role": "user", "content": [text(cache_control={
            "type": "ephemeral", "ttl": "87600h"})]}]},
         "messages[0].content[0].cache_control"),
        # On the message itself (LiteLLM's injection points), on a tool result, on a call.
        ({"messages": [{**USER, "cache_control": HOUR}]}, "messages[0].cache_control"),
        ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "cache_control": HOUR,
             "function": {"name": "f", "arguments": "{}"}}]}]},
         "messages[1].tool_calls[0].cache_control"),
        # Inside a part's own object, and Bedrock's spelling.
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {
            "file_data": "data:application/pdf;base64,AA==", "cache_control": HOUR}}]}]},
         "messages[0].content[0].file.cache_control"),
        ({"messages": [{"role": "user", "content": [text(cachePoint={"type": "default"})]}]},
         "messages[0].content[0].cachePoint"),
        # A tool and its definition (LiteLLM's Anthropic adapter reads both).
        ({"messages": [USER], "tools": [{"type": "function", "function": FUNCTION,
                                         "cache_control": HOUR}]},
         "tools[0].cache_control"),
        ({"messages": [USER], "tools": [{"type": "function", "function": FUNCTION},
                                        {"type": "function",
                                         "function": {**FUNCTION, "cache_control": HOUR}}]},
         "tools[1].function.cache_control"),
        # The request's own (Anthropic's automatic caching), and OpenAI's extended cache.
        ({"messages": [USER], "cache_control": HOUR}, "cache_control"),
        ({"messages": [USER], "prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ],
)  # fmt: skip
def test_a_prompt_cache_is_refused_naming_where_it_was_asked(
    doc: dict[str, Any], param: str
) -> None:
    error = refused(doc)
    assert error.param == param
    assert "cache" in str(error) and "87600h" not in str(error) and "ephemeral" not in str(error)


def test_a_marker_under_a_key_of_the_clients_own_names_only_the_message() -> None:
    # The path names structure; a key the client made up is its text, never repeated.
    odd = "\x1b[2Kok: \u202e" + "k" * 500
    part = text(**{odd: {"cache_control": HOUR}})
    assert refused({"messages": [USER, {"role": "user", "content": [part]}]}).param == (
        "messages[1]"
    )
    deep: dict[str, Any] = {"cache_control": HOUR}
    for _ in range(10_000):  # deeper than any stack: the walk is iterative
        deep = {"x": [deep]}
    assert refused({"messages": [{**USER, "extra": deep}]}).param == "messages[0]"


@pytest.mark.parametrize(
    "doc",
    [
        {"messages": [USER]},
        {"messages": [{"role": "user", "content": [text(cache_control=None)]}]},
        {"messages": [{**USER, "cache_control": None}], "cache_control": None},
        {"messages": [USER], "prompt_cache_retention": "in_memory"},
        {"messages": [USER], "prompt_cache_retention": None},
        # Only routes to a cache: nothing kept longer.
        {"messages": [USER], "prompt_cache_key": "tenant-a"},
        # A JSON schema's property may be called `cache_control`: it is the client's
        # function signature, not a marker (LiteLLM does not read it there).
        {"messages": [USER], "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "cache_control": {"type": "string"}}}}}]},
        # The text of a message is not walked as structure.
        {"messages": [{"role": "user", "content": '{"cache_control": {"ttl": "1h"}}'}]},
    ],
)  # fmt: skip
def test_requests_that_ask_for_no_cache_pass(doc: dict[str, Any]) -> None:
    refuse_provider_actions({"model": "m", **doc})


# A router in Go behind a `kind: openai` backend (encoding/json) matches names without
# regard to case: `"Cache_Control"` in a content part is a prompt cache to it. Before, the
# markers were read in their exact case only inside messages and tools, so these passed.
@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a",
                                                     "Cache_Control": HOUR}]}]},
         "messages[0].content[0].cache_control"),
        ({"messages": [{**USER, "CACHE_CONTROL": HOUR}]}, "messages[0].cache_control"),
        ({"messages": [{"role": "user", "content": [text(cachepoint={"type": "default"})]}]},
         "messages[0].content[0].cachePoint"),
        ({"messages": [USER], "tools": [{"type": "function", "function": {
            **FUNCTION, "Cache_control": HOUR}}]},
         "tools[0].function.cache_control"),
        ({"messages": [USER], "tools": [{"type": "function", "function": FUNCTION,
                                         "CachePoint": {"type": "default"}}]},
         "tools[0].cachePoint"),
    ],
)  # fmt: skip
def test_a_marker_in_another_case_is_refused_as_the_marker(doc: dict[str, Any], param: str) -> None:
    error = refused(doc)
    assert error.param == param
    assert "Cache_" not in str(error) and "CACHE" not in str(error)


def test_a_null_marker_in_another_case_passes() -> None:
    refuse_provider_actions({"model": "m", "messages": [{**USER, "Cache_Control": None}]})
