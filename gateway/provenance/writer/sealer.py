"""The sealing thread: what must be signed per entry once it is durable (receipts).

The writer thread hands each batch's seals to `Sealer.submit` right after the fsync and
goes on; the seals run here, and their results reach the appenders' futures on the event
loop, one hand-off per batch. So a receipt's signature never delays the durability of the
next batch, nor the request waiting for its dispatch record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gateway.provenance.formats.records import LogEntry

__all__ = ["Seal", "Sealer", "Sealing"]

Seal = Callable[[LogEntry], bytes]
# (position in the batch, leaf hash, seal, where its result goes)
Sealing = tuple[int, bytes, Seal, "asyncio.Future[bytes]"]


class Sealer:
    """One thread that runs seals in batch order and resolves futures on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="provenance-seal")

    def submit(self, start: int, seals: Sequence[Sealing]) -> None:
        """Seal entries of a durable batch whose first entry landed at index `start`."""
        self._executor.submit(self._seal, start, seals)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def _seal(self, start: int, seals: Sequence[Sealing]) -> None:
        results: list[tuple[asyncio.Future[bytes], bytes | Exception]] = []
        for position, leaf, seal, sealed in seals:
            try:
                results.append((sealed, seal(LogEntry(start + position, leaf))))
            except Exception as exc:  # noqa: BLE001 - handed to that entry's appender
                results.append((sealed, exc))
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            self._loop.call_soon_threadsafe(_deliver, results)


def _deliver(results: list[tuple[asyncio.Future[bytes], bytes | Exception]]) -> None:
    for sealed, result in results:
        if sealed.done():
            continue
        if isinstance(result, Exception):
            sealed.set_exception(result)
        else:
            sealed.set_result(result)
