"""Sealing alone: CPU per receipt signed per request (v1) vs per batch (v2).

A provenance log in this process, on a temporary directory (real fsync group commit),
takes `append_sealed` appends from N concurrent appenders; the seals are the gateway's
(`Recorder`: a v1 envelope per entry, or the payload per entry and one `seal_receipts`
per committed batch). `time.thread_time` around each seal call counts the CPU of
sealing alone (it runs on the event loop, once per batch), so what other processes do on
a shared machine does not enter it.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["render_sealing", "sealing_cost"]

ORIGIN = "bench.owngate/sealing"
APPENDS = 2048  # per point and mode


async def _point(directory: Path, mode: str, concurrency: int, appends: int) -> dict[str, float]:
    from gateway.canonical import canonical_json_of_plain
    from gateway.provenance import (
        LogEntry,
        ProvenanceLog,
        Receipt,
        Salts,
        make_receipt,
        refusal_record,
        seal_receipts,
    )
    from gateway.provenance.testing import EXAMPLE_POLICY, seeded_signer

    signer = seeded_signer(ORIGIN)
    spent = [0.0]

    def batch(pairs: Sequence[tuple[int, bytes]]) -> list[bytes]:
        began = time.thread_time()
        sealed = seal_receipts(pairs, ORIGIN, signer, lone_v1=True)  # as the gateway does
        spent[0] += time.thread_time() - began
        return sealed

    shutil.rmtree(directory, ignore_errors=True)
    log = await ProvenanceLog.open(
        directory, ORIGIN, signer, batch_seal=batch if mode == "batch" else None
    )
    salts = Salts.generate()

    def seal(entry: LogEntry) -> bytes:
        began = time.thread_time()
        receipt = Receipt(
            "req_" + "ab" * 12, ORIGIN, entry.index, entry.leaf_hash, "vllm-eu-1",
            "sha256:" + "ab" * 32, salts,
        )  # fmt: skip
        sealed = (
            canonical_json_of_plain(receipt.payload())
            if mode == "batch"
            else make_receipt(receipt, signer)
        )
        spent[0] += time.thread_time() - began
        return sealed

    record = refusal_record(
        request_id="req-bench",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="bench",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        rule="deny",
        reason="policy_denied",
        request_commitment=None,
    )

    async def appender() -> None:
        for _ in range(max(1, appends // concurrency)):
            _, sealing = await log.append_sealed(record, seal, checked=True)
            await sealing

    try:
        await asyncio.gather(*(appender() for _ in range(concurrency)))
        appended, batches = log.size, log.batches
    finally:
        await log.close()
    return {"us_per_receipt": 1e6 * spent[0] / appended, "per_batch": appended / batches}


def sealing_cost(
    levels: Sequence[int], repeat: int, directory: Path, appends: int = APPENDS
) -> list[dict[str, Any]]:
    """Median sealing CPU per receipt per (concurrency, mode), modes alternating."""
    found: dict[tuple[int, str], list[dict[str, float]]] = {}
    number = 0
    for _ in range(repeat):
        for concurrency in levels:
            modes = ("single", "batch") if number % 2 == 0 else ("batch", "single")
            number += 1
            for mode in modes:
                point = asyncio.run(_point(directory, mode, concurrency, appends))
                found.setdefault((concurrency, mode), []).append(point)
    shutil.rmtree(directory, ignore_errors=True)
    return [
        {
            "concurrency": concurrency,
            "mode": mode,
            "us_per_receipt": statistics.median(p["us_per_receipt"] for p in points),
            "receipts_per_batch": statistics.median(p["per_batch"] for p in points),
        }
        for (concurrency, mode), points in sorted(found.items())
    ]


def render_sealing(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["sealing alone (medians)   CPU us/receipt   receipts/batch", "-" * 57]
    for row in rows:
        lines.append(
            f"c={row['concurrency']:<4} {row['mode']:<26} {row['us_per_receipt']:>14.1f}"
            f"   {row['receipts_per_batch']:>14.1f}"
        )
    return "\n".join(lines)
