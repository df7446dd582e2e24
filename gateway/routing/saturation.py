"""The gateway's bounded wait queue of one pool, for when every private backend is saturated.

When every eligible private backend of a model is over the pool's saturation threshold
(waiting requests per slot, `routing.*.queue.threshold`) and the tenant's policy allows
no `when_private_saturated` fallback, the request waits here instead of joining some
backend's queue early: when a slot frees, the next waiter goes to whichever backend is
then least loaded (late binding).

- A waiter is let go each time one of this gateway's requests to a backend of the pool
  ends (`release`), and also when a re-check every `poll_s` finds the pool no longer
  saturated (its load may fall through other replicas' traffic or a backend's own queue,
  which no local completion reports).
- `release` takes turns across the tenants with waiters (round-robin; the tenant-less
  requests, `tenant=None`, share one turn), first come first served within a tenant: a
  tenant that queued a burst used to make every other tenant's request wait behind all
  of it, multiplying their wait by its burst; now they wait behind one of its requests
  per turn. A tenant that has no waiter left leaves the round, and joins it at its end
  when it queues again. With one tenant (or none configured) this is first come, first
  served, as it was. Each release costs O(1) (the waiter taken from its tenant's deque,
  the tenant moved to the round's end); the round holds only tenants waiting now.
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
from collections.abc import Callable

from gateway.config.schema import QueueSettings
from gateway.errors import ErrorCode, GatewayError

__all__ = ["SaturationQueue"]

_RETRY_AFTER = ((b"retry-after", b"1"),)

_Waiter = asyncio.Future[None]


class SaturationQueue:
    """Requests waiting for a private slot of one pool (a public model name): a FIFO per
    tenant, released in turns across the tenants."""

    def __init__(self, model: str, settings: QueueSettings) -> None:
        self.model = model
        self.settings = settings
        self.threshold = settings.threshold  # read per request: a plain attribute
        # The round: each tenant waiting now (None: the tenant-less requests) and its
        # waiters not yet released, oldest first; the next release serves the first tenant.
        self._turns: collections.OrderedDict[str | None, collections.deque[_Waiter]] = (
            collections.OrderedDict()
        )
        self._waiting = 0  # waiters in the round
        self._by_tenant: dict[str, int] = {}  # waiters per tenant, of tenants waiting now

    @property
    def waiting(self) -> int:
        return self._waiting

    async def wait(
        self, saturated: Callable[[], bool], poll_s: float, tenant: str | None = None
    ) -> None:
        """Return once this request may go on; raise `GatewayError` when the queue is
        full, or `tenant`'s part of it (None: not counted apart), or the wait passes
        `max_wait_s`. `saturated()` is re-checked every `poll_s`."""
        settings = self.settings
        if self._waiting >= settings.size:
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
        waiter: _Waiter = loop.create_future()
        turns = self._turns
        mine_waiting = turns.get(tenant)
        if mine_waiting is None:  # not in the round: it joins at the end
            mine_waiting = turns[tenant] = collections.deque()
        mine_waiting.append(waiter)
        self._waiting += 1
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
            # Only release() sets a waiter's result, taking it off the round as it does (the
            # shield keeps a cancelled task from cancelling it): a waiter not done is still
            # in its tenant's deque, so the common path (released) scans nothing.
            if not waiter.done():
                waiter.cancel()
                self._leave_round(tenant, waiter)
            if tenant is not None:
                left = by_tenant[tenant] - 1
                if left:
                    by_tenant[tenant] = left
                else:
                    del by_tenant[tenant]  # no entry per tenant ever seen

    def release(self) -> None:
        """One request to a backend of this pool ended: let the oldest waiter of the
        tenant whose turn it is go, and send that tenant to the end of the round."""
        turns = self._turns
        while turns:
            tenant, waiters = next(iter(turns.items()))
            waiter = waiters.popleft()
            self._waiting -= 1
            if not waiters:
                del turns[tenant]
            if waiter.done():  # gave up but not yet off (defensive): no turn spent
                continue
            if waiters:
                turns.move_to_end(tenant)
            waiter.set_result(None)
            return

    def _leave_round(self, tenant: str | None, waiter: _Waiter) -> None:
        """Take a waiter that gave up off its tenant's deque (O(that tenant's waiters));
        a tenant with no waiter left leaves the round."""
        waiters = self._turns.get(tenant)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return  # not there (defensive: only release() takes a waiter off otherwise)
        self._waiting -= 1
        if not waiters:
            del self._turns[tenant]
