"""Calls in flight, bounded in all and per owner, refused at once past either bound.

A tenant's inclusion-proof reads (gateway/api/tenant_reads.py `ProofReads`) and the admin
API's heavy work (gateway/admin/work.py `AdminWork`) are each held to a number in flight
per process and a smaller number per owner (a tenant, an admin token): one owner cannot
take every slot, and none waits in a queue. `take` admits one more or raises 429
`rate_limit_exceeded` with `retry-after: 1`; every call `take` admitted is given back
with one `give_back`. The two messages say whose bound was reached, in the words of the
work being bounded. `Holdings` is the counting alone (per owner and in all), which the
admin log's `ReadLine` (gateway/admin/read_line.py) shares with its own waiting line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gateway.errors import ErrorCode, GatewayError

__all__ = ["Holdings", "InFlight"]

_RETRY_SOON: Final = ((b"retry-after", b"1"),)


class Holdings:
    """How many calls each owner holds, and all owners together; bounds are the user's."""

    __slots__ = ("_held", "total")

    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # owner -> its calls in flight (none: absent)
        self.total = 0

    def of(self, owner: str) -> int:
        return self._held.get(owner, 0)

    def hold(self, owner: str) -> None:
        self._held[owner] = self._held.get(owner, 0) + 1
        self.total += 1

    def give_back(self, owner: str) -> None:
        self.total -= 1
        left = self._held[owner] - 1
        if left:
            self._held[owner] = left
        else:
            del self._held[owner]


class InFlight:
    """At most `most` calls in flight, `per_owner` of them one owner's. `owner_full(n)`
    and `all_full(n)` word the refusal of an owner already at its `n`, of the process
    already at its `n`."""

    def __init__(
        self,
        most: int,
        per_owner: int,
        owner_full: Callable[[int], str],
        all_full: Callable[[int], str],
    ) -> None:
        self._most, self._per_owner = most, per_owner
        self._owner_full, self._all_full = owner_full, all_full
        self._held = Holdings()

    def held(self, owner: str) -> int:
        return self._held.of(owner)

    def take(self, owner: str) -> None:
        """One more call of `owner`, or `GatewayError` (429, retry after 1 s) holding none."""
        mine = self._held.of(owner)
        if mine >= self._per_owner:
            raise GatewayError(
                ErrorCode.rate_limit_exceeded, self._owner_full(mine), headers=_RETRY_SOON
            )
        if self._held.total >= self._most:
            raise GatewayError(
                ErrorCode.rate_limit_exceeded, self._all_full(self._held.total), headers=_RETRY_SOON
            )
        self._held.hold(owner)

    def give_back(self, owner: str) -> None:
        self._held.give_back(owner)
