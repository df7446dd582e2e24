"""Writing each request's provenance records, on the request path, failing closed.

Before a request body leaves for a backend, a `dispatch` record naming that backend,
the policy and a salted commitment to the body is made durable (group commit); after
the answer, a `completion` record with status, usage, latency and a commitment to the
response links back to it. A request refused before anything was dispatched gets a
`refusal` record instead: the refusing decision's rule and trace and the commitment to the
body. The salts go only to the client, in a DSSE receipt naming the dispatch (or refusal)
record (response header, a final SSE comment on streams, and
`GET /v1/provenance/receipts/{id}` for a while). If the log cannot be written the request
is refused with 503: no traffic flows unlogged.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.api.exchange import Exchange, cut_status
from gateway.api.receipts import ReceiptStore
from gateway.api.record_refs import RecordRefs
from gateway.api.recorder_log import open_log
from gateway.api.refusal import Refused
from gateway.api.trail import Trail
from gateway.canonical import canonical_json_of_plain
from gateway.config.schema import ProvenanceSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.policy import Decision
from gateway.provenance import (
    DataClass,
    LogEntry,
    LogUnavailableError,
    ProvenanceError,
    ProvenanceLog,
    Receipt,
    Salts,
    Usage,
    Verifier,
    commit,
    commit_digest,
    completion_record,
    dispatch_record,
    make_receipt,
    refusal_record,
)
from gateway.provenance.writer.sealer import Seal
from gateway.routing.registry import BackendState
from gateway.upstream.tls import Peer

__all__ = ["Recorder", "usage_of"]

_RETRY_SOON = ((b"retry-after", b"1"),)  # the disk is probed, checkpoints retried, each second

Written = asyncio.Future[LogEntry] | None  # a completion queued (`append_soon`), or none


class Recorder:
    """The request path's provenance writer. Built with the gateway (`gateway.app.assemble`)
    and passed to the proxy; its log is opened in the ASGI lifespan (`open`), since opening
    reads the signing key, recovers the write-ahead segment and takes the log's lock."""

    _log: ProvenanceLog  # set by `open`
    _signer: Any
    verifiers: list[Verifier]  # set by `open`
    retired_verifiers: list[Verifier]  # set by `open`

    def __init__(
        self, settings: ProvenanceSettings, config_dir: Path, *, new_origin: bool = False
    ) -> None:
        self._settings = settings
        self._config_dir = config_dir
        self._new_origin = new_origin  # `serve --new-log-origin`
        self.opened = False
        # bounded by count and bytes
        self.receipts = ReceiptStore(settings.receipts_kept, settings.receipts_memory_bytes)
        self._events = get_logger("owngate.provenance")
        # Receipts whose signing raised (the answer went out without one): a metric.
        self.receipt_failures = 0
        self._refs = RecordRefs()  # what records repeat, built once

    async def open(self) -> None:
        """Load the signing key and open the log (raises OSError or ProvenanceError)."""
        opened = await open_log(
            self._settings, self._config_dir, new_origin=self._new_origin, events=self._events
        )
        self._log, self._signer = opened.log, opened.signer
        self.verifiers, self.retired_verifiers = opened.verifiers, opened.retired_verifiers
        self.opened = True

    @property
    def log(self) -> ProvenanceLog:
        return self._log

    def start(self, body: bytes) -> Trail:
        salts = Salts.generate()
        return Trail(salts, commit("request", salts.request, body), prompt_bytes=len(body))

    async def dispatch(
        self,
        exchange: Exchange,
        trail: Trail,
        decision: Decision,
        backend: BackendState,
        peer: Peer | None = None,
    ) -> None:
        """Make the dispatch record durable; only then may the body leave. The receipt is
        signed by the log right after, while the request goes upstream
        (`Trail.sealed_receipt` waits for it). `peer`: who the TLS connection the body
        will go on authenticated (None: plain HTTP, or a hosted backend).

        Cancelled meanwhile (the client left, or a shutdown), the record still lands once
        queued, and a dispatch in the log needs its completion: the append is waited for
        (the log's own write bounds it) and, if it landed, completed (held) as cut (499 or
        503, nothing sent) before the cancellation goes on. A held completion goes first;
        if the log then refuses the dispatch record, it is taken back while no write made
        it durable, and held again (`_refused`)."""
        held = trail.held
        settled = self.settle(exchange, trail)
        if trail.dispatch is not None:
            # A later attempt: the answer gets a response salt of its own. An attested
            # backend tried before was sent the salts (`x-owngate-salts`): with them its
            # host, another party, could test guesses of this answer against the log.
            trail.salts = replace(trail.salts, response=Salts.generate().response)
        request_id = exchange.request_id.decode()
        policy, trace = self._refs.decided(decision)
        record = dispatch_record(
            request_id=request_id,
            time=datetime.now(UTC),
            tenant=exchange.tenant,
            model=exchange.model,
            policy=policy,
            trace=trace,
            backend=self._refs.backend(backend),
            fallback_reason=exchange.fallback,
            fallback_basis=exchange.fallback_basis if exchange.fallback is not None else None,
            provider_model=exchange.provider_model,
            request_commitment=trail.request_commitment,
            peer_spki=None if peer is None else peer.spki_sha256,
            attested=peer is not None and peer.attested,
            # the policy's class the decision applied (never the label's text)
            data_class=DataClass(decision.data_class),
            # unknown to the tenant: its receipt's leaf hash confirms no guess of the
            # trace (the backends the decision judged) nor of the fallback basis
            blind=secrets.token_hex(32),
        )
        seal = self._seal_of(exchange, trail, backend.id, decision)
        try:
            landing, sealing = self._log.queue_sealed(record, seal, checked=True)
        except LogUnavailableError as exc:
            self._refused(trail, held, settled)
            raise _unavailable() from exc
        try:  # awaited from this task: no task of its own, a loop turn fewer
            entry = await landing
        except asyncio.CancelledError:
            # `landing` refuses the cancellation: this runs once the append is done
            if landing.done() and not landing.cancelled() and landing.exception() is None:
                self._dispatched(exchange, trail, landing.result(), sealing)
                status, error = cut_status(exchange)
                self.complete(exchange, trail, status=status, error=error, held=True)
            else:
                self._refused(trail, held, settled)
            raise
        except LogUnavailableError as exc:
            self._refused(trail, held, settled)
            raise _unavailable() from exc
        self._dispatched(exchange, trail, entry, sealing)

    def _refused(
        self, trail: Trail, held: tuple[int, str | None, float] | None, settled: Written
    ) -> None:
        """The log refused a dispatch record: the completion of the failed attempt before
        it (`held`, written by `settle` just before) is the request's last record, and must
        say what the client gets, which is not known yet: its error, or nothing (499) if
        it left meanwhile, or a drain's cut (503). Taken back while no write made it
        durable (queued, or kept after the refused write), it is held again, and the
        request's end writes it with that status (`Proxy.answered`). Before, it stayed
        written with the attempt's own status (502) whatever the client then got."""
        if held is not None and (settled is None or self._log.withdraw(settled)):
            trail.held = held

    def _dispatched(
        self, exchange: Exchange, trail: Trail, entry: LogEntry, sealing: asyncio.Future[bytes]
    ) -> None:
        self._receipt_kept(exchange, trail, entry, sealing)
        trail.dispatch = entry
        # of this dispatch only
        trail.attestation, trail.countersignature, trail.upstream = None, None, None

    def _seal_of(
        self, exchange: Exchange, trail: Trail, backend_id: str, decision: Decision
    ) -> Seal:
        """The seal that makes the receipt naming a durable entry (run by the log)."""
        request_id = exchange.request_id.decode()
        origin, signer, salts = self._log.origin, self._signer, trail.salts
        digest = decision.policy_digest

        def seal(entry: LogEntry) -> bytes:
            receipt = Receipt(
                request_id, origin, entry.index, entry.leaf_hash, backend_id, digest, salts
            )
            if signer is None:  # batch receipts: the log's batch seal signs the payloads
                return canonical_json_of_plain(receipt.payload())
            return make_receipt(receipt, signer)

        return seal

    def _receipt_kept(
        self, exchange: Exchange, trail: Trail, entry: LogEntry, sealing: asyncio.Future[bytes]
    ) -> None:
        request_id = exchange.request_id.decode()
        sealing.add_done_callback(functools.partial(self._sealed, request_id))
        trail.receipt = sealing
        self.receipts.remember(request_id, exchange.tenant, sealing, entry.index)

    def _sealed(self, request_id: str, sealing: asyncio.Future[bytes]) -> None:
        error = None if sealing.cancelled() else sealing.exception()
        if error is not None:
            self.receipt_failures += 1  # owngate_receipt_failures_total
            self._events.error(
                "receipt not signed", request_id=request_id, reason=type(error).__name__
            )

    def complete(
        self,
        exchange: Exchange,
        trail: Trail,
        *,
        status: int,
        error: str | None,
        held: bool = False,
        ended_at: float | None = None,
    ) -> Written:
        """The completion record of the current dispatch, queued without waiting: the
        answer is already out (the dispatch record is what gates sending), so a failure to
        write it is logged, not raised. `held`: one whose answer the app sends (an error,
        a cut), kept until the next dispatch or the request's end (`settle`). Returns the
        queued record's future (None: held, or not queued)."""
        if trail.dispatch is None:
            return None
        if held:
            trail.held = (status, error, time.perf_counter())
            return None
        digest = trail.response_hash.digest()
        request_id = exchange.request_id.decode()
        try:
            record = completion_record(
                request_id=request_id,
                time=datetime.now(UTC),
                dispatch=trail.dispatch,
                status=status,
                error=error,
                usage=trail.usage(),
                latency_ms=round(((ended_at or time.perf_counter()) - exchange.started_at) * 1000),
                # What the client received, also of a stream that then broke off.
                response_commitment=commit_digest("response", trail.salts.response, digest)
                if status < 400 or trail.sent_bytes
                else None,
                attestation=trail.attestation,
                upstream=trail.upstream,
                usage_bound=trail.usage_bound(),
                stream_error=trail.stream_error,
                # unknown to the tenant: a level-0 neighbour hash in its inclusion proof
                # confirms no guess of this record (a latency, an attempt's status)
                blind=secrets.token_hex(32),
            )
            written = self._log.append_soon(record, checked=True)
        except ProvenanceError as exc:
            self._not_written(request_id, exc)
            return None
        written.add_done_callback(lambda done: self._completed(done, request_id))
        if trail.countersignature is not None:  # accepted, and in the record
            self.receipts.countersigned(
                request_id, exchange.tenant, trail.dispatch.index, trail.countersignature
            )
        return written

    def settle(self, exchange: Exchange, trail: Trail, ended: int | None = None) -> Written:
        """Write a failed attempt's completion held in `trail`, if any: before the next
        dispatch, with its own status; at the request's end, once the app's answer went
        out (or did not), with the status `ended` the client got (`Proxy.answered`: the
        answer's, 499 when the client left before it went out, 503 a drain's cut)."""
        if trail.held is not None:
            status, error, ended_at = trail.held
            trail.held = None
            status = status if ended is None else ended
            return self.complete(exchange, trail, status=status, error=error, ended_at=ended_at)
        return None

    def _completed(self, written: asyncio.Future[Any], request_id: str) -> None:
        error = None if written.cancelled() else written.exception()
        if error is not None:
            self._not_written(request_id, error)

    def _not_written(self, request_id: str, error: BaseException) -> None:
        self._events.error(
            "completion record not written", request_id=request_id, reason=type(error).__name__
        )

    async def refuse(self, exchange: Exchange, trail: Trail, refused: Refused) -> None:
        """The refusal record of a request nothing was dispatched for: the refusing
        decision's policy, trace and rule, and the commitment to the request body. Like a
        dispatch, it is durable before the client hears the answer, and the client gets a
        receipt for it (`backend` empty), whose salt opens that commitment.

        Cancelled meanwhile (a shutdown's cut), the record still lands once queued: the
        append is waited for, and if it landed the trail keeps it (`trail.refusal`, its
        receipt) before the cancellation goes on, so that the cut answers with the refusal
        the log holds (`TenantSurface._cut`), not with a 503 the log never says."""
        policy, trace = self._refs.decided(refused.decision)
        record = refusal_record(
            request_id=exchange.request_id.decode(),
            time=datetime.now(UTC),
            tenant=exchange.tenant,
            model=exchange.model,
            policy=policy,
            trace=trace,
            rule=refused.rule,
            reason=refused.code.value,
            request_commitment=trail.request_commitment,
            data_class=DataClass(refused.decision.data_class),
            # unknown to the tenant: its receipt's leaf hash confirms no guess of the
            # record (a hidden model's names its rule, a made-up one's does not; every
            # trace names the backends the decision judged, which no answer tells it)
            blind=secrets.token_hex(32),
        )
        seal = self._seal_of(exchange, trail, "", refused.decision)
        try:
            landing, sealing = self._log.queue_sealed(record, seal, checked=True)
        except LogUnavailableError as exc:
            raise _unavailable() from exc
        try:  # `landing` refuses a cancellation: it is raised once the append is done
            entry = await landing
        except asyncio.CancelledError:
            if landing.done() and not landing.cancelled() and landing.exception() is None:
                self._receipt_kept(exchange, trail, landing.result(), sealing)
                trail.refusal = landing.result()
            raise
        except LogUnavailableError as exc:
            raise _unavailable() from exc
        self._receipt_kept(exchange, trail, entry, sealing)
        trail.refusal = entry

    def receipt(self, request_id: str, tenant: str) -> tuple[asyncio.Future[bytes], int] | None:
        """The receipt of a recent request (being signed, or signed), only for the tenant
        that made it, and the index of the record it names."""
        return self.receipts.get(request_id, tenant)

    def status(self) -> dict[str, Any]:
        error, cleanup = self._log.last_error, self._log.cleanup_error
        unsigned, bound = self._log.unsigned_bytes
        return {
            "origin": self._log.origin,
            "size": self._log.size,
            "writable": error is None,
            "last_error": None if error is None else type(error).__name__,
            # why: the OS error and the log's file (never request content)
            "detail": None if error is None else str(error),
            "cleanup_error": None if cleanup is None else str(cleanup),
            "unsigned_bytes": unsigned,  # held in memory until a checkpoint covers them
            "max_unsigned_bytes": bound,
        }

    async def close(self) -> None:
        if self.opened:
            await self._log.close()


def _unavailable() -> GatewayError:
    return GatewayError(
        ErrorCode.provenance_unavailable,
        "the provenance log cannot be written; requests are refused until it can",
        headers=_RETRY_SOON,
    )


def usage_of(trail: Trail) -> Usage | None:
    """Token usage of the answer the trail saw (JSON body, or a stream's usage chunk,
    relayed or held back)."""
    return trail.usage()
