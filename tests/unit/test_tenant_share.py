"""How much of a backend's pool one tenant may hold (gateway/upstream/tenant_share.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.app import assemble
from gateway.config.schema import LimitSettings
from gateway.tenants import hash_api_key
from gateway.upstream.tenant_share import TenantShare, share_cap
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, backend, gateway_config


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
