"""The receipts of recent requests, in memory, for `GET /v1/provenance/receipts/{id}`.

The salts in a receipt are never written to disk, so this store is the only place the
gateway can hand a receipt out again. It is bounded twice, oldest first evicted: by count
(`provenance.receipts_kept`) and by bytes (`provenance.receipts_memory_bytes`). A receipt
is held as its signing future until the log signed it, then as the
envelope bytes alone (the future, its loop and callbacks are let go).

The byte count charged per receipt is what it keeps alive: the request id, the envelope
(or, while it is signed, the future and a reservation for the envelope) and the
bookkeeping around them (`ENTRY_OVERHEAD`). tests/unit/test_receipt_store.py measures the real
cost with tracemalloc and holds the charge to it: never under, and within a small factor.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Final

__all__ = ["ENTRY_OVERHEAD", "PENDING_ENVELOPE_BYTES", "ReceiptStore"]

# The OrderedDict slot and its linked-list node, the (tenant, receipt, index) tuple and
# the index int (tenant strings are shared with the config and not charged).
ENTRY_OVERHEAD: Final = 256
# Charged for a receipt still being signed (for the future and the envelope to come,
# ~0.9 KB for a v1 receipt, ~1.5 KB for a batch receipt with a path of 6 hashes); its real
# size replaces this once it is signed, a moment later.
PENDING_ENVELOPE_BYTES: Final = 1792

Sealing = asyncio.Future[bytes]


class ReceiptStore:
    """Receipts by request id, for the tenant that made the request."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        if max_count < 1 or max_bytes < 1:
            raise ValueError("a receipt store holds at least one receipt and one byte")
        self.max_count = max_count
        self.max_bytes = max_bytes
        # request id -> (tenant, envelope or the future signing it, dispatch index, charge)
        self._entries: collections.OrderedDict[str, tuple[str, bytes | Sealing, int, int]] = (
            collections.OrderedDict()
        )
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """What the receipts held now are charged (see the module's docstring)."""
        return self._bytes

    def remember(self, request_id: str, tenant: str, sealing: Sealing, index: int) -> None:
        """Keep the receipt `sealing` will produce; evicts the oldest past either bound."""
        self._drop(request_id)
        charge = _charge(request_id, None)
        self._entries[request_id] = (tenant, sealing, index, charge)
        self._bytes += charge
        self._evict()
        if request_id in self._entries:
            sealing.add_done_callback(lambda done: self._signed(request_id, done))

    def get(self, request_id: str, tenant: str) -> tuple[Sealing, int] | None:
        """The receipt of a recent request (being signed, or signed) as a future, only for
        the tenant that made it, and the leaf index of the record it names."""
        found = self._entries.get(request_id)
        if found is None or found[0] != tenant:
            return None
        receipt, index = found[1], found[2]
        if isinstance(receipt, bytes):
            done: Sealing = asyncio.get_running_loop().create_future()
            done.set_result(receipt)
            return done, index
        return receipt, index

    def _signed(self, request_id: str, sealing: Sealing) -> None:
        """Signed: keep the envelope alone, charged its real size. A failed signature keeps
        its future (lookups answer that it could not be signed)."""
        found = self._entries.get(request_id)
        if found is None or found[1] is not sealing:
            return  # evicted, or replaced by a later request with the same id
        if sealing.cancelled() or sealing.exception() is not None:
            return
        # An exact-size copy: the encoder's output may sit in a buffer ~10x its size (orjson
        # over-allocates; that made a kept receipt cost ~8 KB).
        envelope = bytes(memoryview(sealing.result()))
        charge = _charge(request_id, envelope)
        tenant, _, index, old = found
        self._entries[request_id] = (tenant, envelope, index, charge)
        self._bytes += charge - old
        self._evict()

    def _drop(self, request_id: str) -> None:
        found = self._entries.pop(request_id, None)
        if found is not None:
            self._bytes -= found[3]

    def _evict(self) -> None:
        entries = self._entries
        while entries and (len(entries) > self.max_count or self._bytes > self.max_bytes):
            _, (_, _, _, charge) = entries.popitem(last=False)
            self._bytes -= charge


def _charge(request_id: str, envelope: bytes | None) -> int:
    held = PENDING_ENVELOPE_BYTES if envelope is None else sys.getsizeof(envelope)
    return ENTRY_OVERHEAD + sys.getsizeof(request_id) + held
