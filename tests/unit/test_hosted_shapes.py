"""The request shapes a hosted call forwards (gateway/upstream/openai_shapes.py), table-driven:
each malformed shape is `InvalidField` naming the field, each documented shape passes.

Every malformed shape here made LiteLLM 1.108.7 raise before sending (`TypeError`,
`KeyError`, `AttributeError` wrapped as its `APIConnectionError`, 500, for the Anthropic,
OpenAI or Gemini adapter: read as the provider failing, 502/503 and the next backend
tried), or was sent on to the provider as it came. No LiteLLM, no network.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_request import request_params
from tests.helpers.hosted_shapes import CALL, CANARY, USER, VALID_CHAT, chat, mutated, user

PARAMETERS = "tools[0].function.parameters"


def tool(parameters: Any) -> dict[str, Any]:
    """A function tool `f` with these `parameters`."""
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def after_assistant(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, message]


MALFORMED_CHAT: list[tuple[dict[str, Any], str]] = [
    (chat(tool_choice="function"), "tool_choice"),
    (chat(tool_choice=CANARY), "tool_choice"),
    (chat(tool_choice={"type": "function"}), "tool_choice.function"),
    (chat(tool_choice={"type": "function", "function": "f"}), "tool_choice.function"),
    (chat(tool_choice={"type": "function", "function": {"name": 5}}), "tool_choice.function"),
    (chat(tool_choice={"function": {"name": "f"}}), "tool_choice.type"),
    (chat(tool_choice={}), "tool_choice.type"),
    (chat(tool_choice={"type": "custom"}), "tool_choice.custom"),
    (chat(tool_choice={"type": "allowed_tools", "allowed_tools": 1}), "tool_choice.allowed_tools"),
    (chat(messages=user({"type": "text", "text": 5})), "messages[0].content[0].text"),
    (chat(messages=user({"type": "text"})), "messages[0].content[0].text"),
    (
        chat(messages=user({"type": "image_url", "image_url": 1})),
        "messages[0].content[0].image_url",
    ),
    (chat(messages=user({"type": "image_url"})), "messages[0].content[0].image_url"),
    (
        chat(messages=user({"type": "image_url", "image_url": {"url": 5}})),
        "messages[0].content[0].image_url",
    ),
    (
        chat(messages=user({"type": "image_url", "image_url": {"url": "data:,", "detail": 5}})),
        "messages[0].content[0].image_url.detail",
    ),
    (
        chat(messages=user({"type": "video_url", "video_url": 1})),
        "messages[0].content[0].video_url",
    ),
    (
        chat(messages=user({"type": "input_audio", "input_audio": 1})),
        "messages[0].content[0].input_audio",
    ),
    (
        chat(messages=user({"type": "input_audio", "input_audio": {"data": 5, "format": "wav"}})),
        "messages[0].content[0].input_audio",
    ),
    (chat(messages=user({"type": "file", "file": 1})), "messages[0].content[0].file"),
    (chat(messages=user({"type": "file", "file": {}})), "messages[0].content[0].file"),
    (
        chat(messages=user({"type": "file", "file": {"file_data": 5}})),
        "messages[0].content[0].file.file_data",
    ),
    (
        chat(messages=[{"role": "system", "content": [{"type": "text", "text": 5}]}]),
        "messages[0].content[0].text",
    ),
    (
        chat(messages=[USER, {"role": "assistant", "content": [{"type": "refusal"}]}]),
        "messages[1].content[0].refusal",
    ),
    (chat(messages=[{**USER, "name": 5}]), "messages[0].name"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": 5}]), "messages[1].tool_calls"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [5]}]), "messages[1].tool_calls[0]"),
    (
        chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "id": 5}]}]),
        "messages[1].tool_calls[0]",
    ),
    (
        chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "function": 5}]}]),
        "messages[1].tool_calls[0].function",
    ),
    (
        chat(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}],
                },
            ]
        ),
        "messages[1].tool_calls[0].function",
    ),
    (
        chat(messages=[USER, {"role": "assistant", "content": None, "function_call": {}}]),
        "messages[1].function_call",
    ),
    (chat(messages=after_assistant({"role": "tool", "content": "x"})), "messages[2].tool_call_id"),
    (
        chat(messages=after_assistant({"role": "tool", "content": "x", "tool_call_id": 5})),
        "messages[2].tool_call_id",
    ),
    (chat(messages=[USER, {"role": "function", "content": "x"}]), "messages[1].name"),
    (chat(tools=[5]), "tools[0]"),
    (chat(tools=[{"type": "function"}]), "tools[0].function"),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]),
        "tools[0].function.parameters",
    ),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters",
    ),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "description": 5}}]),
        "tools[0].function.description",
    ),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
        "tools[0].function.strict",
    ),
    (
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": 5}},
                }
            ]
        ),
        "tools[0].function.parameters.properties",
    ),
    # Null where the JSON Schema needs an object (or an array): OpenAI refuses it; it was
    # sent on to the provider (or broke an adapter that walks the schema).
    (chat(tools=[tool({"type": "object", "properties": None})]), f"{PARAMETERS}.properties"),
    (chat(tools=[tool({"type": "object", "properties": {"a": None}})]), f"{PARAMETERS}.properties"),
    (chat(tools=[tool({"type": "object", "properties": {"a": 5}})]), f"{PARAMETERS}.properties"),
    (chat(tools=[tool({"type": "object", "required": None})]), f"{PARAMETERS}.required"),
    (chat(tools=[tool(None)]), PARAMETERS),
    (chat(functions=[{"name": "f", "parameters": None}]), "functions[0].parameters"),
    (
        chat(functions=[{"name": "f", "parameters": {"properties": None}}]),
        "functions[0].parameters.properties",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": None}}),
        "response_format.json_schema.schema",
    ),
    (
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"properties": None}},
            }
        ),
        "response_format.json_schema.schema.properties",
    ),
    (chat(tools=[{"type": "custom"}]), "tools[0].custom"),
    (chat(tools=[{"type": "custom", "custom": 5}]), "tools[0].custom"),
    (chat(functions=[{"name": "f", "parameters": 5}]), "functions[0].parameters"),
    (chat(functions=[{"name": "f"}], function_call="any"), "function_call"),
    (chat(functions=[{"name": "f"}], function_call={"name": 5}), "function_call"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (
        chat(response_format={"type": "json_schema", "json_schema": 5}),
        "response_format.json_schema",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}),
        "response_format.json_schema.schema",
    ),
    (chat(modalities=[5]), "modalities"),
    (chat(logit_bias={"50256": "ban"}), "logit_bias"),
    (chat(logit_bias={"50256": True}), "logit_bias"),
]


@pytest.mark.parametrize(("doc", "param"), MALFORMED_CHAT)
def test_a_malformed_chat_shape_is_refused_naming_its_field(
    doc: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidField) as refused:
        request_params("chat", doc)
    assert refused.value.param == param
    assert CANARY not in str(refused.value)  # the field is named, its value never repeated


def test_a_role_of_the_clients_own_is_never_repeated() -> None:
    # A part without a string `type` under a role the API does not have: the message
    # named the role, the client's string of any length (100 KB here), in the 400.
    role = CANARY * 5000
    with pytest.raises(InvalidField) as refused:
        request_params("chat", chat(messages=[{"role": role, "content": [5]}]))
    assert refused.value.param == "messages[0].content[0]"
    assert CANARY not in str(refused.value) and len(str(refused.value)) < 200


@pytest.mark.parametrize(
    ("endpoint", "field", "value"),
    [
        ("completions", "prompt[1]", [5, "a"]),
        ("completions", "prompt[0]", [{"a": 1}]),
        ("completions", "prompt", []),
        ("completions", "prompt[0]", [None]),
        ("completions", "prompt[0]", [1.5]),
        ("completions", "prompt[0]", [True]),
        ("completions", "prompt[1]", [[1], []]),
        ("completions", "prompt[1]", [[1], 2]),
        ("embeddings", "input[1]", [1, "a"]),
        ("embeddings", "input[0]", [[1.5]]),
        ("embeddings", "input[0]", [{}]),
        ("embeddings", "input", []),
        ("embeddings", "input[0]", [None]),
    ],
)
def test_a_malformed_prompt_or_input_is_refused(endpoint: str, field: str, value: Any) -> None:
    name = field.partition("[")[0]
    with pytest.raises(InvalidField) as refused:
        request_params(endpoint, {"model": "m", name: value})  # type: ignore[arg-type]
    assert refused.value.param == field


@pytest.mark.parametrize("doc", VALID_CHAT)
def test_documented_chat_shapes_pass(doc: dict[str, Any]) -> None:
    params = request_params("chat", doc)
    assert params["messages"] == doc["messages"]


@pytest.mark.parametrize(
    "parameters",
    [
        {},
        {"type": "object", "properties": {"a": {"type": "string"}, "b": True}, "required": ["a"]},
        {"type": "object", "description": None},  # a keyword the check does not read
    ],
)
def test_json_schemas_pass(parameters: dict[str, Any]) -> None:
    schema = {"name": "x", "schema": parameters}
    doc = chat(
        tools=[tool(parameters)], response_format={"type": "json_schema", "json_schema": schema}
    )
    params = request_params("chat", doc)
    assert params["tools"] == doc["tools"]


@pytest.mark.parametrize("value", ["a", ["a", "b"], [1, 2], [[1, 2], [3]]])
@pytest.mark.parametrize(
    ("endpoint", "field"), [("completions", "prompt"), ("embeddings", "input")]
)
def test_documented_prompts_and_inputs_pass(endpoint: str, field: str, value: Any) -> None:
    params = request_params(endpoint, {"model": "m", field: value})  # type: ignore[arg-type]
    assert params[field] == value


def test_a_seeded_walk_of_malformed_shapes_names_fields_without_their_values() -> None:
    # Whatever a mutation breaks, the answer is a pass or a refusal whose message is
    # short and holds none of the client's values (the canary in the junk).
    rng = random.Random(20261203)
    refusals: list[tuple[str, str]] = []
    for _ in range(400):
        try:
            request_params("chat", mutated(rng))
        except InvalidField as exc:  # anything else fails the test
            refusals.append((str(exc), exc.param))
    assert len(refusals) > 200  # the walk did break shapes
    for message, param in refusals:
        assert CANARY not in message and len(message) < 200, message
        assert CANARY not in param and len(param) < 80, param
