"""What LiteLLM's adapters would make of a hosted request in the gateway's process is
bounded before they run: JSON Schema `$ref`s (gateway/upstream/schema_refs.py; its
Gemini, Vertex AI and Bedrock adapters copy each referenced definition in, unbounded, so
definitions that each refer to the next twice expanded to 2**n copies) and tool results
times the calls they are searched among (gateway/upstream/openai_messages.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_messages import MAX_SYSTEM_MOVES, MAX_TOOL_LOOKUPS
from gateway.upstream.openai_request import request_params
from gateway.upstream.schema_refs import MAX_INLINED, MAX_REF_DEPTH, check_schema_refs

MESSAGES = [{"role": "user", "content": "hi"}]


def doubling(depth: int, key: str = "$defs") -> dict[str, Any]:
    """A schema of `depth` definitions, each referring to the next one twice: 2**depth
    copies of the last once every reference is inlined."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/{key}/d{i + 1}"}, "b": {"$ref": f"#/{key}/d{i + 1}"}},
        }
        for i in range(depth)
    }
    defs[f"d{depth}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": f"#/{key}/d0"}}, key: defs}


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


BOMBS: dict[str, dict[str, Any]] = {
    "tools": {"tools": [tool(doubling(30))]},
    "tools-definitions": {"tools": [tool(doubling(30, "definitions"))]},
    "functions": {"functions": [{"name": "f", "parameters": doubling(30)}]},
    "response_format": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": doubling(30)},
        }
    },
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_references_that_would_expand_past_the_bound_are_refused_naming_the_field(
    case: str,
) -> None:
    doc: dict[str, Any] = {"model": "m", "messages": MESSAGES, **BOMBS[case]}
    with pytest.raises(InvalidField) as refused:
        request_params("chat", doc)
    assert refused.value.param == next(iter(BOMBS[case]))
    assert "$ref" in str(refused.value)


def test_the_bound_is_on_what_would_be_inlined() -> None:
    # 2**14 copies of the last definition and as many of the others: past the bound;
    # 2**10: some 4,000 values, well within it.
    with pytest.raises(InvalidField):
        check_schema_refs({"tools": [tool(doubling(14))]})
    check_schema_refs({"tools": [tool(doubling(10))]})


def test_references_nested_past_the_depth_bound_are_refused() -> None:
    chain: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(MAX_REF_DEPTH + 1)
    }
    chain[f"d{MAX_REF_DEPTH + 1}"] = {"type": "string"}
    schema = {"$ref": "#/$defs/d0", "$defs": chain}
    with pytest.raises(InvalidField):
        check_schema_refs({"tools": [tool(schema)]})
    del chain[f"d{MAX_REF_DEPTH - 1}"]["properties"]  # 32 references deep: within it
    check_schema_refs({"tools": [tool(schema)]})


def test_a_generated_schema_and_a_self_reference_pass() -> None:
    # What pydantic makes of a model that nests others, one of them recursive: each
    # reference inlined once, a cycle left as a reference (as LiteLLM leaves it).
    schema = {
        "$defs": {
            "Address": {"type": "object", "properties": {"city": {"type": "string"}}},
            "Node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            },
        },
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "work": {"$ref": "#/$defs/Address"},
            "tree": {"$ref": "#/$defs/Node"},
        },
    }
    params = request_params("chat", {"model": "m", "messages": MESSAGES, "tools": [tool(schema)]})
    assert params["tools"][0]["function"]["parameters"] == schema


def test_a_large_schema_without_references_is_not_counted() -> None:
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(MAX_INLINED)},
    }
    check_schema_refs({"tools": [tool(wide)]})


def test_openapi_component_schemas_are_definitions_too() -> None:
    # LiteLLM's Anthropic and Fireworks adapters inline `#/components/schemas/...` (within
    # a 10 MB budget per tool: 14 doublings held its CPU 1 s a tool, none refused).
    schema = doubling(14)
    defs = schema.pop("$defs")
    for definition in defs.values():
        for ref in definition.get("properties", {}).values():
            ref["$ref"] = ref["$ref"].replace("$defs", "components/schemas")
    schema["properties"]["x"]["$ref"] = "#/components/schemas/d0"
    schema["components"] = {"schemas": defs}
    with pytest.raises(InvalidField):
        check_schema_refs({"tools": [tool(schema)]})


def test_the_siblings_of_a_reference_inside_a_copy_are_counted() -> None:
    # LiteLLM copies a definition whole, a `$ref`'s siblings with it, before it replaces
    # the reference: 10,000 values beside one, in a definition referred to 1,000 times,
    # held its CPU 2 s (a 61 KB body); counted, they are past the bound.
    pad: dict[str, Any] = {"$ref": "#/$defs/leaf", "pad": [0] * 10_000}
    schema = {
        "type": "object",
        "$defs": {
            "padded": {"type": "object", "properties": {"x": pad}},
            "leaf": {"type": "string"},
        },
        "properties": {f"p{i}": {"$ref": "#/$defs/padded"} for i in range(1_000)},
    }
    with pytest.raises(InvalidField):
        check_schema_refs({"tools": [tool(schema)]})
    # Beside a reference outside any copy nothing is copied: not counted.
    outside = {"type": "object", "$defs": {"leaf": {"type": "string"}}, "properties": {"x": pad}}
    check_schema_refs({"tools": [tool(outside)]})
    # A handful of such references: within the bound.
    schema["properties"] = {f"p{i}": {"$ref": "#/$defs/padded"} for i in range(4)}
    check_schema_refs({"tools": [tool(schema)]})


def calls_and_results(calls: int, results: int) -> list[dict[str, Any]]:
    """A user turn, an assistant turn of `calls` tool calls, then `results` tool results."""
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            for i in range(calls)
        ],
    }
    tool = [{"role": "tool", "tool_call_id": f"c{i}", "content": "x"} for i in range(results)]
    return [*MESSAGES, assistant, *tool]


def test_tool_results_times_the_calls_they_are_searched_among_are_bounded() -> None:
    # LiteLLM's Gemini adapter searches the latest assistant's calls for each result's id.
    with pytest.raises(InvalidField) as refused:
        request_params(
            "chat", {"model": "m", "messages": calls_and_results(1025, MAX_TOOL_LOOKUPS // 1024)}
        )
    assert refused.value.param == "messages"
    results = MAX_TOOL_LOOKUPS // 1024  # at the bound: within it
    request_params("chat", {"model": "m", "messages": calls_and_results(1024, results)})


def distinct_calls(first: int, count: int) -> list[dict[str, Any]]:
    """`count` tool calls, each of its own name (LiteLLM's Gemini adapter drops a call
    equal to one before it, compared with every part of the turn before it)."""
    return [
        {"id": f"c{i}", "type": "function", "function": {"name": f"f{i}", "arguments": "{}"}}
        for i in range(first, first + count)
    ]


def test_tool_calls_times_the_parts_of_their_run_of_assistant_messages_are_bounded() -> None:
    # 1,025 calls in one message: each compared with those before it, past the bound.
    one = {"role": "assistant", "content": None, "tool_calls": distinct_calls(0, 1025)}
    with pytest.raises(InvalidField) as refused:
        request_params("chat", {"model": "m", "messages": [*MESSAGES, one]})
    assert refused.value.param == "messages"
    assert "tool calls times the parts" in str(refused.value)
    one["tool_calls"] = distinct_calls(0, 1024)  # at the bound: within it
    request_params("chat", {"model": "m", "messages": [*MESSAGES, one]})
    # A run of text-only assistant messages merged into the same turn counts too.
    texts = [{"role": "assistant", "content": "t"} for _ in range(2_000)]
    calls = {"role": "assistant", "content": None, "tool_calls": distinct_calls(0, 500)}
    with pytest.raises(InvalidField):
        request_params("chat", {"model": "m", "messages": [*MESSAGES, *texts, calls]})
    # Broken by a user turn, the text is another turn's: only the calls' own count.
    runs = [*MESSAGES, *texts, *MESSAGES, calls]
    request_params("chat", {"model": "m", "messages": runs})
    # The adapter takes system messages out first: they end no run (1,500 messages of one
    # call each, each after a system or developer one, are one run: 1.1 million).
    for between in ("system", "developer"):
        split = [
            item
            for i in range(1_500)
            for item in (
                {"role": "assistant", "content": None, "tool_calls": distinct_calls(i, 1)},
                {"role": between, "content": "s"},
            )
        ]
        with pytest.raises(InvalidField):
            request_params("chat", {"model": "m", "messages": [*MESSAGES, *split]})
    # Runs add up: two of 800 calls each are 1.28 million comparisons.
    halves = [
        {"role": "assistant", "content": None, "tool_calls": distinct_calls(k * 800, 800)}
        for k in range(2)
    ]
    with pytest.raises(InvalidField):
        request_params(
            "chat", {"model": "m", "messages": [*MESSAGES, halves[0], *MESSAGES, halves[1]]}
        )


def test_messages_times_the_system_messages_before_them_are_bounded() -> None:
    # LiteLLM's Gemini adapter takes each system message out of the list (`pop`), moving
    # every message after it: 130,000 of each (a 9 MB body) held its CPU 0.9 s, four times
    # that for twice as many.
    systems = [{"role": "system", "content": "s"}] * (1 << 14)
    users = [{"role": "user", "content": "u"}] * ((MAX_SYSTEM_MOVES >> 14) + 1)
    with pytest.raises(InvalidField) as refused:
        request_params("chat", {"model": "m", "messages": [*systems, *users]})
    assert refused.value.param == "messages"
    assert "system messages before them" in str(refused.value)
    # At the bound: within it; and system messages after the others move none of them.
    request_params("chat", {"model": "m", "messages": [*systems, *users[1:]]})
    request_params("chat", {"model": "m", "messages": [*users, *systems]})
