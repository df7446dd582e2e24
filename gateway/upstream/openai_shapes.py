"""The shapes of the OpenAI request objects a hosted call forwards, checked before
LiteLLM reads them (gateway/upstream/openai_request.py checks each field's JSON type first).

LiteLLM's adapters read these objects without checking them: on a wrong shape they raise
`TypeError`, `KeyError`, `AttributeError` (LiteLLM 1.108.7 wraps them as its
`APIConnectionError`, status 500) before anything is sent. Read as the provider failing,
that was a 502/503 for the client's mistake and the next backend tried. So the shapes of
the OpenAI API reference ("Create chat completion", "Create completion", "Create
embeddings") are checked here, as far as an adapter reads them: messages and their
content parts, tool calls, tool results, tools, `tool_choice`, legacy `functions` and
`function_call`, `response_format`, `stop`, `modalities`, `logit_bias`, a completion's
`prompt` and an embedding's `input`. `InvalidField` names the field at fault, never its
value. What a provider checks itself (ranges, enumerations it knows) is left to it: its
400 is the client's 400 too. A shape this misses and an adapter still fails on is caught
behind it: gateway/upstream/hosted_errors.py reads such a failure, raised before the
transport was reached, as the client's 400 (gateway/upstream/hosted_transport.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from gateway.upstream.assistant_runs import MAX_RUN_COMPARISONS, TOO_MANY_COMPARISONS, run_parts
from gateway.upstream.openai_wire import Endpoint

__all__ = [
    "MAX_SYSTEM_MOVES",
    "MAX_TOOL_LOOKUPS",
    "USER_CONTENT_TYPES",
    "InvalidField",
    "check_shapes",
    "content_parts",
]

# The content part types LiteLLM 1.108.7 accepts in a user message
# (`litellm.types.llms.openai.ValidUserMessageContentTypes`; a test compares them): it
# raises on any other before calling the provider.
USER_CONTENT_TYPES: Final = frozenset(
    {
        "text",
        "image_url",
        "input_audio",
        "audio_url",
        "document",
        "guarded_text",
        "grounding_source",
        "query",
        "video_url",
        "file",
    }
)

# The content part types each role may send (the API reference; for users, LiteLLM's list).
_PART_TYPES: Final[dict[str, frozenset[str]]] = {
    "user": USER_CONTENT_TYPES,
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}
# The roles whose `content` may be null (an assistant turn that only calls tools).
_NULL_CONTENT_ROLES: Final = frozenset({"assistant", "function"})
# A content part's payload: the key its type names, and the types that key may hold.
# LiteLLM takes an image (video, audio) URL as a plain string too.
_URL_PARTS: Final = frozenset({"image_url", "video_url", "audio_url"})
_TEXT_PARTS: Final = frozenset({"text", "guarded_text"})
_FILE_KEYS: Final = ("file_data", "file_id", "filename", "format", "detail")
_TOOL_CHOICES: Final = frozenset({"none", "auto", "required"})
_FUNCTION_CALLS: Final = frozenset({"none", "auto"})
_NAMED_CHOICES: Final = frozenset({"function", "custom"})
_NAMES: Final = {str: "a string", dict: "an object", bool: "a boolean", list: "an array"}


# LiteLLM's Gemini adapter names each tool result by searching the latest assistant
# message's tool calls for its id, one by one: 32,000 calls and their results (4 MB) held
# the gateway's CPU 80 s. Results times the calls they are searched among are bounded
# (some 0.1 s of such searching); a conversation of a hundred calls and results is 10,000.
# Its comparisons of tool calls with the parts before them: assistant_runs.py.
MAX_TOOL_LOOKUPS: Final = 1 << 20
_RESULT_ROLES: Final = frozenset({"tool", "function"})
_TOO_MANY_LOOKUPS: Final = (
    f"at most {MAX_TOOL_LOOKUPS} tool results times the tool calls of the assistant "
    "message before them (a provider's adapter searches those calls for each result)"
)
# It takes the system messages out one by one, each moving every message after it: 130,000
# between as many others (9 MB) held the CPU 0.9 s, 4 times that at twice the body. The
# messages times the system (or developer) ones before them are bounded (some 0.05 s).
MAX_SYSTEM_MOVES: Final = 1 << 28
_SYSTEM_ROLES: Final = frozenset({"system", "developer"})
_TOO_MANY_MOVES: Final = (
    f"at most {MAX_SYSTEM_MOVES} messages times the system messages before them (a "
    "provider's adapter moves each message after a system one as it takes that out)"
)


class InvalidField(ValueError):
    """A request field LiteLLM could not take: the wrong JSON type, or a malformed message.

    `param` names the field (`messages[2].content`); the message says what was expected
    and never repeats the value."""

    def __init__(self, param: str, expected: str) -> None:
        super().__init__(f"`{param}` must be {expected}")
        self.param = param


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
    _check_messages(params["messages"])


def content_parts(messages: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`messages[i].content[j]`, part) for each object part of each chat message whose
    content is an array; anything of another shape is passed over, never an error (what
    walks a request before its shapes are checked, or for a backend they are not)."""
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                yield f"messages[{i}].content[{j}]", part


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
    _check_keys("response_format.json_schema", schema, name=str, description=str, strict=bool)
    if "schema" in schema:
        _check_schema("response_format.json_schema.schema", schema["schema"])


def _check_keys(where: str, obj: dict[str, Any], **types: type) -> None:
    """Each of `types`' keys, when present and not null, holds a value of its type."""
    for key, kind in types.items():
        value = obj.get(key)
        if value is not None and not isinstance(value, kind):
            raise InvalidField(f"{where}.{key}", _NAMES[kind])


def _check_function(where: str, function: Any) -> None:
    """A function definition: a string `name`; `description` a string, `parameters` a
    JSON Schema (`_check_schema`), `strict` a boolean."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidField(where, "an object with a string `name`")
    _check_keys(where, function, description=str, strict=bool)
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


def _check_messages(messages: list[Any]) -> None:
    """Each message an object with a string `role` (and `name`, if any); its `content` a
    string or an array of content parts its role may send; null only for an assistant (or
    legacy function) message. An assistant's tool calls and a tool result's id, a legacy
    function result's name, as the API has them; tool results times the calls they are
    looked up among at most `MAX_TOOL_LOOKUPS`, tool calls times the parts of their run at
    most `MAX_RUN_COMPARISONS` (gateway/upstream/assistant_runs.py), messages times the
    system messages before them at most `MAX_SYSTEM_MOVES`."""
    calls, lookups = 0, 0  # the latest assistant's tool calls; results times calls so far
    run = compared = 0  # parts of the run of assistant messages; calls times parts
    systems = moves = 0  # system messages so far; messages times the system ones before
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(where, "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidField(f"{where}.role", "a string")
        _check_keys(where, message, name=str)
        run, compared = run_parts(role, message, run, compared)
        if compared > MAX_RUN_COMPARISONS:
            raise InvalidField("messages", TOO_MANY_COMPARISONS)
        if role in _SYSTEM_ROLES:
            systems += 1
        elif (moves := moves + systems) > MAX_SYSTEM_MOVES:
            raise InvalidField("messages", _TOO_MANY_MOVES)
        if role in _RESULT_ROLES:
            lookups += calls
            if lookups > MAX_TOOL_LOOKUPS:
                raise InvalidField("messages", _TOO_MANY_LOOKUPS)
        if role == "assistant":
            _check_tool_calls(where, message)
            calls = len(message.get("tool_calls") or ()) or calls
        elif role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise InvalidField(f"{where}.tool_call_id", "a string (a tool result names its call)")
        elif role == "function" and not isinstance(message.get("name"), str):
            raise InvalidField(f"{where}.name", "a string (a function result names its function)")
        content = message.get("content")
        if content is None and role in _NULL_CONTENT_ROLES:
            continue
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            nullable = " or null" if role in _NULL_CONTENT_ROLES else ""
            raise InvalidField(
                f"{where}.content", f"a string or an array of content parts{nullable}"
            )
        known = _PART_TYPES.get(role)  # an unknown role: LiteLLM or the provider decides
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str) or (known is not None and kind not in known):
                # The role is named only when it is one of the API's: any other is the
                # client's text, never repeated.
                sender = f"a {role}" if known is not None else "its role"
                raise InvalidField(
                    f"{where}.content[{j}]",
                    f"a content part object with a `type` {sender} may send",
                )
            _check_part(f"{where}.content[{j}]", kind, part)


def _check_part(where: str, kind: str, part: dict[str, Any]) -> None:
    """A content part's payload (`text` of a text part, `image_url` of an image, ...)."""
    if kind in _TEXT_PARTS or kind == "refusal":
        key = "text" if kind in _TEXT_PARTS else "refusal"
        if not isinstance(part.get(key), str):
            raise InvalidField(f"{where}.{key}", "a string")
    elif kind in _URL_PARTS:
        payload = part.get(kind)
        if isinstance(payload, str):
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            raise InvalidField(f"{where}.{kind}", "a URL string or an object with a string `url`")
        _check_keys(f"{where}.{kind}", payload, detail=str, format=str)
    elif kind == "input_audio":
        audio = part.get(kind)
        if not (
            isinstance(audio, dict)
            and isinstance(audio.get("data"), str)
            and isinstance(audio.get("format"), str)
        ):
            raise InvalidField(f"{where}.input_audio", "an object with string `data` and `format`")
    elif kind == "file":
        file = part.get(kind)
        if not isinstance(file, dict) or not ({"file_data", "file_id"} & file.keys()):
            raise InvalidField(f"{where}.file", "an object with `file_data` or `file_id`")
        _check_keys(f"{where}.file", file, **dict.fromkeys(_FILE_KEYS, str))


def _check_tool_calls(where: str, message: dict[str, Any]) -> None:
    """An assistant's `tool_calls`: objects with a string `id` and a `function` with string
    `name` and `arguments`; its legacy `function_call` likewise."""
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise InvalidField(f"{where}.tool_calls", "an array")
    expected = "an object with string `name` and `arguments`"
    for k, call in enumerate(calls or ()):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise InvalidField(at, "an object with a string `id`")
        _check_keys(at, call, type=str)
        if not _is_call(call.get("function")):
            raise InvalidField(f"{at}.function", expected)
    function_call = message.get("function_call")
    if function_call is not None and not _is_call(function_call):
        raise InvalidField(f"{where}.function_call", expected)


def _is_call(function: Any) -> bool:
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    )
