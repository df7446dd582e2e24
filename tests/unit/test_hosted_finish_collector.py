"""The hosted finish checks read a provider's whole answer (up to
`limits.max_response_bytes`, 16 MiB by default) on the event loop. Parsed with plain
`orjson.loads`, an answer of many small arrays ran the cyclic collector every 700 or so of
them (gateway/json_loads.py says why): a hostile provider's `[[],[],...]` held the loop
for several times the parse, once per check. They parse with the collector off now:
counted here as collections started during the checks, not timed."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.upstream.anthropic_stops import relabeled
from gateway.upstream.hosted_finish import relabel, short_of, unfinished

ARRAYS = 200_000  # ~285 young collections when the collector runs over their building


# Written as bytes, not built: building the arrays would run the collector in the test.
_PADDING = b'"padding": [' + b",".join([b"[]"] * ARRAYS) + b"]"
OPENAI = (
    b'{"choices": [{"index": 0, "finish_reason": "model_length", "message": {"content": "x"}}], '
    + _PADDING
    + b"}"
)
ANTHROPIC = (
    b'{"type": "message", "stop_reason": "model_context_window_exceeded", ' + _PADDING + b"}"
)


@pytest.fixture
def collections() -> Iterator[list[int]]:
    started = [0]

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] += 1

    gc.collect()
    gc.callbacks.append(count)
    try:
        yield started
    finally:
        gc.callbacks.remove(count)


class _Choice:
    finish_reason = "stop"


class _Result:
    def __init__(self) -> None:
        self.choices = [_Choice()]


CHECKS: dict[str, Callable[[bytes], object]] = {
    "unfinished": unfinished,
    "short_of": lambda answer: short_of("chat", {"n": 1}, b'{"choices": [{"index": 0}]}', answer),
    "relabel": lambda answer: relabel(_Result(), answer),
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_a_whole_answer_of_many_arrays_is_parsed_with_the_collector_off(
    check: str, collections: list[int]
) -> None:
    assert gc.isenabled()
    CHECKS[check](OPENAI)
    assert gc.isenabled()  # put back on
    assert collections[0] <= 2, f"{collections[0]} collections ran during the parse"


def test_an_anthropic_answer_of_many_arrays_is_relabeled_with_the_collector_off(
    collections: list[int],
) -> None:
    assert relabeled(ANTHROPIC) == "length"
    assert collections[0] <= 2, f"{collections[0]} collections ran during the parse"
