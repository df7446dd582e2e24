"""The gateway's bounded wait queue of one pool, for when every private backend is saturated.

When every eligible private backend of a model is over the pool's saturation threshold
(waiting requests per slot, `routing.*.queue.threshold`) and the tenant's policy allows
no `when_private_saturated` fallback, the request waits here instead of joining some
backend's queue early: the request that waits longest goes first when a slot frees, to
whichever backend is then least loaded (late binding).

- A waiter is let go, oldest first, each time one of this gateway's requests to a
  backend of the pool ends (`release`), and also when a re-check every `poll_s` finds
  the pool no longer saturated (its load may fall through other replicas' traffic or a
  backend's own queue, which no local completion reports).
- A full queue answers 429 `rate_limit_exceeded`; a wait past `max_wait_s` answers 503
  `backend_unavailable`; both with `retry-after`.
- With several tenants, one tenant's requests take at most its part of the queue
  (`queue.size_per_tenant`, half of `size` by default; 429 past it): one tenant sending
  more than the backends take used to fill the queue, and every other tenant's request
  for the model was refused 429 meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from gateway.config.schema import QueueSettings
from gateway.errors import ErrorCode, GatewayError

__all__ = ["SaturationQueue"]

_RETRY_AFTER = ((b"retry-after", b"1"),)


class SaturationQueue:
    """FIFO of requests waiting for a private slot of one pool (a public model name)."""

    def __init__(self, model: str, settings: QueueSettings) -> None:
        self.model = model
        self.settings = settings
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._by_tenant: dict[str, int] = {}  # waiters per tenant, of tenants waiting now

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def wait(
        self, saturated: Callable[[], bool], poll_s: float, tenant: str | None = None
    ) -> None:
        """Return once this request may go on; raise `GatewayError` when the queue is
        full, or `tenant`'s part of it (None: not counted apart), or the wait passes
        `max_wait_s`. `saturated()` is re-checked every `poll_s`."""
        settings = self.settings
        if len(self._waiters) >= settings.size:
            raise GatewayError(
                ErrorCode.rate_limit_exceeded,
                f"every private backend for model `{self.model}` is saturated and the "
                f"gateway's queue for it is full ({settings.size} waiting); retry shortly",
                headers=_RETRY_AFTER,
            )
        by_tenant = self._by_tenant
        if tenant is not None:
            mine = by_tenant.get(tenant, 0)
            if mine >= settings.tenant_size:
                raise GatewayError(
                    ErrorCode.rate_limit_exceeded,
                    f"every private backend for model `{self.model}` is saturated and your "
                    f"requests hold as much of the gateway's queue for it as one tenant's "
                    f"may ({mine} waiting, its pool's queue.size_per_tenant); retry shortly",
                    headers=_RETRY_AFTER,
                )
            by_tenant[tenant] = mine + 1
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        give_up_at = loop.time() + settings.max_wait_s
        try:
            while True:
                left = give_up_at - loop.time()
                if left <= 0:
                    raise GatewayError(
                        ErrorCode.backend_unavailable,
                        f"every private backend for model `{self.model}` stayed saturated "
                        f"for {settings.max_wait_s:g}s while this request waited; retry shortly",
                        headers=_RETRY_AFTER,
                    )
                try:
                    async with asyncio.timeout(min(poll_s, left)):
                        await asyncio.shield(waiter)
                    return  # released by a completion
                except TimeoutError:
                    if waiter.done() or not saturated():
                        return
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # released just as it gave up: hand the turn on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):  # release() already took it off
                self._waiters.remove(waiter)
            if tenant is not None:
                left = by_tenant[tenant] - 1
                if left:
                    by_tenant[tenant] = left
                else:
                    del by_tenant[tenant]  # no entry per tenant ever seen

    def release(self) -> None:
        """One request to a backend of this pool ended: let the oldest waiter go."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
