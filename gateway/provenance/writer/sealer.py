"""Sealing: what must be signed per entry once it is durable (receipts).

The committer hands each written batch's seals to `Sealer.seal` on the event loop, in a
callback of their own queued after the appenders were woken: a request waiting for its
dispatch record goes upstream first, and the seal (its receipt) is ready long before the
answer is. Seals run in batch order, once per batch: no thread hand-off, no second
wake-up of the loop per batch (which at one request at a time cost more CPU than the
signature itself). A seal must be quick, as the gateway's is: one Ed25519 signature
(~25 µs) per batch.

With a `BatchSeal` (batch receipts), each entry's seal gives only what is to be signed
(a receipt payload), and the batch seal turns the batch's `(index, payload)` pairs, in
log order, into the final results with one signature (`formats.receipt_batch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gateway.provenance.formats.records import LogEntry

__all__ = ["BatchSeal", "Seal", "Sealer", "Sealing"]

Seal = Callable[[LogEntry], bytes]
# (position in the batch, leaf hash, seal, where its result goes)
Sealing = tuple[int, bytes, Seal, "asyncio.Future[bytes]"]
# one committed batch's sealed (log index, bytes), in log order -> one result for each
BatchSeal = Callable[[Sequence[tuple[int, bytes]]], list[bytes]]
_Result = tuple["asyncio.Future[bytes]", bytes | Exception]


class Sealer:
    """Runs a durable batch's seals (on the event loop) and resolves their futures."""

    def __init__(self, batch: BatchSeal | None = None) -> None:
        self._batch = batch

    def seal(self, start: int, seals: Sequence[Sealing]) -> None:
        """Seal the entries of a durable batch whose first entry landed at index `start`;
        a seal that raises gives its appender the error, and the others still get theirs."""
        results: list[_Result] = []
        for position, leaf, seal, sealed in seals:
            try:
                results.append((sealed, seal(LogEntry(start + position, leaf))))
            except Exception as exc:  # noqa: BLE001 - handed to that entry's appender
                results.append((sealed, exc))
        if self._batch is not None:
            indices = [start + position for position, *_ in seals]
            results = self._finish(indices, results, self._batch)
        _deliver(results)

    @staticmethod
    def _finish(indices: list[int], results: list[_Result], batch: BatchSeal) -> list[_Result]:
        """The batch seal over the entries whose own seal worked (the others keep their
        error); if it fails, each of them gets its error."""
        good = [n for n, (_, result) in enumerate(results) if isinstance(result, bytes)]
        if not good:
            return results
        pairs: list[tuple[int, bytes]] = []
        for n in good:
            sealed = results[n][1]
            assert isinstance(sealed, bytes)  # for mypy: `good` holds only those
            pairs.append((indices[n], sealed))
        finished: Sequence[bytes | Exception]
        try:
            finished = batch(pairs)
            if len(finished) != len(good):
                raise ValueError(f"the batch seal gave {len(finished)} results for {len(good)}")
        except Exception as exc:  # noqa: BLE001 - handed to every appender of the batch
            finished = [exc] * len(good)
        done = list(results)
        for n, result in zip(good, finished, strict=True):
            done[n] = (done[n][0], result)
        return done


def _deliver(results: list[_Result]) -> None:
    for sealed, result in results:
        if sealed.done():
            continue
        if isinstance(result, Exception):
            sealed.set_exception(result)
        else:
            sealed.set_result(result)
