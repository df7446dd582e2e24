"""The simulated inference engine: slots, a FIFO wait queue and batched decode steps.

One asyncio task runs the engine loop, as a real server's scheduler does. Every step:

1. admit waiting sequences, oldest first, while fewer than `slots` run and the KV cache
   can hold their prompt (an empty engine always admits one, so nothing deadlocks);
2. sleep `decode_step + prefill`, where
   `decode_step = (1 / decode_tokens_per_s) * (1 + batch_slowdown * (running - 1))` and
   `prefill = sum(prompt_tokens of sequences admitted this step) / prefill_tokens_per_s`;
3. every sequence still running emits one token; those that reached `max_tokens` finish.

So time to first token is queue wait + one step including its prefill, a prefill slows
the whole batch, and per-sequence speed falls as the batch grows. KV usage is the tokens
(prompt + generated) held by running sequences over `kv_capacity_tokens`.

Prefix cache (when `prefix_cache_tokens` > 0, see `gateway.sim.prefix`): on admission a
sequence looks up the longest cached prefix of its prompt and prefills only the tokens
after it; once prefilled, its prompt's prefixes are cached, within that token budget.

Time comes from an injected `Clock`: `MonotonicClock` in servers, `VirtualClock` in unit
tests, where the engine's sleeps advance time instantly.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from typing import Protocol

from gateway.sim.prefix import PrefixCache, PromptChain

__all__ = [
    "Clock",
    "Engine",
    "LoadModel",
    "MonotonicClock",
    "SeqState",
    "Sequence",
    "VirtualClock",
]


class Clock(Protocol):
    """Where the engine reads time and how it waits."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """Real time: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class VirtualClock:
    """Test time: `sleep` advances `now` at once and only yields to the event loop."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)
        await asyncio.sleep(0)


class LoadModel(Protocol):
    """The load parameters the engine reads at every step (`SimControl` is one)."""

    slots: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    batch_slowdown: float
    kv_capacity_tokens: int
    prefix_cache_tokens: int


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class Sequence:
    """One request inside the engine; the engine sets its fields, handlers read them."""

    __slots__ = (
        "_changed",
        "admitted_at",
        "cached_tokens",
        "chain",
        "finished_at",
        "first_token_at",
        "generated",
        "max_tokens",
        "prefilled",
        "prompt_tokens",
        "slot",
        "state",
        "submitted_at",
    )

    def __init__(
        self, prompt_tokens: int, max_tokens: int, now: float, chain: PromptChain | None = None
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.chain = chain  # the prompt's prefixes, for the prefix cache
        self.cached_tokens = 0  # prompt tokens found in the prefix cache on admission
        self.generated = 0
        self.prefilled = False
        self.slot = -1
        self.state = SeqState.WAITING
        self.submitted_at = now
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._changed = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.state in (SeqState.FINISHED, SeqState.CANCELLED)

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    async def progress(self) -> None:
        """Wait until the engine changed this sequence (a token, finish or cancel)."""
        if self.done:
            return
        await self._changed.wait()
        self._changed.clear()

    def _notify(self) -> None:
        self._changed.set()


class Engine:
    """Slots, FIFO queue and decode loop of one simulated server (see module docstring)."""

    def __init__(self, load: LoadModel, clock: Clock) -> None:
        self._load = load
        self._clock = clock
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.decode_steps = 0
        self.busy_slot_steps = 0
        self.prefix_cache = PrefixCache()

    # -- what metrics and tests read ------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_tokens(self) -> int:
        return sum(seq.kv_tokens for seq in self._running)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache held by running sequences, 0..1."""
        return min(1.0, self.kv_tokens / max(1, self._load.kv_capacity_tokens))

    def slot_table(self) -> list[Sequence | None]:
        """The sequence in each slot id (None when free), for llama.cpp's `/slots`."""
        size = max([self._load.slots, *(seq.slot + 1 for seq in self._running)])
        table: list[Sequence | None] = [None] * size
        for seq in self._running:
            table[seq.slot] = seq
        return table

    def step_seconds(self, running: int, prefill_tokens: int) -> float:
        """Duration of one step with `running` sequences and that many tokens to prefill."""
        load = self._load
        decode = (1.0 + load.batch_slowdown * max(0, running - 1)) / load.decode_tokens_per_s
        return decode + prefill_tokens / load.prefill_tokens_per_s

    # -- what handlers call ---------------------------------------------------------

    def submit(
        self, prompt_tokens: int, max_tokens: int, chain: PromptChain | None = None
    ) -> Sequence:
        """Queue a sequence; it emits `max_tokens` tokens (0: prefill only, embeddings).

        `chain` (from `prompt_chain`) lets a chat prompt use the prefix cache."""
        seq = Sequence(prompt_tokens, max_tokens, self._clock.now(), chain)
        self._waiting.append(seq)
        self._ensure_loop()
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Drop a sequence (client gone); frees its slot at once. No-op once done."""
        if seq.done:
            return
        if seq.state is SeqState.WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
        seq.state = SeqState.CANCELLED
        seq.finished_at = self._clock.now()
        seq._notify()
        self._wake.set()

    def record_instant(self, prompt_tokens: int, generated: int) -> None:
        """Count a request served without the loop (zero-latency mode) in the token totals."""
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += generated

    async def aclose(self) -> None:
        """Stop the loop task and cancel every sequence (server shutdown)."""
        for seq in [*self._running, *self._waiting]:
            self.cancel(seq)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
        self._wake = asyncio.Event()  # a fresh event for the next event loop, if any

    # -- the loop -------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._task is None or self._task.done():
            if self._task is not None and not self._task.cancelled():
                # A loop that died must not fail silently: surface its error to the caller.
                failure = self._task.exception()
                if failure is not None:
                    raise RuntimeError("simulator engine loop failed") from failure
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    def _admit(self) -> None:
        load = self._load
        held = self.kv_tokens
        while self._waiting and len(self._running) < load.slots:
            seq = self._waiting[0]
            if self._running and held + seq.prompt_tokens > load.kv_capacity_tokens:
                break
            self._waiting.popleft()
            used = {other.slot for other in self._running}
            seq.slot = next(i for i in range(len(used) + 1) if i not in used)
            seq.state = SeqState.RUNNING
            seq.admitted_at = self._clock.now()
            if load.prefix_cache_tokens > 0:
                seq.cached_tokens = self.prefix_cache.lookup(seq.chain, seq.prompt_tokens)
            self._running.append(seq)
            held += seq.prompt_tokens

    async def _run(self) -> None:
        try:
            while True:
                self._admit()
                if not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch = list(self._running)
                prefill = sum(
                    seq.prompt_tokens - seq.cached_tokens for seq in batch if not seq.prefilled
                )
                await self._clock.sleep(self.step_seconds(len(batch), prefill))
                self._finish_step(batch)
        finally:
            # However the loop ends, no handler may wait forever on a sequence it left.
            for seq in [*self._running, *self._waiting]:
                self.cancel(seq)

    def _finish_step(self, batch: list[Sequence]) -> None:
        now = self._clock.now()
        self.decode_steps += 1
        self.busy_slot_steps += len(batch)
        budget = self._load.prefix_cache_tokens
        for seq in batch:
            if seq.state is not SeqState.RUNNING:
                continue  # cancelled while the step ran
            if not seq.prefilled:
                seq.prefilled = True
                self.prompt_tokens_total += seq.prompt_tokens
                if seq.chain is not None and budget > 0:
                    self.prefix_cache.insert(seq.chain, budget)
            if seq.generated < seq.max_tokens:
                seq.generated += 1
                self.generation_tokens_total += 1
                if seq.first_token_at is None:
                    seq.first_token_at = now
            if seq.generated >= seq.max_tokens:
                seq.state = SeqState.FINISHED
                seq.finished_at = now
                self._running.remove(seq)
            seq._notify()
