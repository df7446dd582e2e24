"""A proxied request reads no pydantic config model and no enum class on its way, and asks
its header names with `find`, not `in`.

An attribute of a pydantic model instance, or a member looked up on an enum class, is no
specialized load in CPython: both classes (the model's, the enum's metaclass) define a
Python-level `__getattr__`, so every such read goes through `slot_tp_getattr_hook`, some
400-700 instructions against a plain attribute's or a global's few dozen (callgrind, the
production configuration: ~50 such reads a request on the event loop before this test).
The router's per-request path (plan, score over two backends, the breaker's admission,
the report) reads what it needs from plain attributes and module constants set when the
config was loaded, and a request its limits from `Assembly.limits`. Counted here by
wrapping both classes' `__getattribute__` while one request is routed; the outcome
(order, scores) is checked as before. A bytes `in` makes and clears a TypeError first
(~2,000 instructions): the label's scan of every header of every request used one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import time
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from gateway.api.labels import InvalidLabel, read_label
from gateway.app import assemble
from gateway.config.schema import RoutingSettings
from gateway.routing.registry import Registry
from gateway.routing.router import Outcome, Router
from gateway.routing.signals import BackendLoad
from gateway.state import MemoryState
from tests.helpers.gateways import backend, decision, gateway_config

PRIVATE = ("b0", "b1")
SERVED = Outcome.served  # the test's own read, made before any is counted


@contextlib.contextmanager
def counted_reads() -> Iterator[collections.Counter[str]]:
    """Count reads of pydantic model attributes and of enum class attributes (by class
    and name) until the block ends; the classes' own look-ups are restored after."""
    reads: collections.Counter[str] = collections.Counter()
    model_get = pydantic.BaseModel.__getattribute__
    enum_get = type.__getattribute__

    def model_read(self: object, name: str) -> object:
        reads[f"{type(self).__name__}.{name}"] += 1
        return model_get(self, name)

    def enum_read(cls: type, name: str) -> object:
        reads[f"{enum_get(cls, '__name__')}.{name}"] += 1
        return enum_get(cls, name)

    pydantic.BaseModel.__getattribute__ = model_read  # type: ignore[method-assign]
    enum.EnumType.__getattribute__ = enum_read  # type: ignore[method-assign,assignment]
    try:
        yield reads
    finally:
        del pydantic.BaseModel.__getattribute__
        del enum.EnumType.__getattribute__


def _router() -> Router:
    config = gateway_config(
        [
            backend(b, f"http://127.0.0.1:{9000 + i}", "m", capacity={"max_concurrency": 4})
            for i, b in enumerate(PRIVATE)
        ]
    )
    registry = Registry.build(config, environ={}, clock=lambda: 0.0)
    settings = RoutingSettings.model_validate({"default": {"strategy": "score"}})
    loads = {"b1": BackendLoad(running=3.0, waiting=0.0, kv_usage=0.5, slots_total=None)}
    return Router(registry, settings, loads.get, 1.0, MemoryState())


def _route(router: Router) -> list[str]:
    """One request routed: planned, its first attempt admitted and served."""
    allowed = decision(PRIVATE, (), "never", None)
    planning = router.plan("m", allowed, {"messages": []}, time.perf_counter())
    try:  # stepped by hand, not by an event loop: asyncio's own enums are not counted
        planning.send(None)
    except StopIteration as done:
        plan = done.value
    else:
        planning.close()
        raise AssertionError("the plan waited: no backend is saturated")
    order = [route.backend.id for route in plan.private]
    for attempt in plan:
        plan.report(attempt, SERVED)
        break
    return order


def test_a_routed_request_reads_no_config_model_or_enum_class() -> None:
    router = _router()
    _route(router)  # warm: the first request may build what later ones reuse
    with counted_reads() as reads:
        order = _route(router)
    assert order == ["b0", "b1"]  # b1 is busier (3 of 4 slots running): b0 first
    assert dict(reads) == {}


def test_the_plain_copies_say_what_the_config_says() -> None:
    router = _router()
    registry = router._registry
    for backend_id in PRIVATE:
        state = registry.backends[backend_id]
        assert state.max_concurrency == state.config.capacity.max_concurrency == 4
    picker = router.picker
    pool = picker.pool("m")
    assert picker.strategy("m") == pool.strategy == "score"
    scores = picker.scores(pool, [registry.backends[b] for b in PRIVATE], None)
    assert scores[0] > scores[1]  # b1 busier


@pytest.mark.parametrize(
    ("limits", "logging"),
    [
        ({}, {"access_log": True}),
        (  # the per-tenant parts set, and unset with a body larger than half the budget
            {"max_held_body_bytes_per_tenant": 60_000_000, "max_held_answer_bytes": 20_000_000},
            {"access_log": False},
        ),
        ({"max_body_bytes": 1_000_000, "max_held_body_bytes": 7_000_000}, {}),
    ],
)
def test_a_request_reads_the_limits_from_plain_copies(
    tmp_path: Path, limits: dict[str, int], logging: dict[str, bool]
) -> None:
    """`Assembly.limits` is what `config.limits` (its per-tenant properties included) and
    `logging.access_log` say; reading it reads no pydantic model."""
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], limits=limits, logging=logging
    )

    async def scenario() -> None:
        parts = assemble(config, {}, config_dir=tmp_path)
        try:
            expected = config.limits
            with counted_reads() as reads:
                copied = parts.limits
                seen = (
                    copied.max_body_bytes,
                    copied.max_held_body_bytes,
                    copied.tenant_held_body_bytes,
                    copied.max_held_answer_bytes,
                    copied.tenant_held_answer_bytes,
                    copied.access_log,
                )
            assert dict(reads) == {}
            assert seen == (
                expected.max_body_bytes,
                expected.max_held_body_bytes,
                expected.tenant_held_body_bytes,
                expected.max_held_answer_bytes,
                expected.tenant_held_answer_bytes,
                config.logging.access_log,
            )
        finally:
            await parts.registry.close()

    asyncio.run(scenario())


class _NoContains(bytes):
    """A header name that refuses `in`: `bytes.__contains__` first tries its operand as
    an int, making and clearing a TypeError (~2,000 instructions under callgrind); the
    label's scan of every header of every request asks with `find` instead."""

    def __contains__(self, item: object) -> bool:
        raise AssertionError(f"`{item!r} in` a header name")


def test_the_label_scan_of_each_header_asks_find_not_in() -> None:
    headers = [
        (_NoContains(name), value)
        for name, value in (
            (b"host", b"gw"),
            (b"authorization", b"Bearer x"),
            (b"content-type", b"application/json"),
            (b"x-data-class", b" Internal "),
        )
    ]
    assert read_label({"headers": headers}, b"x-data-class") == "internal"
    spelled = [*headers, (_NoContains(b"x_data_class"), b"internal")]
    with pytest.raises(InvalidLabel):
        read_label({"headers": spelled}, b"x-data-class")
