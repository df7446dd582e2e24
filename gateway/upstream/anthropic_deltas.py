"""What LiteLLM's Anthropic stream parser keeps of the deltas it relays, bounded
(gateway/upstream/litellm_runtime.py calls `install_delta_bound` at load).

LiteLLM 1.108.7's parser of an Anthropic stream (`ModelResponseIterator` in
litellm/llms/anthropic/chat/handler.py, also under Bedrock's, Vertex's and Snowflake's
Anthropic streams) appends every delta that is not text (a tool call's `input_json_delta`,
`thinking`, `signature`, `citations`) to `content_blocks`, emptied only when the next content
block starts, and the text of every thinking delta to `reasoning_content_chunks`, kept until
the stream ends: about 1 KB an event besides the text, so a client asking a hosted Anthropic
model for a long extended-thinking answer or a huge tool-call argument made the gateway hold
memory growing with the answer (1,000 thinking deltas of 1 KiB: 3.1 MB).

What reads them, in that version (checked at install, `_READERS`):
- `content_blocks`: `check_empty_tool_call_args`, at a tool block's end, which asks whether
  the block's first delta was text or thinking, and whether any `partial_json` was not
  empty (then LiteLLM sends no `"{}"` arguments of its own); and, for a `server_tool_use`
  block (Anthropic's own tools), the joined arguments parsed into `provider_specific_fields`
  (`code_interpreter_results`, `web_search_calls`), which the gateway never relays
  (gateway/upstream/openai_wire.py drops them). So a block keeps its first delta and its
  first non-empty `partial_json` (`_FirstDeltas`): the check answers as it did, and the
  arguments themselves reach the client delta by delta as before.
- `reasoning_content_chunks`: `_handle_usage`, which joins them into LiteLLM's estimate of
  the reasoning tokens (`completion_tokens_details.reasoning_tokens`, counted with a
  tokenizer) when Anthropic reported none (it reports only `output_tokens`, thinking
  included). A stream's usage is relayed and recorded as its three counts only
  (`openai_wire.usage_of`), the provider's own, never that estimate; so none of the text is
  kept (`_Unkept`), and the estimate is not made.

That estimate did reach clients, in a whole (non-streaming) answer: its usage is relayed
with `completion_tokens_details`, and LiteLLM estimated `reasoning_tokens` from the answer's
thinking blocks (141 for a thinking block of 140 words) as if Anthropic had counted them.
It is made nowhere now (`_unestimated`): the count is the one Anthropic reports
(`output_tokens_details.thinking_tokens`), or, where it reports none, absent from the
answer (LiteLLM's `None` for an answer with thinking blocks, dropped by `openai_wire`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Any, Final, SupportsIndex

from gateway.upstream.hosted_stream import StreamBoundNotFound, after_init

__all__ = ["bound_parser", "install_delta_bound"]

# LiteLLM 1.108.7: the parser (module, class), and the functions of that module that name
# each list: a reader not among them would read a list bounded under it.
_PARSER: Final = ("litellm.llms.anthropic.chat.handler", "ModelResponseIterator")
_READERS: Final = {
    "content_blocks": frozenset(
        {"__init__", "check_empty_tool_call_args", "_content_block_delta_helper", "chunk_parser"}
    ),
    "reasoning_content_chunks": frozenset(
        {"__init__", "_content_block_delta_helper", "_handle_usage"}
    ),
}
# LiteLLM 1.108.7: where it counts the reasoning tokens (module, class, method), estimating
# them from the thinking text it is given when the provider reported none.
_USAGE: Final = (
    "litellm.llms.anthropic.chat.transformation",
    "AnthropicConfig",
    "_build_completion_token_details",
)
_UNESTIMATED: Final = "_owngate_unestimated"
_BLOCKS: Final = "_owngate_content_blocks"
_THINKING: Final = "_owngate_reasoning_content_chunks"


def install_delta_bound() -> None:
    """Make every Anthropic stream parser LiteLLM creates keep a few deltas a content
    block and none of the thinking text (see the module's notes). Idempotent; LiteLLM
    loaded. Raises `StreamBoundNotFound` when LiteLLM is not shaped as this expects."""
    bound_parser(importlib.import_module(_PARSER[0]))
    usage = getattr(importlib.import_module(_USAGE[0]), _USAGE[1], None)
    build = getattr(usage, _USAGE[2], None)
    if not callable(build) or "reasoning_content" not in inspect.signature(build).parameters:
        raise StreamBoundNotFound(f"{_USAGE[0]}.{'.'.join(_USAGE[1:])} takes no reasoning_content")
    if not getattr(build, _UNESTIMATED, False):
        setattr(usage, _USAGE[2], _unestimated(build))


def _unestimated(build: Callable[..., Any]) -> Callable[..., Any]:
    """LiteLLM's count of the reasoning tokens, given no thinking text to estimate from."""

    @functools.wraps(build)
    def unestimated(config: Any, *args: Any, **kwargs: Any) -> Any:
        if args or "reasoning_content" not in kwargs:  # a caller this does not know
            raise StreamBoundNotFound(f"{_USAGE[2]} called without reasoning_content by name")
        return build(config, **{**kwargs, "reasoning_content": None})

    setattr(unestimated, _UNESTIMATED, True)
    return unestimated


def bound_parser(module: ModuleType) -> None:
    """`install_delta_bound` on `module`, LiteLLM's or one shaped like it."""
    parser = getattr(module, _PARSER[1], None)
    if not isinstance(parser, type):
        raise StreamBoundNotFound(f"{module.__name__}.{_PARSER[1]} is not a class")
    if isinstance(parser.__dict__.get("content_blocks"), property):
        return
    for name, expected in _READERS.items():
        readers = frozenset(_functions_naming(vars(module), name))
        if readers != expected:
            raise StreamBoundNotFound(
                f"LiteLLM's Anthropic stream parser has {sorted(readers)} naming {name!r}, "
                f"not {sorted(expected)}"
            )
    setattr(parser, "content_blocks", property(_blocks, _set_blocks))  # noqa: B010
    setattr(parser, "reasoning_content_chunks", property(_thinking, _set_thinking))  # noqa: B010
    after_init(parser, _check_bound)


def _functions_naming(namespace: dict[str, Any], name: str) -> Iterator[str]:
    """The functions (and methods of classes) defined in `namespace` whose code, nested
    code included, names the attribute `name`."""
    for value in namespace.values():
        if getattr(value, "__module__", None) != namespace["__name__"]:
            continue  # imported from elsewhere
        members = vars(value).items() if isinstance(value, type) else [("", value)]
        for member_name, member in members:
            function = getattr(member, "fget", member)  # a property's getter
            function = getattr(function, "__wrapped__", function)
            if isinstance(function, FunctionType) and _names(function.__code__, name):
                yield member_name or function.__name__


def _names(code: CodeType, name: str) -> bool:
    return name in code.co_names or any(
        _names(const, name) for const in code.co_consts if isinstance(const, CodeType)
    )


def _check_bound(parser: Any) -> None:
    """After a parser's `__init__`: both lists went through the properties."""
    for slot in (_BLOCKS, _THINKING):
        if slot not in vars(parser):
            raise StreamBoundNotFound(f"LiteLLM's {type(parser).__name__} never set {slot[9:]!r}")


def _blocks(parser: Any) -> list[Any]:
    blocks: list[Any] = vars(parser)[_BLOCKS]
    return blocks


def _set_blocks(parser: Any, value: Iterable[Any]) -> None:
    """`self.content_blocks = []` as a content block starts: a bounded list again."""
    vars(parser)[_BLOCKS] = _FirstDeltas(value)


def _thinking(parser: Any) -> list[str]:
    kept: list[str] = vars(parser)[_THINKING]
    return kept


def _set_thinking(parser: Any, value: Iterable[str]) -> None:
    vars(parser)[_THINKING] = _Unkept(value)


class _FirstDeltas(list[Any]):
    """A content block's deltas as LiteLLM's parser appends them, of which it keeps the
    first, and the first tool-argument delta (`input_json_delta`) whose `partial_json` is
    not empty: two at most, whatever the length of the block."""

    def __init__(self, value: Iterable[Any] = ()) -> None:
        super().__init__()
        for delta in value:
            self.append(delta)

    def append(self, delta: Any) -> None:
        if not self or (_partial_json(delta) and not any(_partial_json(d) for d in self)):
            super().append(delta)

    def extend(self, deltas: Iterable[Any]) -> None:
        for delta in deltas:
            self.append(delta)

    def insert(self, index: SupportsIndex, delta: Any) -> None:
        raise StreamBoundNotFound("LiteLLM's Anthropic stream parser inserted a delta")


def _partial_json(delta: Any) -> bool:
    inner = delta.get("delta") if isinstance(delta, dict) else None
    return (
        isinstance(inner, dict)
        and inner.get("type") == "input_json_delta"
        and bool(inner.get("partial_json"))
    )


class _Unkept(list[str]):
    """A list that stays empty when appended to: the thinking text is relayed, not kept."""

    def __init__(self, value: Iterable[str] = ()) -> None:
        super().__init__()

    def append(self, text: str) -> None:
        return None

    def extend(self, texts: Iterable[str]) -> None:
        return None

    def insert(self, index: SupportsIndex, text: str) -> None:
        return None
