"""What LiteLLM's Anthropic stream parser keeps of a content block's deltas
(gateway/upstream/anthropic_deltas.py) answers its one question as every delta did: at a
tool block's end, whether the model sent no arguments (then LiteLLM relays `"{}"`).
Checked with LiteLLM's own `check_empty_tool_call_args` on the bounded list and on all the
deltas, for blocks that begin with text, thinking, empty and non-empty argument pieces.
And a LiteLLM not shaped as expected fails loudly rather than keeping everything again.
"""

from __future__ import annotations

import itertools
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gateway.upstream.anthropic_deltas import bound_parser
from gateway.upstream.hosted_stream import StreamBoundNotFound
from gateway.upstream.litellm_runtime import load_litellm

DELTAS = 300


def piece(kind: str) -> dict[str, Any]:
    body = {
        "text": {"type": "text_delta", "text": "x"},
        "thinking": {"type": "thinking_delta", "thinking": "t"},
        "signature": {"type": "signature_delta", "signature": "s"},
        "empty": {"type": "input_json_delta", "partial_json": ""},
        "json": {"type": "input_json_delta", "partial_json": '{"a"'},
        "citation": {"type": "citations_delta", "citation": {"cited_text": "c"}},
    }[kind]
    return {"type": "content_block_delta", "index": 0, "delta": body}


def parser() -> Any:
    load_litellm()
    from litellm.llms.anthropic.chat import handler

    return handler.ModelResponseIterator(None, sync_stream=False)


def test_a_tool_block_is_told_empty_as_it_was_from_every_delta() -> None:
    from litellm.llms.anthropic.chat import handler

    check = handler.ModelResponseIterator.check_empty_tool_call_args
    kinds = ("text", "thinking", "signature", "empty", "json", "citation")
    for first, second, rest in itertools.product(kinds, kinds, ("empty", "json", "thinking")):
        deltas = [piece(first), piece(second)] + [piece(rest) for _ in range(DELTAS)]
        bounded = parser()
        for made in deltas:
            bounded.content_blocks.append(made)
        whole: Any = SimpleNamespace(content_blocks=deltas)
        assert check(bounded) == check(whole), (first, second, rest)
        assert len(bounded.content_blocks) <= 2


def test_a_new_block_starts_a_bounded_list_and_no_thinking_is_kept() -> None:
    bounded = parser()
    bounded.content_blocks = []  # as LiteLLM does when a content block starts
    for _ in range(DELTAS):
        bounded.content_blocks.append(piece("json"))
        bounded.reasoning_content_chunks.append("t" * 1024)
    assert len(bounded.content_blocks) == 1
    assert bounded.reasoning_content_chunks == []


def test_a_litellm_not_shaped_as_expected_fails_loudly_not_silently() -> None:
    def reads_blocks_elsewhere(self: Any) -> int:
        return len(self.content_blocks)

    class Sets(SimpleNamespace):
        def __init__(self) -> None:
            super().__init__()
            self.content_blocks: list[Any] = []
            self.reasoning_content_chunks: list[str] = []

        def check_empty_tool_call_args(self) -> bool:
            return not self.content_blocks

        def _content_block_delta_helper(self, delta: Any) -> None:
            self.content_blocks.append(delta)
            self.reasoning_content_chunks.append(delta)

        def _handle_usage(self) -> str:
            return "".join(self.reasoning_content_chunks)

        def chunk_parser(self) -> None:
            self.content_blocks = []

    module = ModuleType("shaped")
    setattr(module, "reads_blocks_elsewhere", reads_blocks_elsewhere)  # noqa: B010
    reads_blocks_elsewhere.__module__ = Sets.__module__ = "shaped"
    module.ModelResponseIterator = Sets  # type: ignore[attr-defined]
    with pytest.raises(StreamBoundNotFound, match="reads_blocks_elsewhere"):
        bound_parser(module)  # a reader the bound does not know of
    delattr(module, "reads_blocks_elsewhere")
    bound_parser(module)
    assert len(Sets().content_blocks) == 0  # bounded: the shape is the known one
    module.ModelResponseIterator = type("NoClass", (), {})  # type: ignore[attr-defined]
    with pytest.raises(StreamBoundNotFound):
        bound_parser(module)  # no reader at all


def test_the_parser_is_bounded_once() -> None:
    load_litellm()
    from litellm.llms.anthropic.chat import handler

    from gateway.upstream.anthropic_deltas import install_delta_bound

    parser = handler.ModelResponseIterator
    before = (parser.__init__, vars(parser)["content_blocks"])
    install_delta_bound()
    after = (parser.__init__, vars(parser)["content_blocks"])
    assert before == after
    assert getattr(before[0], "_owngate_keeps_little", False)
