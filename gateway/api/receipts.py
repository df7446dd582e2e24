"""The receipts of recent requests, in memory, for `GET /v1/provenance/receipts/{id}`.

The salts in a receipt are never written to disk, so this store is the only place the
gateway can hand a receipt out again. It is bounded twice: by count
(`provenance.receipts_kept`) and by bytes (`provenance.receipts_memory_bytes`), shared by
the tenants. Past a bound, the oldest receipt of the tenant holding the most (by count,
or by bytes) goes first: a tenant sending many requests pushes out its own receipts, and
another tenant's only once it holds as much. Before, the oldest receipt of any tenant
went, so one tenant's ~100,000 requests within its rate limits emptied the store of the
others' receipts. A tenant holding less than its equal part of both bounds (each bound
over the number of tenants holding receipts) keeps all it holds. The tenant holding the
most is found in O(log tenants) amortized (`_Largest`: a heap per bound, its stale entries
dropped as they surface), not by a scan of every tenant per eviction (once the store was
full, every request scanned them all: 1,000 tenants took ~0.2 ms of the event loop per
request, 10,000 ~3 ms). A receipt
is held as its signing future until the log signed it, then as the
envelope bytes alone (the future, its loop and callbacks are let go). The receipt of an
answer an attested backend countersigned gets that countersignature once the completion
accepting it is recorded (`countersigned`), as the answer's own receipt carried it: a
receipt fetched again is the same two-party statement.

The byte count charged per receipt is what it keeps alive: the request id, the envelope
(or, while it is signed, the future and a reservation for the envelope) and the
bookkeeping around them (`ENTRY_OVERHEAD`). tests/unit/test_receipt_store.py measures the real
cost with tracemalloc and holds the charge to it: never under, and within a small factor.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import sys
from collections.abc import Callable
from typing import Final

from gateway.provenance.formats.receipts import attach_countersignature

__all__ = ["ENTRY_OVERHEAD", "PENDING_ENVELOPE_BYTES", "ReceiptStore"]

# The OrderedDict slot and its linked-list node, the (receipt, index, charge) tuple and
# its ints (a tenant's share and its entries in `_Largest`, at most 2 per tenant holding
# receipts and bound plus a constant, are not charged).
ENTRY_OVERHEAD: Final = 256
# Charged for a receipt still being signed (for the future and the envelope to come,
# ~0.9 KB for a v1 receipt, ~1.5 KB for a batch receipt with a path of 6 hashes); its real
# size replaces this once it is signed, a moment later.
PENDING_ENVELOPE_BYTES: Final = 1792

Sealing = asyncio.Future[bytes]
# A backend's countersignature (DSSE envelope JSON); named here: `ReceiptStore.bytes`
# shadows the builtin in the class's annotations.
Countersignature = bytes


class _Share:
    """One tenant's receipts, oldest first: request id -> (envelope or the future signing
    it, dispatch index, charge); what they are charged together; and the share's serial
    (shares made earlier have smaller ones)."""

    __slots__ = ("bytes", "entries", "serial")

    def __init__(self, serial: int) -> None:
        self.entries: collections.OrderedDict[str, tuple[bytes | Sealing, int, int]] = (
            collections.OrderedDict()
        )
        self.bytes = 0
        self.serial = serial


def _count(share: _Share) -> int:
    return len(share.entries)


def _bytes(share: _Share) -> int:
    return share.bytes


class _Largest:
    """The tenant whose share holds the most of one measure (`_count` or `_bytes`), the
    earliest share first among equals (as `max` over the shares in their order would):
    a heap of (-amount, serial, tenant), pushed at every change of a share's amount. An
    entry no longer true (the share changed since, or is gone) is dropped when it comes
    to the top; past 2 entries per share (plus a constant) the heap is rebuilt from the
    shares. O(log tenants) per change and per look, amortized."""

    __slots__ = ("_heap", "_measure")

    def __init__(self, measure: Callable[[_Share], int]) -> None:
        self._measure = measure
        self._heap: list[tuple[int, int, str]] = []

    def changed(self, tenant: str, share: _Share, shares: dict[str, _Share]) -> None:
        """`share` (of `tenant`, one of `shares`) holds another amount now."""
        if len(self._heap) > 2 * len(shares) + 64:
            self._heap = [(-self._measure(s), s.serial, t) for t, s in shares.items()]
            heapq.heapify(self._heap)
        else:
            heapq.heappush(self._heap, (-self._measure(share), share.serial, tenant))

    def tenant(self, shares: dict[str, _Share]) -> str:
        """The tenant holding the most (`shares` is not empty)."""
        heap = self._heap
        while True:
            negative, serial, tenant = heap[0]
            share = shares.get(tenant)
            if share is not None and share.serial == serial and -negative == self._measure(share):
                return tenant
            heapq.heappop(heap)


class ReceiptStore:
    """Receipts by request id, for the tenant that made the request."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        if max_count < 1 or max_bytes < 1:
            raise ValueError("a receipt store holds at least one receipt and one byte")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._shares: dict[str, _Share] = {}  # by tenant; a tenant holding none has none
        self._serials = itertools.count()
        self._most_count = _Largest(_count)
        self._most_bytes = _Largest(_bytes)
        self._count = 0
        self._bytes = 0

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """What the receipts held now are charged (see the module's docstring)."""
        return self._bytes

    def held(self, tenant: str) -> tuple[int, int]:
        """How many receipts `tenant`'s requests have here, and what they are charged."""
        share = self._shares.get(tenant)
        return (0, 0) if share is None else (len(share.entries), share.bytes)

    def remember(self, request_id: str, tenant: str, sealing: Sealing, index: int) -> None:
        """Keep the receipt `sealing` will produce; past either bound, evicts the oldest
        receipt of the tenant holding the most."""
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Share(next(self._serials))
        self._drop(tenant, share, request_id)
        charge = _charge(request_id, None)
        share.entries[request_id] = (sealing, index, charge)
        self._charged(tenant, share, 1, charge)
        self._evict()
        if request_id in share.entries:
            sealing.add_done_callback(lambda done: self._signed(tenant, request_id, done))

    def get(self, request_id: str, tenant: str) -> tuple[Sealing, int] | None:
        """The receipt of a recent request (being signed, or signed) as a future, only for
        the tenant that made it, and the leaf index of the record it names."""
        share = self._shares.get(tenant)
        found = None if share is None else share.entries.get(request_id)
        if found is None:
            return None
        receipt, index = found[0], found[1]
        if isinstance(receipt, bytes):
            done: Sealing = asyncio.get_running_loop().create_future()
            done.set_result(receipt)
            return done, index
        return receipt, index

    def _signed(self, tenant: str, request_id: str, sealing: Sealing) -> None:
        """Signed: keep the envelope alone, charged its real size. A failed signature keeps
        its future (lookups answer that it could not be signed)."""
        share = self._shares.get(tenant)
        found = None if share is None else share.entries.get(request_id)
        if share is None or found is None or found[0] is not sealing:
            return  # evicted, or replaced by a later request with the same id
        if sealing.cancelled() or sealing.exception() is not None:
            return
        # An exact-size copy: the encoder's output may sit in a buffer ~10x its size (orjson
        # over-allocates; that made a kept receipt cost ~8 KB).
        envelope = bytes(memoryview(sealing.result()))
        charge = _charge(request_id, envelope)
        _, index, old = found
        share.entries[request_id] = (envelope, index, charge)
        self._charged(tenant, share, 0, charge - old)
        self._evict()

    def countersigned(
        self, request_id: str, tenant: str, index: int, countersignature: Countersignature
    ) -> None:
        """The countersignature the completion of dispatch `index` accepted: the kept
        receipt of that dispatch carries it from now on (once signed, if it still is
        being signed), as the receipt the client got with the answer did."""
        share = self._shares.get(tenant)
        found = None if share is None else share.entries.get(request_id)
        if share is None or found is None or found[1] != index:
            return  # evicted, or the receipt of another dispatch of the request
        receipt, _, old = found
        if isinstance(receipt, bytes):
            # An exact-size copy, as in `_signed`: the encoder's buffer is ~3x its length.
            envelope = bytes(memoryview(attach_countersignature(receipt, countersignature)))
            charge = _charge(request_id, envelope)
            share.entries[request_id] = (envelope, index, charge)
            self._charged(tenant, share, 0, charge - old)
            self._evict()
        else:  # being signed, or signed with `_signed` still to run (added before this)
            receipt.add_done_callback(
                lambda _: self._countersigned_when_signed(
                    request_id, tenant, index, countersignature
                )
            )

    def _countersigned_when_signed(
        self, request_id: str, tenant: str, index: int, countersignature: Countersignature
    ) -> None:
        share = self._shares.get(tenant)
        found = None if share is None else share.entries.get(request_id)
        if found is not None and isinstance(found[0], bytes):  # not a failed signature
            self.countersigned(request_id, tenant, index, countersignature)

    def _charged(self, tenant: str, share: _Share, count: int, charge: int) -> None:
        """`share` (of `tenant`) now holds `count` more receipts, charged `charge` more."""
        share.bytes += charge
        self._count += count
        self._bytes += charge
        if count:
            self._most_count.changed(tenant, share, self._shares)
        if charge:
            self._most_bytes.changed(tenant, share, self._shares)

    def _drop(self, tenant: str, share: _Share, request_id: str) -> None:
        found = share.entries.pop(request_id, None)
        if found is not None:
            self._charged(tenant, share, -1, -found[2])

    def _evict(self) -> None:
        """While past a bound, drop the oldest receipt of the tenant holding the most of it
        (by count past `max_count`, by bytes past `max_bytes`): one tenant sending many
        requests pushes out its own receipts, not the others'. Among tenants holding as
        much, the one whose share was made first. O(log tenants) amortized (`_Largest`)."""
        shares = self._shares
        while self._count > self.max_count or self._bytes > self.max_bytes:
            if self._count > self.max_count:
                tenant = self._most_count.tenant(shares)
            else:
                tenant = self._most_bytes.tenant(shares)
            share = shares[tenant]
            _, (_, _, charge) = share.entries.popitem(last=False)
            self._charged(tenant, share, -1, -charge)
            if not share.entries:
                del shares[tenant]


def _charge(request_id: str, envelope: bytes | None) -> int:
    held = PENDING_ENVELOPE_BYTES if envelope is None else sys.getsizeof(envelope)
    return ENTRY_OVERHEAD + sys.getsizeof(request_id) + held
