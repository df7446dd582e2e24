"""The sealing thread: what must be signed per entry once it is durable (receipts).

The writer thread hands each batch's seals to `Sealer.submit` right after the fsync and
goes on; the seals run here, and their results reach the appenders' futures on the event
loop, one hand-off per batch. So a receipt's signature never delays the durability of the
next batch, nor the request waiting for its dispatch record.

With a `BatchSeal` (batch receipts), each entry's seal gives only what is to be signed
(a receipt payload), and the batch seal turns the batch's `(index, payload)` pairs, in
log order, into the final results with one signature (`formats.receipt_batch`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gateway.provenance.formats.records import LogEntry

__all__ = ["BatchSeal", "Seal", "Sealer", "Sealing"]

Seal = Callable[[LogEntry], bytes]
# (position in the batch, leaf hash, seal, where its result goes)
Sealing = tuple[int, bytes, Seal, "asyncio.Future[bytes]"]
# one committed batch's sealed (log index, bytes), in log order -> one result for each
BatchSeal = Callable[[Sequence[tuple[int, bytes]]], list[bytes]]
_Result = tuple["asyncio.Future[bytes]", bytes | Exception]


class Sealer:
    """One thread that runs seals in batch order and resolves futures on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, batch: BatchSeal | None = None) -> None:
        self._loop = loop
        self._batch = batch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="provenance-seal")

    def submit(self, start: int, seals: Sequence[Sealing]) -> None:
        """Seal entries of a durable batch whose first entry landed at index `start`."""
        self._executor.submit(self._seal, start, seals)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def _seal(self, start: int, seals: Sequence[Sealing]) -> None:
        results: list[_Result] = []
        for position, leaf, seal, sealed in seals:
            try:
                results.append((sealed, seal(LogEntry(start + position, leaf))))
            except Exception as exc:  # noqa: BLE001 - handed to that entry's appender
                results.append((sealed, exc))
        if self._batch is not None:
            indices = [start + position for position, *_ in seals]
            results = self._finish(indices, results, self._batch)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            self._loop.call_soon_threadsafe(_deliver, results)

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
