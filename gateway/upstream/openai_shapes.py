"""The shapes of the OpenAI request objects a hosted call forwards, checked before
LiteLLM reads them (gateway/upstream/openai_request.py checks each field's JSON type first).

LiteLLM's adapters read these objects without checking them: on a wrong shape they raise
`TypeError`, `KeyError`, `AttributeError` (LiteLLM 1.108.7 wraps them as its
`APIConnectionError`, status 500) before anything is sent. Read as the provider failing,
that was a 502/503 for the client's mistake and the next backend tried. So the shapes of
the OpenAI API reference ("Create chat completion", "Create completion", "Create
embeddings") are checked here, as far as an adapter reads them: messages and their
content parts, tool calls, tool results (gateway/upstream/openai_messages.py), tools,
`tool_choice`, legacy `functions` and `function_call`, `response_format`, `stop`,
`modalities`, `logit_bias`, a completion's `prompt` and an embedding's `input`.
`InvalidField` (gateway/upstream/invalid_field.py) names the field at fault, never its
value. What a provider checks itself (ranges, enumerations it knows) is left to it: its
400 is the client's 400 too. A shape this misses and an adapter still fails on is caught
behind it: gateway/upstream/hosted_errors.py reads such a failure, raised before the
transport was reached, as the client's 400 (gateway/upstream/hosted_transport.py).
"""

from __future__ import annotations

from typing import Any, Final

from gateway.upstream.invalid_field import InvalidField, check_keys
from gateway.upstream.openai_messages import check_messages
from gateway.upstream.openai_wire import Endpoint

__all__ = ["check_shapes"]

_TOOL_CHOICES: Final = frozenset({"none", "auto", "required"})
_FUNCTION_CALLS: Final = frozenset({"none", "auto"})
_NAMED_CHOICES: Final = frozenset({"function", "custom"})


def check_shapes(endpoint: Endpoint, params: dict[str, Any]) -> None:
    """Raise `InvalidField` for the first field of `params` (LiteLLM arguments, each of its
    documented JSON type) whose shape LiteLLM could not take."""
    if endpoint == "completions":
        _check_inputs("prompt", params["prompt"])
    elif endpoint == "embeddings":
        _check_inputs("input", params["input"])
    stop = params.get("stop")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise InvalidField("stop", "a string or an array of strings")
    if endpoint != "chat":
        return
    _check_response_format(params.get("response_format"))
    modalities = params.get("modalities")
    if modalities is not None and not all(isinstance(m, str) for m in modalities):
        raise InvalidField("modalities", "an array of strings")
    logit_bias = params.get("logit_bias")
    if logit_bias is not None and not all(_is_number(v) for v in logit_bias.values()):
        raise InvalidField("logit_bias", "an object of numbers")
    _check_tools(params.get("tools"))
    _check_tool_choice(params.get("tool_choice"))
    # LiteLLM's Gemini adapter raised TypeError on an entry that is not an object (a
    # string, a number): read as the provider failing, for the client's malformed request.
    for i, function in enumerate(params.get("functions") or ()):
        _check_function(f"functions[{i}]", function)
    function_call = params.get("function_call")
    if not (
        function_call is None
        or (isinstance(function_call, str) and function_call in _FUNCTION_CALLS)
        or (isinstance(function_call, dict) and isinstance(function_call.get("name"), str))
    ):
        raise InvalidField("function_call", '"none", "auto" or an object with a string `name`')
    check_messages(params["messages"])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_inputs(param: str, value: str | list[Any]) -> None:
    """A prompt or embedding input: a string, or a non-empty array of strings, of token
    ids, or of non-empty arrays of token ids (LiteLLM 1.108.7 raised on anything else,
    an empty array included, before sending). The first item of another kind than the
    array's first is named (`prompt[1]`): an object there is a content part or a stored
    file to some adapters."""
    if isinstance(value, str):
        return
    expected = "a string, or a non-empty array of strings, of integers or of integer arrays"
    if not value:
        raise InvalidField(param, expected)
    first = value[0]
    if isinstance(first, str):
        fits = _is_string
    elif isinstance(first, list):
        fits = _is_token_array
    else:
        fits = _is_token
    for i, item in enumerate(value):
        if not fits(item):
            raise InvalidField(f"{param}[{i}]", expected)


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_token_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_token(t) for t in value)


def _check_response_format(response_format: dict[str, Any] | None) -> None:
    if response_format is None:
        return
    kind = response_format.get("type")
    if not isinstance(kind, str):
        raise InvalidField("response_format.type", "a string")
    if kind != "json_schema":
        return
    schema = response_format.get("json_schema")
    if not isinstance(schema, dict):
        raise InvalidField("response_format.json_schema", "an object")
    check_keys("response_format.json_schema", schema, name=str, description=str, strict=bool)
    if "schema" in schema:
        _check_schema("response_format.json_schema.schema", schema["schema"])


def _check_function(where: str, function: Any) -> None:
    """A function definition: a string `name`; `description` a string, `parameters` a
    JSON Schema (`_check_schema`), `strict` a boolean."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidField(where, "an object with a string `name`")
    check_keys(where, function, description=str, strict=bool)
    if "parameters" in function:
        _check_schema(f"{where}.parameters", function["parameters"])


def _check_schema(where: str, schema: Any) -> None:
    """A JSON Schema given where the API takes one (a function's `parameters`, a response
    format's `schema`): an object; its `properties`, if given, an object whose values are
    schemas (objects or booleans), its `required` an array. Null is none of these: where
    the schema needs an object or an array, a null is refused as OpenAI refuses it
    (`_check_keys` passes null over, as an absent optional field), rather than sent on to
    be refused by the provider or to break an adapter that walks the schema. Only this
    level is checked: deeper, the schema is the provider's to judge."""
    if not isinstance(schema, dict):
        raise InvalidField(where, "a JSON Schema object")
    if "properties" in schema:
        properties = schema["properties"]
        if not isinstance(properties, dict) or not all(
            isinstance(value, dict | bool) for value in properties.values()
        ):
            raise InvalidField(
                f"{where}.properties", "an object of JSON Schemas (objects or booleans)"
            )
    if "required" in schema and not isinstance(schema["required"], list):
        raise InvalidField(f"{where}.required", "an array")


def _check_tools(tools: list[Any] | None) -> None:
    for i, tool in enumerate(tools or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidField(where, "an object with a string `type`")
        if tool["type"] == "function":
            _check_function(f"{where}.function", tool.get("function"))
        elif tool["type"] == "custom":
            custom = tool.get("custom")
            if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
                raise InvalidField(f"{where}.custom", "an object with a string `name`")


def _check_tool_choice(choice: str | dict[str, Any] | None) -> None:
    """`tool_choice`: "none", "auto", "required", a named function or custom tool, or
    allowed tools."""
    if choice is None or (isinstance(choice, str) and choice in _TOOL_CHOICES):
        return
    if isinstance(choice, str):
        raise InvalidField("tool_choice", '"none", "auto", "required" or an object')
    kind = choice.get("type")
    if isinstance(kind, str) and kind in _NAMED_CHOICES:
        named = choice.get(kind)
        if not isinstance(named, dict) or not isinstance(named.get("name"), str):
            raise InvalidField(f"tool_choice.{kind}", "an object with a string `name`")
    elif kind == "allowed_tools":
        allowed = choice.get("allowed_tools")
        if not isinstance(allowed, dict) or not isinstance(allowed.get("tools"), list):
            raise InvalidField("tool_choice.allowed_tools", "an object with a `tools` array")
    else:
        raise InvalidField("tool_choice.type", '"function", "custom" or "allowed_tools"')
