"""Helpers for tests of code that writes provenance: deterministic keys, salts and records.

Real types only (no stand-ins): a seeded `Signer`, a counter-based salt source and a
`request` helper that writes the two records of one request through a real log.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway.provenance.formats.commitments import Salts, commit
from gateway.provenance.formats.note import Signer
from gateway.provenance.formats.receipts import Receipt
from gateway.provenance.formats.records import (
    BackendRef,
    LogEntry,
    PolicyRef,
    Retention,
    TraceStep,
    Usage,
    completion_record,
    dispatch_record,
    refusal_record,
)
from gateway.provenance.writer.log import ProvenanceLog

__all__ = [
    "EXAMPLE_BACKEND",
    "EXAMPLE_HOSTED",
    "EXAMPLE_POLICY",
    "CountingRandom",
    "LoggedRequest",
    "log_refusal",
    "log_request",
    "seeded_signer",
    "write_requests",
]

EXAMPLE_POLICY = PolicyRef("default", "3", "sha256:" + "ab" * 32)
EXAMPLE_BACKEND = BackendRef(
    "vllm-eu-1", "private", "vllm", "acme", "acme", "eu-west", Retention(0, True, False)
)
EXAMPLE_HOSTED = BackendRef(
    "openai-us", "hosted", "openai", "openai", "openai", "us", Retention(30, False, False)
)
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def seeded_signer(name: str, seed: int = 1) -> Signer:
    """A deterministic Ed25519 signer (for tests only: the seed is public)."""
    return Signer.from_seed(name, hashlib.sha256(f"{name}/{seed}".encode()).digest())


class CountingRandom:
    """A deterministic `random(n) -> bytes` source: SHA-256 of a counter."""

    def __init__(self, label: str = "salt") -> None:
        self._label = label
        self._count = 0

    def __call__(self, size: int) -> bytes:
        self._count += 1
        out = b""
        block = 0
        while len(out) < size:  # bounded: 32 bytes per round
            out += hashlib.sha256(f"{self._label}/{self._count}/{block}".encode()).digest()
            block += 1
        return out[:size]


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    request_id: str
    dispatch: LogEntry
    completion: LogEntry
    salts: Salts
    receipt: Receipt


async def log_request(
    log: ProvenanceLog,
    number: int,
    *,
    request_body: bytes = b'{"model":"m","messages":[]}',
    response_body: bytes = b'{"choices":[]}',
    tenant: str = "acme-app",
    backend: BackendRef = EXAMPLE_BACKEND,
    fallback_reason: str | None = None,
    random: CountingRandom | None = None,
) -> LoggedRequest:
    """Write the dispatch and completion records of request `req-<number>`."""
    salts = Salts.generate(random or CountingRandom(f"request/{number}"))
    request_id = f"req-{number}"
    moment = _EPOCH + timedelta(seconds=number)
    dispatch = await log.append(
        dispatch_record(
            request_id=request_id,
            time=moment,
            tenant=tenant,
            model="llama-3-8b",
            policy=EXAMPLE_POLICY,
            trace=[TraceStep(backend.id, "admitted", "tenant.allow")],
            backend=backend,
            fallback_reason=fallback_reason,
            request_commitment=commit("request", salts.request, request_body),
        )
    )
    completion = await log.append(
        completion_record(
            request_id=request_id,
            time=moment + timedelta(milliseconds=250),
            dispatch=dispatch,
            status=200,
            error=None,
            usage=Usage(12, 30, 42),
            latency_ms=250,
            response_commitment=commit("response", salts.response, response_body),
        )
    )
    receipt = Receipt(
        request_id=request_id,
        log=log.origin,
        index=dispatch.index,
        dispatch_hash=dispatch.leaf_hash,
        backend=backend.id,
        policy_digest=EXAMPLE_POLICY.digest,
        salts=salts,
    )
    return LoggedRequest(request_id, dispatch, completion, salts, receipt)


async def log_refusal(log: ProvenanceLog, number: int, *, tenant: str = "acme-app") -> LogEntry:
    return await log.append(
        refusal_record(
            request_id=f"req-{number}",
            time=_EPOCH + timedelta(seconds=number),
            tenant=tenant,
            model="gpt-4o",
            policy=EXAMPLE_POLICY,
            trace=[TraceStep(EXAMPLE_HOSTED.id, "excluded", "hosted.deny")],
            rule="hosted.deny",
            reason="policy hosted.deny: no hosted provider is allowed for this tenant",
            request_commitment=None,
        )
    )


def write_requests(path: Path, origin: str, signer: Signer, count: int) -> None:
    """A log at `path` holding `count` requests (`log_request`'s `req-0`...), closed."""

    async def build() -> None:
        log = await ProvenanceLog.open(path, origin, signer)
        for number in range(count):
            await log_request(log, number)
        await log.close()

    asyncio.run(build())
