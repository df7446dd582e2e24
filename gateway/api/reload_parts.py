"""What a config reload does with the parts it leaves: the running backends' settings that
assembling a new config adjusts (put back when that assembly is not installed), and the
backends and proxy of the config replaced, or of an assembly discarded, closed once the
requests running at the swap are done (gateway/api/reload.py `ConfigReloader`)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.api.parts import Assembly
    from gateway.api.proxy import Proxy
    from gateway.routing.registry import BackendState

__all__ = ["Adjusted", "adjustable", "put_back", "replaced_backends", "retire"]

Adjusted = dict["BackendState", tuple[Any, "int | None"]]


def adjustable(running: Assembly) -> Adjusted:
    """The settings of the running backends that assembling a new config adjusts in the
    backends it keeps (gateway/app.py `_keep_unchanged_backends`), as they are now."""
    return {
        b: (b.breaker.settings, None if b.share is None else b.share.cap)
        for b in running.registry.backends.values()
    }


def put_back(adjusted: Adjusted) -> None:
    """The running backends' settings as `adjustable` kept them (breaker, tenant share)."""
    for backend, (settings, cap) in adjusted.items():
        backend.breaker.settings = settings
        if backend.share is not None:
            backend.share.cap = cap


def replaced_backends(old: Assembly, new: Assembly) -> list[BackendState]:
    """The backends of `old` that `new` does not share (removed, or rebuilt changed)."""
    return [b for b in old.registry.backends.values() if new.registry.backends.get(b.id) is not b]


async def retire(
    requests: Collection[asyncio.Task[Any]],
    timeout: float,
    backends: list[BackendState],
    proxy: Proxy,
) -> None:
    """Close what the old config used once the requests running at the swap are done."""
    if requests:
        await asyncio.wait(requests, timeout=timeout)
    for backend in backends:
        if backend.pool is not None:
            await backend.pool.close()
    await proxy.close()
