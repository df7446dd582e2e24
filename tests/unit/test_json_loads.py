"""A request body of many arrays is parsed without the garbage collector running over it
again and again (`gateway/json_loads.py`), wherever the gateway parses a whole body: the
request's parse (`parse_body`, its exact repeated-key check included), the check of a
renamed `model`, a stream's usage request merged into `stream_options`, and a cache salt
that replaces the client's.

Before, a 2.3 MB body of `[],[],...` (within a tenant's body budget) held the event loop
1.1 s of a real `owngate serve`, 1.3 s with a model alias (parsed twice), where the parse
alone takes 0.15 s. Counted, not timed: at most the one collection that is due once the
collector is on again (each parse here started dozens)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from gateway.api.body import parse_body
from gateway.api.body_rewrites import ask_for_usage, model_pattern, rewrite_model
from gateway.errors import GatewayError
from gateway.json_loads import COLLECT_UNDER, loads
from gateway.upstream.tenant_ids import salted_body
from tests.helpers.python_calls import by_name, python_calls

ARRAYS = 30 * COLLECT_UNDER  # some 40 collections' worth with the collector on
BODY = (
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,'
    b'"stream_options":{"include_usage":false},"cache_salt":"c","x":[' + b"[]," * ARRAYS + b"0]}"
)


@contextmanager
def collections() -> Iterator[list[str]]:
    """The collections that start while the block runs."""
    started: list[str] = []

    def counted(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            started.append(phase)

    gc.collect()  # nothing due from before the block
    gc.callbacks.append(counted)
    try:
        yield started
    finally:
        gc.callbacks.remove(counted)


DOC = orjson.loads(BODY)


def repeated_key_check() -> None:
    """`parse_body` of a body that writes `model` twice: parsed, then checked exactly."""
    with pytest.raises(GatewayError, match="repeats the `model` key"):
        parse_body(BODY.replace(b'{"model":"m",', b'{"model":"m","model":"m",'))


# Each with how many parses it makes (one due collection after each).
PARSES: dict[str, tuple[Callable[[], Any], int]] = {
    "parse_body": (lambda: parse_body(BODY), 1),
    "repeated_key_check": (repeated_key_check, 2),
    "rewrite_model": (lambda: rewrite_model(BODY, DOC, model_pattern("m"), "up-m"), 1),
    "ask_for_usage": (lambda: ask_for_usage(BODY, DOC), 1),
    "salted_body": (lambda: salted_body(BODY, DOC, "acme"), 1),
    "loads": (lambda: loads(BODY), 1),
}


@pytest.mark.parametrize(("parse", "parses"), PARSES.values(), ids=PARSES.keys())
def test_a_body_of_many_arrays_is_parsed_without_a_collection(
    parse: Callable[[], Any], parses: int
) -> None:
    assert gc.isenabled()
    with collections() as started:
        parse()
    assert gc.isenabled()
    assert len(started) <= parses, f"{len(started)} collections"


def test_the_collector_is_on_again_after_a_parse_that_fails() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        loads(BODY[:-1])
    assert gc.isenabled()


def test_a_usual_body_is_parsed_with_no_python_call_besides_loads() -> None:
    """Every request's body is parsed with `loads`: a usual one (far under `COLLECT_UNDER`
    arrays and objects) costs orjson's parse and nothing in Python around it (the
    collector's context manager took 2.4 us, three times orjson's parse of 400 bytes)."""
    small = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}'
    called = python_calls(lambda: (loads(small), loads(small, 3)), by_name)
    assert called == ["loads", "loads"]
