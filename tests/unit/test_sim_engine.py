"""Unit tests of the simulator's engine, on virtual time: queueing, batching, KV, cancel,
prefix cache."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.sim import Engine, SeqState, Sequence, SimControl, SimSettings, VirtualClock
from gateway.sim.prefix import PrefixCache, prompt_chain
from gateway.sim.text import chat_prompt_tokens
from tests.helpers.waiting import until_async


def _control(
    *,
    slots: int = 4,
    prefill: float = 1000.0,
    decode: float = 10.0,
    slowdown: float = 0.5,
    kv: int = 100_000,
    prefix_cache: int | None = None,
) -> SimControl:
    settings = SimSettings(
        slots=slots,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        batch_slowdown=slowdown,
        kv_capacity_tokens=kv,
        prefix_cache_tokens=prefix_cache,
    )
    return SimControl.from_settings(settings, 0.0)


def _state(seq: Sequence) -> SeqState:
    """The state, read through a call so mypy does not narrow it across awaits."""
    return seq.state


async def _drain(seq: Sequence) -> None:
    for _ in range(100_000):  # bounded: a sequence never needs this many wake-ups
        if seq.done:
            return
        await seq.progress()
    raise AssertionError("sequence never finished")


def _run(test: Callable[[Engine, VirtualClock], Awaitable[None]], control: SimControl) -> None:
    async def main() -> None:
        clock = VirtualClock()
        engine = Engine(control, clock)
        try:
            await test(engine, clock)
        finally:
            await engine.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("running", "prefill_tokens", "expected"),
    [
        (1, 0, 0.1),  # alone: 1 / decode_tokens_per_s
        (2, 0, 0.15),  # one more sequence: +50 %
        (5, 0, 0.3),  # 1 + 0.5 * 4
        (1, 500, 0.6),  # prefill of 500 tokens at 1000 tokens/s on top
    ],
)
def test_step_seconds(running: int, prefill_tokens: int, expected: float) -> None:
    engine = Engine(_control(), VirtualClock())
    assert engine.step_seconds(running, prefill_tokens) == pytest.approx(expected)


def test_single_sequence_timing() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        seq = engine.submit(prompt_tokens=100, max_tokens=3)
        await _drain(seq)
        assert seq.state is SeqState.FINISHED
        assert seq.generated == 3
        # First step: decode 0.1 s + prefill 100 / 1000 = 0.2 s; then two decode steps.
        assert seq.first_token_at == pytest.approx(0.2)
        assert seq.finished_at == pytest.approx(0.4)
        assert engine.prompt_tokens_total == 100
        assert engine.generation_tokens_total == 3
        assert engine.running == 0

    _run(test, _control())


def test_fifo_queue_when_slots_are_full() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        seqs = [engine.submit(prompt_tokens=0, max_tokens=2) for _ in range(3)]
        await until_async(lambda: engine.running == 1, "engine.running == 1", interval=0)
        assert engine.waiting == 2
        assert [s.state for s in seqs] == [SeqState.RUNNING, SeqState.WAITING, SeqState.WAITING]
        await asyncio.gather(*(_drain(s) for s in seqs))
        finished = [s.finished_at for s in seqs]
        assert finished == pytest.approx([0.2, 0.4, 0.6])
        admitted = [s.admitted_at or 0.0 for s in seqs]
        assert admitted == sorted(admitted)

    _run(test, _control(slots=1))


def test_decode_slows_as_the_batch_grows() -> None:
    async def alone(engine: Engine, clock: VirtualClock) -> None:
        seq = engine.submit(prompt_tokens=0, max_tokens=10)
        await _drain(seq)
        assert seq.finished_at == pytest.approx(1.0)

    async def batched(engine: Engine, clock: VirtualClock) -> None:
        seqs = [engine.submit(prompt_tokens=0, max_tokens=10) for _ in range(4)]
        await asyncio.gather(*(_drain(s) for s in seqs))
        # Four running: each step takes 0.1 * (1 + 0.5 * 3) = 0.25 s.
        assert [s.finished_at for s in seqs] == pytest.approx([2.5] * 4)
        assert engine.busy_slot_steps == 40
        assert engine.decode_steps == 10

    _run(alone, _control())
    _run(batched, _control())


def test_cancel_frees_the_slot_for_the_next_in_line() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        first = engine.submit(prompt_tokens=0, max_tokens=1000)
        second = engine.submit(prompt_tokens=0, max_tokens=1)
        await until_async(lambda: first.generated >= 2, "first.generated >= 2", interval=0)
        assert second.state is SeqState.WAITING
        engine.cancel(first)
        assert first.state is SeqState.CANCELLED
        assert engine.running == 0
        await _drain(second)
        assert _state(second) is SeqState.FINISHED
        engine.cancel(second)  # no-op once done
        assert _state(second) is SeqState.FINISHED

    _run(test, _control(slots=1))


def test_cancel_while_waiting() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        engine.submit(prompt_tokens=0, max_tokens=1000)
        waiting = engine.submit(prompt_tokens=0, max_tokens=1)
        await until_async(lambda: engine.running == 1, "engine.running == 1", interval=0)
        engine.cancel(waiting)
        assert engine.waiting == 0
        assert waiting.done

    _run(test, _control(slots=1))


def test_kv_usage_and_admission_by_kv_capacity() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        first = engine.submit(prompt_tokens=100, max_tokens=1000)
        second = engine.submit(prompt_tokens=100, max_tokens=1)
        await until_async(lambda: first.generated >= 3, "first.generated >= 3", interval=0)
        # The second prompt does not fit next to the first: it waits despite free slots.
        assert engine.running == 1
        assert engine.waiting == 1
        assert engine.kv_tokens == 100 + first.generated
        assert engine.kv_usage == pytest.approx((100 + first.generated) / 150)
        engine.cancel(first)
        await _drain(second)
        assert second.state is SeqState.FINISHED

    _run(test, _control(slots=4, kv=150))


def test_slots_changed_at_run_time_admit_waiting_sequences() -> None:
    control = _control(slots=1)

    async def test(engine: Engine, clock: VirtualClock) -> None:
        a = engine.submit(prompt_tokens=0, max_tokens=1000)
        b = engine.submit(prompt_tokens=0, max_tokens=1000)
        await until_async(lambda: a.generated >= 1, "a.generated >= 1", interval=0)
        assert b.state is SeqState.WAITING
        control.slots = 2
        await until_async(
            lambda: b.state is SeqState.RUNNING, "b.state is SeqState.RUNNING", interval=0
        )
        assert {a.slot, b.slot} == {0, 1}
        assert [s is not None for s in engine.slot_table()] == [True, True]

    _run(test, control)


def test_prefill_only_sequence_finishes_without_tokens() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        seq = engine.submit(prompt_tokens=50, max_tokens=0)
        await _drain(seq)
        assert seq.state is SeqState.FINISHED
        assert seq.generated == 0
        assert seq.finished_at == pytest.approx(0.1 + 0.05)

    _run(test, _control())


def test_aclose_cancels_everything() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        seqs = [engine.submit(prompt_tokens=0, max_tokens=1000) for _ in range(3)]
        await until_async(lambda: engine.running == 1, "engine.running == 1", interval=0)
        await engine.aclose()
        assert all(s.state is SeqState.CANCELLED for s in seqs)
        assert engine.running == engine.waiting == 0

    _run(test, _control(slots=1))


# -- prefix cache ------------------------------------------------------------------------


def _msg(role: str, size: int, fill: str = "s") -> dict[str, str]:
    """A message of `size` ASCII bytes (size / 4 tokens)."""
    return {"role": role, "content": fill * size}


def _submit(engine: Engine, messages: list[dict[str, str]], max_tokens: int = 1) -> Sequence:
    chain = prompt_chain(messages)
    assert chain is not None
    return engine.submit(chat_prompt_tokens(messages), max_tokens, chain)


def test_prompt_chain_counts_tokens_at_each_message_boundary() -> None:
    chain = prompt_chain([_msg("system", 400), _msg("user", 41), _msg("assistant", 3)])
    assert chain is not None
    assert chain.tokens == (100, 111, 111)  # ceil(bytes / 4) of each prefix, as the prompt
    assert [chain.segment(i) for i in range(3)] == [100, 11, 0]
    assert len(set(chain.digests)) == 3
    # A prefix's digest depends on every message before it, not only on its last one.
    other = prompt_chain([_msg("system", 400, "x"), _msg("user", 41)])
    assert other is not None and other.digests[1] != chain.digests[1]
    assert prompt_chain([]) is None
    assert prompt_chain("a prompt") is None


def test_prefix_cache_hit_prefills_only_the_tokens_after_the_prefix() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        system = _msg("system", 400)  # 100 tokens
        first = _submit(engine, [system, _msg("user", 40, "a")])  # 110 tokens
        await _drain(first)
        # Cold: decode 0.1 s + prefill 110 / 1000 tokens/s.
        assert first.cached_tokens == 0
        assert first.first_token_at == pytest.approx(0.1 + 0.110)
        start = clock.now()
        second = _submit(engine, [system, _msg("user", 40, "b")])
        await _drain(second)
        # Warm: the system prompt is cached, only the 10 user tokens are prefilled.
        assert second.cached_tokens == 100
        assert (second.first_token_at or 0.0) - start == pytest.approx(0.1 + 0.010)
        cache = engine.prefix_cache
        assert (cache.queries, cache.hits) == (220, 100)
        assert engine.prompt_tokens_total == 220  # cached tokens still count as prompt

    _run(test, _control())


def test_follow_up_turn_reuses_the_whole_previous_prompt() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        turn1 = [_msg("system", 400), _msg("user", 200, "q")]
        await _drain(_submit(engine, turn1))
        turn2 = [*turn1, _msg("assistant", 80, "r"), _msg("user", 40, "t")]
        follow_up = _submit(engine, turn2)
        await _drain(follow_up)
        assert follow_up.cached_tokens == 150  # system + first question, not the answer
        # The same messages as a new conversation's opening share only the system prompt.
        fresh = _submit(engine, [_msg("system", 400), _msg("user", 200, "z")])
        await _drain(fresh)
        assert fresh.cached_tokens == 100

    _run(test, _control())


def test_single_message_prompt_has_no_cacheable_prefix() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        messages = [_msg("user", 400)]
        await _drain(_submit(engine, messages))
        again = _submit(engine, messages)
        await _drain(again)
        assert again.cached_tokens == 0  # the last message is always prefilled

    _run(test, _control())


def test_prefix_cache_budget_evicts_least_recently_used_leaves_first() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        system = _msg("system", 400)  # 100 tokens
        for user in "abc":  # each prompt adds its own 10-token leaf under the system prompt
            await _drain(_submit(engine, [system, _msg("user", 40, user)]))
        assert engine.prefix_cache.tokens == 100 + 3 * 10
        await _drain(_submit(engine, [_msg("system", 400, "o"), _msg("user", 40)]))
        # 130 + 110 > 210: the three oldest entries are the leaves; the shared system
        # prompt, touched after each of its leaves, outlives them.
        cache = engine.prefix_cache
        assert (cache.tokens, len(cache)) == (210, 3)
        probe = _submit(engine, [system, _msg("user", 40, "d")])
        await _drain(probe)
        assert probe.cached_tokens == 100

    _run(test, _control(prefix_cache=210))


def test_prefix_cache_never_orphans_an_entry() -> None:
    cache = PrefixCache()
    parent = prompt_chain([_msg("system", 400), _msg("user", 40)])
    assert parent is not None
    cache.insert(parent, budget=1000)
    assert len(cache) == 2
    cache.evict(105)  # one entry must go: the leaf, never the prefix it extends
    assert len(cache) == 1
    assert cache.lookup(parent, 110) == 100
    cache.evict(0)
    assert (len(cache), cache.tokens) == (0, 0)


def test_prefix_cache_off_with_zero_budget() -> None:
    async def test(engine: Engine, clock: VirtualClock) -> None:
        messages = [_msg("system", 400), _msg("user", 40)]
        await _drain(_submit(engine, messages))
        again = _submit(engine, messages)
        await _drain(again)
        assert again.cached_tokens == 0
        assert again.finished_at == pytest.approx(2 * (0.1 + 0.110))
        cache = engine.prefix_cache
        assert (len(cache), cache.queries, cache.hits) == (0, 0, 0)

    _run(test, _control(prefix_cache=0))


def test_prefix_cache_default_budget_is_half_the_kv_cache() -> None:
    assert SimSettings(kv_capacity_tokens=1000).prefix_cache_budget == 500
    assert SimSettings(prefix_cache_tokens=0).prefix_cache_budget == 0
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        SimSettings(prefix_cache_tokens=-1)
