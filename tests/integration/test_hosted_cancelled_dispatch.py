"""A hosted call that ends while LiteLLM's worker thread builds its request leaves nothing behind.

LiteLLM 1.108.7's `acompletion` runs its sync `completion` in the event loop's default
executor, and that returns the coroutine that will send the request
(`OpenAIChatCompletion.async_streaming`), which `acompletion` then awaits. A call that
ended while the thread ran (its client left, its deadline passed, the gateway shut down)
had asyncio drop the thread's result: the coroutine was never awaited nor closed, and some
later garbage collection, in whatever code ran then, warned "coroutine
'OpenAIChatCompletion.async_streaming' was never awaited" (an error in this suite: the
randomized log-truth test failed a case after a hosted one, tests/integration/
test_log_truth_fuzz.py). gateway/upstream/hosted_handoff.py closes it.

The same for a chat LiteLLM bridges to a Responses API (`openai/responses/<model>`), whose
`aresponses` runs `responses` in the executor the same way. The thread is held inside
LiteLLM's handler until the call has ended (or, for `built-then-cancelled`, lets it hand the
coroutine over while the cancellation is on its way): no timing decides which comes first.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import threading
import warnings
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.litellm_runtime import load_litellm
from tests.helpers.dropped_sockets import dropped_sockets
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.hosted_streams import openai_events, sse_stream
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS

_HOLD_S = 30.0  # bounds every wait on the held thread: far past anything that passes
_ASK = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


# provider_model -> (module, its handler object, the method that returns the request unsent)
_HANDLERS = {
    "openai/m": ("litellm.main", "openai_chat_completions", "completion"),
    "openai/responses/m": (
        "litellm.responses.main",
        "base_llm_http_handler",
        "response_api_handler",
    ),
}


class _Held:
    """LiteLLM's handler for `provider_model` held in the worker thread until `go` is set;
    `made`, what it returned (the coroutine that sends the request)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, provider_model: str) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.made: list[Coroutine[Any, Any, Any]] = []
        load_litellm()
        module, name, method = _HANDLERS[provider_model]
        handler = getattr(importlib.import_module(module), name)
        build = getattr(handler, method)

        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            assert self.go.wait(_HOLD_S)
            made = build(*args, **kwargs)
            self.made.append(made)
            return made

        monkeypatch.setattr(handler, method, held)


class _Pool(ThreadPoolExecutor):
    """The loop's default executor (LiteLLM's `run_in_executor(None, ...)`), keeping the
    futures it hands out."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.submitted: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.submitted.append(future)
        return future


def _client(url: str, provider_model: str, timeout_s: float) -> HostedClient:
    backend = BackendSettings.model_validate(
        {
            "id": "h",
            "kind": "hosted",
            "provider": "openai",
            "base_url": f"{url}/v1",
            "models": [{"name": "m", "provider_model": provider_model}],
            "region": "eu",
            "owner": "openai",
            "api_key_env": "KEY",
        }
    )
    return HostedClient(
        backend, environ={"KEY": "k"}, timeout_s=timeout_s, max_answer_bytes=1 << 16
    )


async def _entered(held: _Held) -> None:
    assert await asyncio.to_thread(held.entered.wait, _HOLD_S), "LiteLLM's handler never ran"


@pytest.mark.parametrize(
    ("when", "provider_model"),
    [
        ("client-left", "openai/m"),
        ("built-then-cancelled", "openai/m"),
        ("deadline", "openai/m"),
        ("client-left", "openai/responses/m"),
        ("built-then-cancelled", "openai/responses/m"),
    ],
)
def test_a_call_ended_while_litellm_builds_it_leaves_no_coroutine_or_socket(
    start_raw: Callable[[Answer], RawBackend],
    monkeypatch: pytest.MonkeyPatch,
    when: str,
    provider_model: str,
) -> None:
    raw = start_raw(sse_stream(openai_events("stop")))  # never asked: nothing is sent
    held = _Held(monkeypatch, provider_model)
    client = _client(raw.url, provider_model, timeout_s=0.3 if when == "deadline" else 30.0)
    pool = _Pool()

    async def call() -> None:
        asyncio.get_running_loop().set_default_executor(pool)
        task = asyncio.create_task(client.send("chat", dict(_ASK), "m"))
        await _entered(held)
        if when == "deadline":
            with pytest.raises(HostedError) as failed:
                await task
            assert failed.value.kind == "timeout"
        else:
            task.cancel()
        if when == "built-then-cancelled":
            # The thread returns the coroutine before the task has seen its cancellation:
            # the loop waits here, so the result is in when the task next runs.
            held.go.set()
            for future in list(pool.submitted):
                future.result(timeout=_HOLD_S)
        if when != "deadline":
            with pytest.raises(asyncio.CancelledError):
                await task
        held.go.set()
        for future in list(pool.submitted):
            await asyncio.wrap_future(future)  # the held thread has returned
        await client.aclose()

    with dropped_sockets() as dropped:
        try:
            asyncio.run(call())
        finally:
            held.go.set()  # a failed run leaves no thread held
            pool.shutdown()
            pool.submitted.clear()  # their results: the coroutine too
        (made,) = held.made
        state = inspect.getcoroutinestate(made)
        held.made.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del made  # the last reference: its warning, if any, is raised here
            gc.collect()
    assert state == inspect.CORO_CLOSED, f"LiteLLM's request coroutine left {state}"
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == []
    assert dropped == []
    assert raw.connections == 0  # nothing was sent
