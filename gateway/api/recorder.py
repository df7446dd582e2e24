"""Writing each request's provenance records, on the request path, failing closed.

Before a request body leaves for a backend, a `dispatch` record naming that backend,
the policy and a salted commitment to the body is made durable (group commit); after
the answer, a `completion` record with status, usage, latency and a commitment to the
response links back to it. A request the policy refuses gets a `refusal` record. The
salts go only to the client, in a DSSE receipt (response header, a final SSE comment on
streams, and `GET /v1/provenance/receipts/{id}` for a while). If the log cannot be
written the request is refused with 503: no traffic flows unlogged.
"""

from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.api.exchange import Exchange
from gateway.config.schema import Provenance
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.policy import Decision, facts_of
from gateway.provenance import (
    BackendRef,
    LogEntry,
    LogSettings,
    LogUnavailableError,
    PolicyRef,
    ProvenanceError,
    ProvenanceLog,
    Receipt,
    Retention,
    Salts,
    TraceStep,
    Usage,
    commit,
    commit_digest,
    completion_record,
    dispatch_record,
    load_signer,
    make_receipt,
    refusal_record,
)
from gateway.routing.registry import BackendState

__all__ = ["Recorder", "Trail", "usage_of"]

_TAIL = 4096  # bytes of a stream kept to find its usage chunk


@dataclass(slots=True)
class Trail:
    """One request's provenance state while it is served."""

    salts: Salts
    request_commitment: str
    dispatch: LogEntry | None = None
    receipt: bytes | None = None  # the DSSE envelope
    response_hash: Any = field(default_factory=hashlib.sha256)
    tail: bytes = b""
    whole: bytes | None = None

    def relayed(self, data: bytes) -> None:
        """A piece of a stream went to the client."""
        self.response_hash.update(data)
        self.tail = (self.tail + data)[-_TAIL:]

    def answered(self, data: bytes) -> None:
        """A whole (non-stream) answer went to the client."""
        self.response_hash.update(data)
        self.whole = data


class Recorder:
    def __init__(self, log: ProvenanceLog, signer: Any, receipts_kept: int) -> None:
        self._log = log
        self._signer = signer
        self._kept = receipts_kept
        # request id -> (tenant, receipt envelope, dispatch index); bounded, newest last
        self._receipts: collections.OrderedDict[str, tuple[str, bytes, int]] = (
            collections.OrderedDict()
        )
        self._events = get_logger("owngate.provenance")

    @classmethod
    async def open(cls, settings: Provenance, config_dir: Path) -> Recorder:
        signer = load_signer(config_dir / settings.signing_key_file)
        log = await ProvenanceLog.open(
            config_dir / settings.dir,
            settings.origin,
            signer,
            settings=LogSettings(
                group_commit_ms=settings.group_commit_ms,
                checkpoint_every=settings.checkpoint_every,
                checkpoint_interval_ms=settings.checkpoint_interval_ms,
            ),
        )
        return cls(log, signer, settings.receipts_kept)

    @property
    def log(self) -> ProvenanceLog:
        return self._log

    def start(self, body: bytes) -> Trail:
        salts = Salts.generate()
        return Trail(salts, commit("request", salts.request, body))

    async def dispatch(
        self,
        exchange: Exchange,
        trail: Trail,
        decision: Decision,
        backend: BackendState,
    ) -> None:
        """Make the dispatch record durable; only then may the body leave."""
        record = dispatch_record(
            request_id=exchange.request_id.decode(),
            time=datetime.now(UTC),
            tenant=exchange.tenant,
            model=exchange.model,
            policy=PolicyRef(decision.policy_id, decision.policy_version, decision.policy_digest),
            trace=_trace(decision),
            backend=_backend_ref(backend),
            fallback_reason=exchange.fallback,
            request_commitment=trail.request_commitment,
        )
        entry = await self._append(record)
        trail.dispatch = entry
        receipt = Receipt(
            request_id=exchange.request_id.decode(),
            log=self._log.origin,
            index=entry.index,
            dispatch_hash=entry.leaf_hash,
            backend=backend.id,
            policy_digest=decision.policy_digest,
            salts=trail.salts,
        )
        trail.receipt = make_receipt(receipt, self._signer)
        self._remember(exchange, trail.receipt, entry.index)

    async def complete(
        self,
        exchange: Exchange,
        trail: Trail,
        *,
        status: int,
        error: str | None,
    ) -> None:
        """The completion record of the current dispatch. A failure to write it is logged,
        not raised: the answer is already out (the dispatch record is what gates sending)."""
        if trail.dispatch is None:
            return
        digest = trail.response_hash.digest()
        record = completion_record(
            request_id=exchange.request_id.decode(),
            time=datetime.now(UTC),
            dispatch=trail.dispatch,
            status=status,
            error=error,
            usage=_usage(trail.whole if trail.whole is not None else trail.tail),
            latency_ms=round((time.perf_counter() - exchange.started_at) * 1000),
            response_commitment=commit_digest("response", trail.salts.response, digest)
            if status < 400
            else None,
        )
        try:
            await self._log.append(record)
        except ProvenanceError as exc:
            self._events.error(
                "completion record not written",
                request_id=record["request_id"],
                reason=type(exc).__name__,
            )

    async def refuse(
        self, exchange: Exchange, decision: Decision | None, error: GatewayError, body: bytes
    ) -> None:
        policy = (
            PolicyRef(decision.policy_id, decision.policy_version, decision.policy_digest)
            if decision is not None
            else PolicyRef(
                exchange.policy.split("@")[0],
                exchange.policy.partition("@")[2],
                exchange.policy_digest,
            )
        )
        rule = error.message.split(":", 1)[0].removeprefix("policy ") if error.message else ""
        record = refusal_record(
            request_id=exchange.request_id.decode(),
            time=datetime.now(UTC),
            tenant=exchange.tenant,
            model=exchange.model,
            policy=policy,
            trace=_trace(decision) if decision is not None else (),
            rule=rule or error.code.value,
            reason=error.code.value,
            request_commitment=None,
        )
        await self._append(record)

    async def _append(self, record: dict[str, object]) -> LogEntry:
        try:
            return await self._log.append(record)
        except LogUnavailableError as exc:
            raise GatewayError(
                ErrorCode.provenance_unavailable,
                "the provenance log cannot be written; requests are refused until it can",
            ) from exc

    def _remember(self, exchange: Exchange, envelope: bytes, index: int) -> None:
        receipts = self._receipts
        receipts[exchange.request_id.decode()] = (exchange.tenant, envelope, index)
        while len(receipts) > self._kept:
            receipts.popitem(last=False)

    def receipt(self, request_id: str, tenant: str) -> tuple[bytes, int] | None:
        """The receipt of a recent request, only for the tenant that made it."""
        found = self._receipts.get(request_id)
        if found is None or found[0] != tenant:
            return None
        return found[1], found[2]

    def status(self) -> dict[str, Any]:
        error = self._log.last_error
        return {
            "origin": self._log.origin,
            "size": self._log.size,
            "writable": error is None,
            "last_error": None if error is None else type(error).__name__,
        }

    async def close(self) -> None:
        await self._log.close()


def _trace(decision: Decision) -> tuple[TraceStep, ...]:
    return tuple(TraceStep(t.backend, t.verdict, t.rule) for t in decision.trace)


def _backend_ref(backend: BackendState) -> BackendRef:
    """The declared facts the policy judged, as the record states them."""
    facts = facts_of(backend.config)
    return BackendRef(
        id=facts.id,
        tier=facts.tier,
        kind=facts.kind,
        provider=facts.provider,
        owner=facts.owner,
        region=facts.region,
        retention=Retention(facts.retention_days, facts.zero_data_retention, facts.training),
    )


def usage_of(trail: Trail) -> Usage | None:
    """Token usage of the answer the trail saw (JSON body, or a stream's usage chunk)."""
    return _usage(trail.whole if trail.whole is not None else trail.tail)


def _usage(data: bytes) -> Usage | None:
    """Token usage from a JSON answer, or from the last usage chunk of a stream's tail."""
    candidates = (
        [data]
        if data[:1] == b"{"
        else [line[6:] for line in reversed(data.split(b"\n")) if line.startswith(b"data: {")]
    )
    for candidate in candidates:
        try:
            doc = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        usage = doc.get("usage") if isinstance(doc, dict) else None
        if isinstance(usage, dict):
            try:
                return Usage(
                    int(usage.get("prompt_tokens", 0)),
                    int(usage.get("completion_tokens", 0)),
                    int(usage.get("total_tokens", 0)),
                )
            except (TypeError, ValueError):
                return None
    return None
