"""MemoryState: tenant limits as table-driven cases on an injected clock, in-flight
counters, revocations, and the 429 details the API layer turns into a response."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass

import pytest

from gateway.config import ConfigError, parse_config
from gateway.state import (
    Admission,
    MemoryState,
    RateLimited,
    SharedState,
    TenantLimits,
    TenantUse,
    create_state,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Admit:
    """Acquire once; `refused` names the limit expected to refuse, with its retry."""

    refused: str | None = None
    retry_s: float | None = None
    tenant: str = "t1"


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Release:
    """Release the oldest admission still held, charging `tokens`."""

    tokens: int = 0


@dataclass(frozen=True)
class Reserve:
    """Reserve `tokens` on the newest admission held; `retry_s`: expected refused (TPM)."""

    tokens: int
    retry_s: float | None = None


Step = Admit | Advance | Release | Reserve
RPM = "requests_per_minute"
TPM = "tokens_per_minute"
BURST_60: list[Step] = [Admit()] * 60
MANY: list[Step] = [Admit()] * 500
DAYS_30 = 30 * 24 * 3600.0
CASES: dict[str, tuple[TenantLimits, list[Step]]] = {
    "rpm burst then one per interval": (
        TenantLimits(requests_per_minute=3),
        [
            Admit(),
            Admit(),
            Admit(),
            Admit(RPM, 20.0),
            Advance(20.0),
            Admit(),
            Admit(RPM, 20.0),
            Advance(5.0),
            Admit(RPM, 15.0),
        ],
    ),
    "rpm 60: a burst of 60, then one a second": (
        TenantLimits(requests_per_minute=60),
        [*BURST_60, Admit(RPM, 1.0), Advance(0.25), Admit(RPM, 0.75), Advance(0.75), Admit()],
    ),
    "a refused request costs nothing": (
        TenantLimits(requests_per_minute=1),
        [Admit(), Admit(RPM, 60.0), Advance(59.0), Admit(RPM, 1.0), Advance(1.0), Admit()],
    ),
    # 1200 tokens used = 72 s of budget; admissions resume once it is under 60 s
    "tpm counted from usage as responses complete": (
        TenantLimits(tokens_per_minute=1000),
        [
            Admit(),
            Release(600),
            Admit(),
            Release(600),
            Admit(TPM, 12.000001),
            Advance(12.000001),
            Admit(),
        ],
    ),
    "one response over the whole tpm budget": (
        TenantLimits(tokens_per_minute=1000),
        [Admit(), Release(3000), Admit(TPM, 120.000001), Advance(120.000001), Admit()],
    ),
    # usage is the backend's word: the debt stops at 30 days (as on Redis), and a
    # refusal's wait is then 30 days less the minute's budget
    "tpm debt is capped at 30 days": (
        TenantLimits(tokens_per_minute=1000),
        [Admit(), Release(2**53), Admit(TPM, DAYS_30 - 60 + 1e-6), Advance(DAYS_30), Admit()],
    ),
    # at the budget's edge the wait is a microsecond, reported as the 1 ms floor
    "tpm replenishes continuously": (
        TenantLimits(tokens_per_minute=600),
        [Admit(), Release(600), Admit(TPM, 0.001), Advance(0.1), Admit()],
    ),
    # 400 tokens reserve 24 s of the minute: two fit, the third waits 12 s (72 - 60)
    "reservations bound a burst": (
        TenantLimits(tokens_per_minute=1000),
        [
            Admit(),
            Reserve(400),
            Admit(),
            Reserve(400),
            Admit(),
            Reserve(400, 12.0),
            Advance(12.0),
            Reserve(400),
            Admit(TPM, 0.001),  # the whole minute is reserved
        ],
    ),
    "settling refunds what was reserved and not used": (
        TenantLimits(tokens_per_minute=1000),
        [
            Admit(),
            Reserve(1000),
            Admit(TPM, 0.001),
            Release(100),  # 900 of the 1000 back: 6 s of the minute spent
            Admit(),
            Reserve(900),
            Admit(TPM, 0.001),
        ],
    ),
    "a request that reached no backend is refunded all": (
        TenantLimits(tokens_per_minute=1000),
        [Admit(), Reserve(600), Release(0), Admit(), Reserve(1000), Admit(TPM, 0.001)],
    ),
    # cut to the whole budget; the usage past it is charged when it ends
    "a reservation over the budget is cut to it, the rest charged at release": (
        TenantLimits(tokens_per_minute=1000),
        [
            Admit(),
            Reserve(5000),
            Admit(TPM, 0.001),
            Release(3000),
            Admit(TPM, 120.000001),
            Advance(120.000001),
            Admit(),
            Reserve(1000, 59.999999),
            Advance(59.999999),
            Reserve(1000),
        ],
    ),
    "no tokens limit: nothing reserved": (
        TenantLimits(requests_per_minute=1000),
        [Admit(), Reserve(10**9), Admit(), Reserve(10**9)],
    ),
    "concurrency frees a slot on release": (
        TenantLimits(concurrent=2),
        [Admit(), Admit(), Admit("concurrent", 1.0), Release(), Admit(), Admit("concurrent", 1.0)],
    ),
    "the longest wait names the limit": (
        TenantLimits(requests_per_minute=2, concurrent=1),
        [Admit(), Admit("concurrent", 1.0), Release(), Admit(), Admit(RPM, 30.0)],
    ),
    "tenants are independent": (
        TenantLimits(concurrent=1),
        [Admit(), Admit("concurrent", 1.0), Admit(tenant="t2"), Admit("concurrent", 1.0, "t2")],
    ),
    "no limits: nothing counted": (TenantLimits(), MANY),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_limits(name: str) -> None:
    limits, steps = CASES[name]
    clock = Clock()
    state = MemoryState(clock=clock)
    held: list[Admission] = []

    async def run() -> None:
        for index, step in enumerate(steps):
            where = f"{name}, step {index}: {step}"
            if isinstance(step, Advance):
                clock.now += step.seconds
            elif isinstance(step, Release):
                await held.pop(0).release(step.tokens)
            elif isinstance(step, Reserve) and step.retry_s is None:
                await held[-1].reserve(step.tokens)
            elif isinstance(step, Reserve):
                with pytest.raises(RateLimited) as caught:
                    await held[-1].reserve(step.tokens)
                assert caught.value.limit == TPM, where
                assert caught.value.retry_after_s == pytest.approx(step.retry_s, abs=1e-6), where
            elif step.refused is None:
                held.append(await state.acquire(step.tenant, limits))
            else:
                with pytest.raises(RateLimited) as caught:
                    await state.acquire(step.tenant, limits)
                assert caught.value.limit == step.refused, where
                assert caught.value.retry_after_s == pytest.approx(step.retry_s, abs=1e-6), where

    asyncio.run(run())


def test_release_twice_frees_one_slot() -> None:
    state = MemoryState(clock=Clock())
    limits = TenantLimits(concurrent=2)

    async def run() -> None:
        first = await state.acquire("t", limits)
        await state.acquire("t", limits)
        await first.release()
        await first.release()
        assert first.released
        await state.acquire("t", limits)
        with pytest.raises(RateLimited):
            await state.acquire("t", limits)

    asyncio.run(run())


def test_rate_limited_renders_the_openai_details() -> None:
    error = RateLimited("acme", "requests_per_minute", 60, 0.2)
    assert error.retry_after_header == b"1"
    assert error.error_type == "requests"
    assert error.message == (
        "Rate limit reached for tenant acme on requests per min (RPM): Limit 60. "
        "Please try again in 200ms."
    )
    tokens = RateLimited("acme", "tokens_per_minute", 1000, 12.3)
    assert tokens.retry_after_header == b"13"
    assert tokens.error_type == "tokens"
    assert "Please try again in 12.3s." in tokens.message
    assert RateLimited("acme", "concurrent", 1, 0.0).retry_after_s > 0


@pytest.mark.parametrize(
    ("limits", "replicas", "share"),
    [
        (TenantLimits(100, 1000, 10), 1, TenantLimits(100, 1000, 10)),
        (TenantLimits(100, 1000, 10), 3, TenantLimits(34, 334, 4)),
        (TenantLimits(1, None, 1), 4, TenantLimits(1, None, 1)),
        (TenantLimits(), 5, TenantLimits()),
    ],
)
def test_limits_split_over_replicas(
    limits: TenantLimits, replicas: int, share: TenantLimits
) -> None:
    assert limits.share(replicas) == share


@pytest.mark.parametrize("field", ["requests_per_minute", "tokens_per_minute", "concurrent"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TenantLimits(**{field: 0})


def test_inflight_and_revocations() -> None:
    state: SharedState = MemoryState()

    async def run() -> None:
        told: list[object] = []
        state.watch_peers(told.append)
        await state.start()
        state.backend_started("a")
        state.backend_started("a")
        state.backend_finished("a")
        state.backend_finished("b")  # never below zero
        assert (state.inflight("a"), state.local_inflight("a"), state.inflight("b")) == (1, 1, 0)
        assert told == []  # one process: no other replicas to hear of
        assert await state.revoke_key("sha256:" + "0" * 64)
        assert state.is_revoked("sha256:" + "0" * 64)
        assert not state.is_revoked("sha256:" + "1" * 64)
        with pytest.raises(ValueError, match="key hash"):
            await state.revoke_key("")
        assert state.healthy and state.degraded_reason is None
        assert state.status().detail()["backend"] == "memory"
        await state.close()

    asyncio.run(run())


def test_memory_state_never_imports_redis() -> None:
    code = (
        "import sys\n"
        "from gateway.state import create_state\n"
        "create_state('memory')\n"
        "assert 'redis' not in sys.modules, 'redis imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_redis_backend_needs_a_url() -> None:
    with pytest.raises(ValueError, match="url"):
        create_state("redis")


def test_state_settings_are_checked_when_the_config_loads() -> None:
    base = (
        "backends: [{id: g, kind: vllm, base_url: 'http://h:9', models: [{name: m}],\n"
        "            region: eu, owner: t}]\n"
        "state: {backend: redis, url: 'redis://127.0.0.1:1/0', %s}\n"
    )
    config = parse_config(base % "sync_interval_s: 0.05, lease_ttl_s: 1.5, replica_id: gw-0")
    assert (config.state.sync_interval_s, config.state.replica_id) == (0.05, "gw-0")
    for bad, message in [
        ("sync_interval_s: 1, lease_ttl_s: 2", "three sync intervals"),
        ("replica_id: 'a|b'", "replica_id"),
        ("max_connections: 1", "max_connections"),
        ("timeout_ms: 0", "timeout_ms"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config(base % bad)


def test_tenant_use_is_what_the_limits_have_taken_in_the_window() -> None:
    clock = Clock()
    state = MemoryState(clock=clock)
    limits = TenantLimits(requests_per_minute=6, tokens_per_minute=600, concurrent=2)
    assert state.tenant_use("t1", limits) == TenantUse(0, 0, 0, reserved=0)
    assert state.tenant_use("t1", TenantLimits()) == TenantUse(None, None, None)

    async def run() -> None:
        first = await state.acquire("t1", limits)
        second = await state.acquire("t1", limits)
        await state.acquire("t2", limits)
        assert state.tenant_use("t1", limits) == TenantUse(2, 2, 0, reserved=0)
        await first.reserve(200)
        await second.reserve(100)
        # reserved tokens count in the window's use until the request settles
        assert state.tenant_use("t1", limits) == TenantUse(2, 2, 300, reserved=300)
        await first.release(tokens_used=300)
        assert state.tenant_use("t1", limits) == TenantUse(1, 2, 400, reserved=100)
        await second.release(tokens_used=0)
        assert state.tenant_use("t1", limits) == TenantUse(0, 2, 300, reserved=0)
        clock.now += 15  # a quarter of the window: 1.5 requests' and 150 tokens' worth back
        assert state.tenant_use("t1", limits) == TenantUse(0, 1, 150, reserved=0)
        clock.now += 60
        assert state.tenant_use("t1", limits) == TenantUse(0, 0, 0, reserved=0)

    asyncio.run(run())
