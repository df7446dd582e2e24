"""The coroutine a sync function hands back from a worker thread, within
`guarding_handoffs` (gateway/upstream/hosted_handoff.py): closed when nothing started it by
the block's end, or at once when the block had ended; left to its caller otherwise. LiteLLM's
own path: tests/integration/test_hosted_cancelled_dispatch.py."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
import types
from collections.abc import Coroutine
from typing import Any

import pytest

from gateway.upstream.hosted_handoff import (
    HandoffNotFound,
    guarding_handoffs,
    install_handoff_guard,
)

_NAME = "owngate_test_handoff_twins"


async def _request() -> str:
    return "answer"


def _build() -> Coroutine[Any, Any, str]:
    return _request()


@pytest.fixture
def twins(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module with a sync function that returns a coroutine, wrapped (twice: once)."""
    module = types.ModuleType(_NAME)
    module.build = _build  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, _NAME, module)
    install_handoff_guard(((_NAME, ("build",)),))
    install_handoff_guard(((_NAME, ("build",)),))
    assert module.build.__wrapped__ is _build
    return module


def _state(coroutine: Coroutine[Any, Any, Any]) -> str:
    state = inspect.getcoroutinestate(coroutine)
    coroutine.close()  # whatever it was: no warning from this test
    return state


def test_a_coroutine_awaited_within_the_block_runs(twins: types.ModuleType) -> None:
    async def call() -> str:
        with guarding_handoffs():
            made: Coroutine[Any, Any, str] = await asyncio.to_thread(twins.build)
            return await made  # to_thread copies its context, as LiteLLM's call does

    assert asyncio.run(call()) == "answer"


def test_a_coroutine_nothing_started_is_closed_as_the_block_ends(
    twins: types.ModuleType,
) -> None:
    async def call() -> str:
        with guarding_handoffs():
            dropped = await asyncio.to_thread(twins.build)
            assert inspect.getcoroutinestate(dropped) == inspect.CORO_CREATED
        return _state(dropped)

    assert asyncio.run(call()) == inspect.CORO_CLOSED


def test_a_coroutine_handed_back_once_the_block_ended_is_closed_at_once(
    twins: types.ModuleType,
) -> None:
    async def call() -> str:
        with guarding_handoffs():
            context = contextvars.copy_context()  # as LiteLLM's async function takes it
        # its worker thread returns after the call was cancelled and the block left
        late = await asyncio.get_running_loop().run_in_executor(None, context.run, twins.build)
        return _state(late)

    assert asyncio.run(call()) == inspect.CORO_CLOSED


def test_a_coroutine_made_on_the_loop_or_outside_a_block_is_its_callers(
    twins: types.ModuleType,
) -> None:
    async def call() -> tuple[str, str]:
        with guarding_handoffs():
            on_loop = twins.build()  # no executor: no future to drop it
        outside = await asyncio.to_thread(twins.build)
        return _state(on_loop), _state(outside)

    assert asyncio.run(call()) == (inspect.CORO_CREATED, inspect.CORO_CREATED)


def test_a_litellm_without_the_twins_fails_its_load_and_wraps_none(
    twins: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = types.ModuleType(_NAME + "_other")
    other.build = _build  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, other.__name__, other)
    with pytest.raises(HandoffNotFound, match="are not where owngate expects them"):
        install_handoff_guard(((other.__name__, ("build",)), (_NAME, ("gone",))))
    assert other.build is _build
