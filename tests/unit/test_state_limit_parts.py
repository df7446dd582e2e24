"""Tenant limits split over the workers of `serve --workers N` with `state: memory`:
each worker enforces its part (`TenantLimits.part`), the parts sum to the limit, and a
limit smaller than the workers is refused (at start, at a reload, by `config check`).

Before, every worker enforced the whole limit on its own ledger: N workers admitted N
times each limit (requests, tokens and concurrency alike)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from gateway.app import AssemblyError, assemble
from gateway.config.schema import GatewaySettings
from gateway.state import (
    WORKERS_ENV,
    Admission,
    MemoryState,
    RateLimited,
    TenantLimits,
    create_state,
    limit_part,
    unsplittable,
)
from gateway.tenants import tenant_limits
from gateway.validation import validate
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.log_capture import rendered_logs


def _workers(n: int) -> tuple[FakeClock, list[MemoryState]]:
    """The memory states of `n` workers, on one clock."""
    clock = FakeClock()
    states = [MemoryState(clock=clock, parts=n, index=i) for i in range(1, n + 1)]
    return clock, states


async def _admitted(state: MemoryState, limits: TenantLimits, tries: int) -> list[Admission]:
    admitted: list[Admission] = []
    for _ in range(tries):
        with contextlib.suppress(RateLimited):
            admitted.append(await state.acquire("acme", limits))
    return admitted


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("limit", [16, 17, 100, 101, 999, 1_000_003])
def test_the_parts_sum_to_the_limit_and_none_is_empty(limit: int, parts: int) -> None:
    whole = TenantLimits(limit, limit, limit)
    split = [whole.part(i, parts) for i in range(1, parts + 1)]
    assert all(isinstance(p, TenantLimits) for p in split)
    for name in ("requests_per_minute", "tokens_per_minute", "concurrent"):
        values = [p.value(name) for p in split]  # type: ignore[union-attr]
        assert sum(v or 0 for v in values) == limit
        assert max(v or 0 for v in values) - min(v or 0 for v in values) <= 1


def test_a_limit_smaller_than_the_parts_has_no_split() -> None:
    limits = TenantLimits(requests_per_minute=100, concurrent=3)
    assert limits.too_small(4) == ["concurrent"]
    assert limits.part(4, 4) == "concurrent"
    assert TenantLimits(tokens_per_minute=5).part(1, 2) == TenantLimits(tokens_per_minute=3)
    assert TenantLimits().part(2, 3) == TenantLimits()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_workers_admit_a_requests_burst_of_the_limit_in_all(n: int) -> None:
    limits = TenantLimits(requests_per_minute=10)
    clock, states = _workers(n)

    async def run() -> int:
        return sum([len(await _admitted(s, limits, 20)) for s in states])

    assert asyncio.run(run()) == 10  # before: 10 per worker
    clock.now += 60  # a minute later, each part's bucket is full again: 10 in all again
    assert asyncio.run(run()) == 10


def test_workers_hold_the_concurrency_limit_in_all() -> None:
    limits = TenantLimits(concurrent=5)
    _, states = _workers(2)

    async def run() -> None:
        held = [await _admitted(s, limits, 10) for s in states]
        assert [len(h) for h in held] == [3, 2]  # before: [5, 5]
        await held[1][0].release()
        assert len(await _admitted(states[1], limits, 10)) == 1  # its slot, back

    asyncio.run(run())


def test_workers_hold_the_tokens_budget_in_all() -> None:
    limits = TenantLimits(tokens_per_minute=1000)
    _, states = _workers(2)

    async def run() -> None:
        reserved = 0
        for state in states:
            for _ in range(4):
                admission = await state.acquire("acme", limits)
                try:
                    await admission.reserve(300)
                except RateLimited:
                    continue
                reserved += admission.reserved
                await admission.release(admission.reserved)
        assert reserved == 600  # one 300 in each part of 500; before: 1200 (3 per worker)
        used = [s.tenant_use("acme", limits).tokens for s in states]
        assert used == [300, 300]

    asyncio.run(run())


def test_a_request_must_fit_a_workers_part_of_the_tokens_budget() -> None:
    """The budget a request's own answer limit must fit (`Admission.request_budget`,
    gateway/api/reservation.py) is the worker's part: a request asking more than it can
    fit no worker, and was cut to the part and admitted by each (N of them a minute)."""
    limits = TenantLimits(tokens_per_minute=601)
    _, states = _workers(2)
    _, (alone,) = _workers(1)

    async def budgets() -> list[int | None]:
        admissions = [await s.acquire("acme", limits) for s in (*states, alone)]
        return [a.request_budget for a in admissions]

    assert asyncio.run(budgets()) == [301, 300, 601]


def test_a_worker_with_no_part_of_a_limit_refuses_and_says_so() -> None:
    # Refused at start and at a reload (below); should a limit reach the state anyway,
    # the worker with no part of it admits nothing rather than a whole limit.
    state = MemoryState(parts=3, index=3)

    async def run() -> None:
        with pytest.raises(RateLimited) as refused:
            await state.acquire("acme", TenantLimits(requests_per_minute=2))
        assert refused.value.value == 0
        assert "Limit 0" in refused.value.message

    asyncio.run(run())


_WORKER = {RUNTIME_ENV: "/run/owngate/workers", WORKERS_ENV: "4"}


@pytest.mark.parametrize(
    ("index", "part"), [("1", 1), ("4", 4), ("0", 4), ("5", 4), ("x", 4), ("", 1), ("٣", 4)]
)
def test_limit_part_reads_the_worker_index(index: str, part: int) -> None:
    # An index the supervisor never sets counts as the last part (never the whole);
    # without one, the process is no worker.
    assert limit_part({**_WORKER, INDEX_ENV: index}) == part
    assert limit_part({INDEX_ENV: "2"}) == 1


def test_the_status_and_metrics_say_each_worker_holds_a_part() -> None:
    status = create_state("memory", workers=3, worker_index=2).status()
    assert (status.limit_parts, status.limit_copies) == (3, 1)
    assert status.detail()["limit_parts"] == 3
    assert MemoryState().status().limit_parts == 1


def _config(limits: dict[str, int], state: dict[str, str] | None = None) -> GatewaySettings:
    tenants = [
        {"id": "acme", "models": ["*"], "limits": limits},
        {"id": "free", "models": ["*"]},
    ]
    extra: dict[str, object] = {"tenants": tenants}
    if state is not None:
        extra["state"] = state
    return gateway_config([backend("gpu", "http://127.0.0.1:9", "m")], **extra)


def test_unsplittable_names_the_tenant_the_limit_and_the_fix() -> None:
    (problem,) = unsplittable(
        [("acme", TenantLimits(requests_per_minute=1, concurrent=2)), ("b", TenantLimits())], 3
    )
    assert problem.startswith("tenant acme: requests_per_minute 1, concurrent_requests 2 ")
    assert "state: redis" in problem
    assert unsplittable([("acme", TenantLimits(requests_per_minute=1))], 1) == []


def test_a_worker_refuses_a_config_whose_limit_it_cannot_split(tmp_path: Path) -> None:
    """At a worker's start one tenant's `concurrent_requests: 1` under 2 workers refuses
    the config (a typo guard: nothing serves)."""
    environ = {**_WORKER, WORKERS_ENV: "2", INDEX_ENV: "2"}
    config = _config({"concurrent_requests": 1})
    with pytest.raises(AssemblyError) as refused:
        assemble(config, environ, config_dir=tmp_path)
    assert any(
        "concurrent_requests 1 is less than the 2 workers" in p for p in refused.value.problems
    )
    # one process, or Redis (shared whole limits): nothing to split
    assemble(config, {}, config_dir=tmp_path)


@pytest.mark.parametrize("index", ["1", "2"])
def test_a_reload_lowering_a_limit_below_the_workers_refuses_the_tenant(
    tmp_path: Path, index: str
) -> None:
    """An operator throttles a tenant under `serve --workers 2` by lowering its
    `requests_per_minute` to 1. Refused at the reload (no split holds it), the reload
    failed and the tenant kept its wider limit, 1,000 a minute. Now the reload applies,
    a warning names the tenant, and every worker refuses its requests (429, limit 0)
    until the limit is raised; a worker's start still refuses such a config."""
    environ = {**_WORKER, WORKERS_ENV: "2", INDEX_ENV: index}
    running = assemble(_config({"requests_per_minute": 1000}), environ, config_dir=tmp_path)
    with rendered_logs("json", "warning") as logs:
        parts = assemble(
            _config({"requests_per_minute": 1}), environ, config_dir=tmp_path, running=running
        )
    assert "requests_per_minute 1 is less than the 2 workers" in logs.getvalue()
    acme = tenant_limits(parts.config.tenants[0])
    assert acme.requests_per_minute == 1

    async def admitted() -> None:
        await parts.state.acquire("acme", acme)

    with pytest.raises(RateLimited) as refused:
        asyncio.run(admitted())
    assert refused.value.value == 0


def test_config_check_with_workers_refuses_an_unsplittable_limit(tmp_path: Path) -> None:
    config = _config({"requests_per_minute": 3})
    assert validate(config, environ={}, config_dir=tmp_path, workers=3) == []
    (problem,) = validate(config, environ={}, config_dir=tmp_path, workers=4)
    assert "requests_per_minute 3 is less than the 4 workers" in problem
    redis = _config(
        {"requests_per_minute": 3}, {"backend": "redis", "url": "redis://127.0.0.1:1/0"}
    )
    assert validate(redis, environ={}, config_dir=tmp_path, workers=4) == []
