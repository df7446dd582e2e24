"""The tenant's read-only paths: `GET /v1/models` (the models the tenant may use) and
`GET /v1/provenance/receipts/{id}` and `/proofs/{id}` (its own requests' receipts and
inclusion proofs). Each authenticates with the tenant surface's key check
(gateway/api/openai.py); nothing is proxied.

A proof is read from the stored tiles on the log's checkpoint thread, one read at a time
and in order with the checkpoint exports (gateway/provenance/writer/checkpointer.py), so
the reads one process has in flight are bounded (`ProofReads`): at most `PROOF_READS`,
and one tenant at most `PROOF_READS_PER_TENANT` of them; past either, 429 at once. Before,
every proof request queued a read however many waited (a client closing each connection
right after its request left its read queued): a checkpoint fell due behind all of them,
for every tenant, and an export that had not returned for `export_stall_after_s` (the
wait counted) made the log unready, every tenant's requests 503."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Final

from gateway.api.listing import listed
from gateway.api.runtime import Runtime
from gateway.asgi import (
    JSON,
    PRIVATE_ANSWER,
    Receive,
    Scope,
    Send,
    send_bytes,
    send_error,
    send_json,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.in_flight import InFlight
from gateway.tenants import TenantEntry

__all__ = ["PROOF_READS", "PROOF_READS_PER_TENANT", "ProofReads", "TenantReads"]

# Proof reads in flight at once (on the checkpoint thread or waiting for it), per process:
# a checkpoint falling due waits behind at most these (~1 ms each on a local disk).
PROOF_READS: Final = 8
PROOF_READS_PER_TENANT: Final = 4  # of them, one tenant's


class ProofReads:
    """The proof reads in flight, in all and per tenant (`taken`: one more, or 429)."""

    def __init__(self, most: int = PROOF_READS, per_tenant: int = PROOF_READS_PER_TENANT) -> None:
        self._in_flight = InFlight(
            most,
            per_tenant,
            lambda mine: (
                f"your requests already read {mine} inclusion proofs at once, as many "
                "as one tenant's may; retry when one is answered"
            ),
            lambda total: (
                f"the gateway already reads {total} inclusion proofs at once, as "
                "many as it reads; retry shortly"
            ),
        )

    def reading(self, tenant: str) -> int:
        return self._in_flight.held(tenant)

    @contextlib.contextmanager
    def taken(self, tenant: str) -> Iterator[None]:
        """Hold one read of `tenant` for the block; raises `GatewayError` (429, retry after
        1 s) when the tenant or the process already reads as many as it may."""
        self._in_flight.take(tenant)
        try:
            yield
        finally:
            self._in_flight.give_back(tenant)


class TenantReads:
    """The handlers of the tenant's read-only paths, reading `runtime` on each request and
    authenticating it with `authenticate` (`TenantAuth.authenticate`)."""

    def __init__(self, runtime: Runtime, authenticate: Callable[[Scope], TenantEntry]) -> None:
        self._runtime = runtime
        self._authenticate = authenticate
        self._proofs = ProofReads()  # outlives config reloads, as the log does

    async def models(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """`GET /v1/models`: the models the tenant may use and its policy does not refuse
        (`listed`: every other name is the proxied paths' 404 of one that does not exist),
        each `owned_by` the owner of the first backend (gateway.yaml order) serving it
        that the tenant's policy admits."""
        try:
            if scope["method"] != "GET":
                raise GatewayError(ErrorCode.method_not_allowed, "/v1/models accepts only GET")
            tenant = self._authenticate(scope)
        except GatewayError as error:
            await send_error(send, error, request_id)
            return
        parts = self._runtime.parts
        policy, registry = parts.policies.current, parts.registry
        data = []
        for name in sorted(registry.routes):
            decision = listed(policy, registry, tenant, name)  # what the proxied paths ask
            if decision is None:
                continue
            # The owner of a backend this tenant's policy admits, never of one it denies
            # (another tenant's, an owner the policy excluded: docs/security.md).
            admitted = {*decision.private, *decision.hosted}
            owner = next((o for b, o in registry.owners[name] if b in admitted), "owngate")
            data.append({"id": name, "object": "model", "created": 0, "owned_by": owner})
        await send_json(send, 200, {"object": "list", "data": data}, request_id)

    async def provenance(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        """`GET /v1/provenance/receipts/{id}` and `/proofs/{id}`, for the tenant that sent it."""
        try:
            if scope["method"] != "GET":
                raise GatewayError(ErrorCode.method_not_allowed, "provenance paths accept GET")
            tenant = self._authenticate(scope)
            _, _, rest = scope["path"].partition("/v1/provenance/")
            kind, _, wanted = rest.partition("/")
            recorder = self._runtime.parts.recorder
            found = recorder.receipt(wanted, tenant.id) if recorder is not None else None
            if kind not in ("receipts", "proofs") or recorder is None or found is None:
                raise GatewayError(
                    ErrorCode.not_found, "no receipt for that request id (or not yours)"
                )
            sealing, index = found
            if kind == "receipts":
                try:
                    envelope = await asyncio.shield(sealing)
                except Exception as exc:  # Recorder._sealed logged the cause
                    raise GatewayError(
                        ErrorCode.provenance_unavailable, "the receipt could not be signed"
                    ) from exc
                # its salts open the request's commitments: for this caller alone
                await send_bytes(send, 200, envelope, request_id, JSON, PRIVATE_ANSWER)
                return
            try:
                with self._proofs.taken(tenant.id):
                    proof = await recorder.log.inclusion_proof(index)
            except ValueError as exc:
                raise GatewayError(
                    ErrorCode.not_found,
                    "the request is logged but no signed checkpoint covers it yet; retry "
                    "in a second",
                ) from exc
            proof_text = proof.format().encode()
            await send_bytes(send, 200, proof_text, request_id, b"text/plain", PRIVATE_ANSWER)
        except GatewayError as error:
            await send_error(send, error, request_id)
