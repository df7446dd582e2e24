"""How much of a backend's pool one tenant may hold (gateway/upstream/tenant_share.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.app import AssemblyError, assemble
from gateway.config.schema import LimitSettings
from gateway.state import WORKERS_ENV
from gateway.tenants import hash_api_key
from gateway.upstream.tenant_share import TenantShare, hosted_calls, share_cap, share_unsplittable
from gateway.validation import validate
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, backend, gateway_config, hosted_backend


@pytest.mark.parametrize(
    ("pool", "share", "tenants", "cap"),
    [
        (256, 0.5, 2, 128),
        (2, 0.5, 2, 1),
        (1, 0.5, 3, 1),  # at least one connection, whatever the share
        (10, 0.25, 5, 2),
        (256, 0.5, 1, None),  # one tenant: the whole pool is its own
        (256, 0.5, 0, None),
        (256, 1.0, 4, None),  # a share of the whole pool: no bound
    ],
)
def test_share_cap(pool: int, share: float, tenants: int, cap: int | None) -> None:
    assert share_cap(pool, share, tenants) == cap


def test_the_default_share_leaves_other_tenants_part_of_the_pool() -> None:
    limits = LimitSettings()
    assert limits.tenant_share_of_backend == 0.5
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="tenant_share_of_backend"):
            LimitSettings(tenant_share_of_backend=bad)


def test_a_failed_or_cancelled_take_gives_the_share_back() -> None:
    share = TenantShare(1)

    async def failing() -> object:
        raise OSError("refused")

    async def run() -> None:
        for _ in range(5):  # a leak of one would leave the tenant busy on the next round
            with pytest.raises(OSError, match="refused"):
                await share.take("acme", failing)  # type: ignore[arg-type]
            assert share.held("acme") == 0
            waiting = asyncio.create_task(share.take("acme", asyncio.Event().wait))  # type: ignore[arg-type]
            for _turn in range(100):
                if share.held("acme"):
                    break
                await asyncio.sleep(0)
            assert share.held("acme") == 1
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert share.held("acme") == 0

    asyncio.run(run())


def _tenants(*with_models: str) -> list[dict[str, object]]:
    keys = {"acme": TENANT_KEY, "limited": OTHER_KEY}
    return [
        {"id": t, "api_key_hashes": [hash_api_key(k)], "models": ["*"] if t in with_models else []}
        for t, k in keys.items()
    ]


def test_a_reload_that_changes_the_tenants_sets_the_kept_pools_share(tmp_path: Path) -> None:
    # The share depends on how many tenants may use a model, which is neither the backend's
    # settings nor `limits`: a reload keeps the pool, and must set its share anew.
    backends = [backend("gpu", "http://127.0.0.1:9", "m")]
    first = assemble(gateway_config(backends, tenants=_tenants("acme")), {}, config_dir=tmp_path)
    pool = first.registry.backends["gpu"].pool
    assert pool is not None and pool.share.cap is None  # one tenant: the whole pool
    both = gateway_config(backends, tenants=_tenants("acme", "limited"))
    second = assemble(both, {}, config_dir=tmp_path, running=first)
    assert second.registry.backends["gpu"].pool is pool  # kept, connections and all
    assert pool.share.cap == 128  # a second tenant: each holds at most half of 256
    alone = gateway_config(backends, tenants=_tenants("limited"))
    third = assemble(alone, {}, config_dir=tmp_path, running=second)
    assert third.registry.backends["gpu"].pool is pool
    assert pool.share.cap is None


@pytest.mark.parametrize(
    ("pool", "workers", "parts"),
    [
        (256, 2, [64, 64]),  # a share of 128 over 2 workers
        (10, 3, [2, 2, 1]),  # 5 over 3: one more for the first 5 % 3
        (4, 2, [1, 1]),
        (2, 2, [1, 0]),  # 1 over 2: no split (share_unsplittable refuses it)
    ],
)
def test_each_worker_holds_a_tenant_to_its_part_of_the_share(
    pool: int, workers: int, parts: list[int]
) -> None:
    got = [share_cap(pool, 0.5, 2, index, workers) or 0 for index in range(1, workers + 1)]
    assert got == parts
    assert sum(got) == share_cap(pool, 0.5, 2)  # the parts sum to one process's share
    assert share_cap(pool, 0.5, 1, 1, workers) is None  # one tenant: no bound, as before
    assert share_cap(pool, 1.0, 2, 1, workers) is None


def test_a_share_smaller_than_the_workers_is_unsplittable() -> None:
    problem = share_unsplittable(2, 0.5, 2, 2)
    assert problem is not None
    assert "is 1, less than the 2 workers of serve --workers 2" in problem
    assert "max_connections_per_backend" in problem and "fewer workers" in problem
    assert share_unsplittable(4, 0.5, 2, 2) is None
    assert share_unsplittable(2, 0.5, 2, 1) is None  # one process
    assert share_unsplittable(2, 0.5, 1, 2) is None  # one tenant: no share
    assert share_unsplittable(2, 1.0, 2, 2) is None  # the share turned off


def _worker(index: int, workers: int, runtime: Path) -> dict[str, str]:
    return {WORKERS_ENV: str(workers), INDEX_ENV: str(index), RUNTIME_ENV: str(runtime)}


def test_a_worker_builds_its_pools_with_its_part_and_refuses_a_reload_it_cannot_split(
    tmp_path: Path,
) -> None:
    """At a worker's start (`assemble`) and at each reload (with the running assembly),
    whatever the state: pools are each worker's own."""
    backends = [backend("gpu", "http://127.0.0.1:9", "m")]
    both = _tenants("acme", "limited")
    sized = gateway_config(backends, tenants=both, limits={"max_connections_per_backend": 10})
    caps = []
    for index in (1, 2, 3):
        built = assemble(sized, _worker(index, 3, tmp_path), config_dir=tmp_path)
        pool = built.registry.backends["gpu"].pool
        assert pool is not None
        caps.append(pool.share.cap)
    assert caps == [2, 2, 1]  # 5 of 10, split over 3 workers
    small = gateway_config(backends, tenants=both, limits={"max_connections_per_backend": 4})
    with pytest.raises(AssemblyError) as refused:
        assemble(small, _worker(2, 3, tmp_path), config_dir=tmp_path)
    assert any("less than the 3 workers" in p for p in refused.value.problems)
    running = assemble(sized, _worker(3, 3, tmp_path), config_dir=tmp_path)
    with pytest.raises(AssemblyError):  # a reload bringing it: the running config stays
        assemble(small, _worker(3, 3, tmp_path), config_dir=tmp_path, running=running)
    assemble(small, {}, config_dir=tmp_path)  # one process: its share of 2 holds


def test_config_check_with_workers_refuses_an_unsplittable_share(tmp_path: Path) -> None:
    backends = [backend("gpu", "http://127.0.0.1:9", "m")]
    config = gateway_config(
        backends,
        tenants=_tenants("acme", "limited"),
        limits={"max_connections_per_backend": 6},  # a share of 3
    )
    assert validate(config, environ={}, config_dir=tmp_path, workers=3) == []
    (problem,) = validate(config, environ={}, config_dir=tmp_path, workers=4)
    assert "tenant_share_of_backend" in problem and "less than the 4 workers" in problem


def test_hold_counts_a_tenants_hosted_calls_within_its_share() -> None:
    share = TenantShare(1)
    assert share.hold("acme")
    assert not share.hold("acme")  # past its share: refused, nothing counted
    assert share.held("acme") == 1
    assert share.hold("other")  # another tenant's share is its own
    share.release("acme")
    assert share.held("acme") == 0 and share.hold("acme")
    unbounded = TenantShare(None)  # one tenant: no bound, but each call counted
    assert all(unbounded.hold("acme") for _ in range(3))
    unbounded.cap = 1  # a reload bounds it while the calls run
    assert not unbounded.hold("acme")
    for _ in range(3):
        unbounded.release("acme")  # the calls counted before the reload end
    assert unbounded.held("acme") == 0 and unbounded.hold("acme")


def test_a_hosted_backends_calls_are_shared_split_and_reloaded_as_a_pool_is(
    tmp_path: Path,
) -> None:
    """Its share of `max_connections_per_backend`, set anew by a reload that keeps it, and
    split over `serve --workers N` as a pool's is."""
    backends = [hosted_backend("hosted", "http://127.0.0.1:9/v1", "m")]
    env = {"HOSTED_KEY": "test-key"}
    first = assemble(gateway_config(backends, tenants=_tenants("acme")), env, config_dir=tmp_path)
    state = first.registry.backends["hosted"]
    assert state.pool is None and state.share is state.calls
    calls = state.calls
    assert calls is not None and calls.cap is None  # one tenant: the whole backend
    both = gateway_config(backends, tenants=_tenants("acme", "limited"))
    second = assemble(both, env, config_dir=tmp_path, running=first)
    assert second.registry.backends["hosted"].calls is calls  # kept, calls counted and all
    assert calls.cap == 128  # a second tenant: each holds at most half of 256
    sized = gateway_config(
        backends, tenants=_tenants("acme", "limited"), limits={"max_connections_per_backend": 10}
    )
    caps = []
    for index in (1, 2, 3):
        built = assemble(sized, {**env, **_worker(index, 3, tmp_path)}, config_dir=tmp_path)
        split = built.registry.backends["hosted"].calls
        assert split is not None
        caps.append(split.cap)
    assert caps == [2, 2, 1]  # 5 of 10, split over 3 workers


def test_a_hosted_backends_share_is_of_the_calls_litellm_makes_at_once(tmp_path: Path) -> None:
    # LiteLLM's connector makes 500 calls per host at once: with 1,024 connections per
    # backend configured, half of them (512) let one tenant's streams hold every one.
    limits = {"max_connections_per_backend": 1024}
    backends = [backend("gpu", "http://127.0.0.1:9", "m"), hosted_backend("h", "http://h/v1", "m")]
    both = gateway_config(backends, tenants=_tenants("acme", "limited"), limits=limits)
    registry = assemble(both, {"HOSTED_KEY": "k"}, config_dir=tmp_path).registry
    pool, calls = registry.backends["gpu"].pool, registry.backends["h"].calls
    assert pool is not None and pool.share.cap == 512  # of the pool's own 1,024
    assert calls is not None and calls.cap == 250  # of LiteLLM's 500


@pytest.mark.parametrize(
    ("environ", "calls"),
    [
        ({}, 500),
        ({"AIOHTTP_CONNECTOR_LIMIT_PER_HOST": " 40 "}, 40),
        ({"AIOHTTP_CONNECTOR_LIMIT_PER_HOST": "0"}, 1000),  # no per-host limit: the total
        ({"AIOHTTP_CONNECTOR_LIMIT_PER_HOST": "0", "AIOHTTP_CONNECTOR_LIMIT": "0"}, 1024),
        ({"AIOHTTP_CONNECTOR_LIMIT_PER_HOST": "many"}, 500),  # LiteLLM: its default
    ],
)
def test_hosted_calls_reads_litellms_limits_as_it_does(environ: dict[str, str], calls: int) -> None:
    assert hosted_calls(1024, environ) == calls
