"""The concurrency slots one replica holds in Redis, for `RedisState` (redis_state.py).

A request admitted under a `concurrent` limit holds a slot field, `{replica}|{seq}`, in
its tenant's slot hash. `HeldSlots` is this replica's book of them: the slots per tenant
(the local `Ledger` counts the same, for while Redis is away), those whose Redis call is
not answered yet (its outcome decides whether Redis has the slot, so a resync leaves
them alone), and the tenants whose slots changed since the last resync.
"""

from __future__ import annotations

from gateway.state.ledger import Ledger

__all__ = ["HeldSlots"]


class HeldSlots:
    """The slots this replica holds, per tenant, and what a HEARTBEAT says of them."""

    def __init__(self, replica_id: str, ledger: Ledger) -> None:
        self._replica_id = replica_id
        self._ledger = ledger
        self._seq = 0
        self._slots: dict[str, set[str]] = {}  # tenant -> slot fields held here
        self._calls: dict[str, str] = {}  # slot field -> tenant, in a call not yet answered
        self._touched: set[str] = set()  # tenants with slot changes since the last resync

    def take(self, tenant: str, *, calling: bool) -> str:
        """A new slot of `tenant`; `calling`: a Redis call that may add it is under way."""
        self._seq += 1
        slot = f"{self._replica_id}|{self._seq}"
        self._slots.setdefault(tenant, set()).add(slot)
        self._touched.add(tenant)
        self._ledger.hold(tenant)
        if calling:
            self._calls[slot] = tenant
        return slot

    def drop(self, tenant: str, slot: str | None) -> None:
        if slot is None:
            return
        held = self._slots.get(tenant)
        if held is not None:
            held.discard(slot)
            if not held:
                del self._slots[tenant]
        self._touched.add(tenant)
        self._ledger.unhold(tenant)

    def calling(self, slot: str, tenant: str) -> None:
        """A Redis call that may remove `slot` is under way."""
        self._calls[slot] = tenant

    def end_call(self, slot: str | None) -> None:
        if slot is not None:
            self._calls.pop(slot, None)

    def tenants(self) -> list[str]:
        """Every tenant with slots held here, or changed since the last resync."""
        return sorted(self._slots.keys() | self._touched)

    def heartbeat(self, *, resync: bool) -> tuple[list[str], set[str], list[str | int]]:
        """For one HEARTBEAT: the tenants it covers, the changed ones it settles (pass them
        to `settled` once Redis took it), and its slot arguments: per tenant the count held
        and, with `resync`, the slots to keep exactly and those a call under way decides."""
        touched = set(self._touched) if resync else set()
        tenants = sorted(self._slots.keys() | touched)
        args: list[str | int] = []
        for tenant in tenants:
            held = self._slots.get(tenant, set())
            calls = {slot for slot, owner in self._calls.items() if owner == tenant}
            keep = sorted(held - calls) if resync else []
            skip = sorted(calls) if resync else []  # the call's outcome decides
            args += [len(held), len(keep), *keep, len(skip), *skip]
        return tenants, touched, args

    def settled(self, touched: set[str]) -> None:
        """Redis now holds these tenants' slots exactly as this replica does."""
        self._touched -= touched
