"""The `owngate attest` relay: raw ASGI in front of one inference server.

Every POST is relayed to the backend with the gateway's own upstream client
(`gateway/upstream/http.py`); the sidecar hashes the body it received and the body it
sends back, commits to both with the salts the gateway passed in `x-owngate-salts`
(`gateway/provenance/formats/commitments.py`, the same functions, so both sides compute
the same digests from the same bytes) and countersigns the statement (`Notary`). The
countersignature travels back as the `x-owngate-attest` header (a whole answer) or as a
final SSE comment line `: owngate-attest <base64>` (a stream: HTTP trailers would be the
natural place, but few clients and proxies pass them on, and the gateway's own listener
refuses them). Only answers below 400 are countersigned: an error answer is not relayed
to the gateway's client as served, and the gateway records none.

A request without salts (not from a gateway: a client that bypassed it) gets fresh ones:
it is countersigned and logged all the same, so the cross-check against the gateway's
log shows it. Other methods (`GET /health`, `/metrics`, `/v1/models`) are relayed
without a statement, so the gateway's probes and scrapes work through the sidecar.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.asgi import Receive, Scope, Send, header, lifespan, read_body, respond, send_error
from gateway.attest.notary import Notary
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.provenance import (
    ProvenanceError,
    ProvenanceLog,
    Salts,
    commit,
    commit_digest,
    load_signer,
)
from gateway.provenance.formats.attestation import (
    ATTEST_HEADER,
    SALTS_HEADER,
    SSE_PREFIX,
    parse_salts,
)
from gateway.upstream.http import HttpPool, UpstreamError, UpstreamResponse

__all__ = ["AttestApp", "AttestSettings"]

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}\Z")
# What reaches the backend: the request's framing, credentials and trace context, no more.
_FORWARDED = frozenset({b"content-type", b"authorization", b"accept", b"traceparent"})
_SSE = b"text/event-stream"


@dataclass(frozen=True, slots=True)
class AttestSettings:
    backend: str  # the inference server's root URL
    key_file: Path
    log_dir: Path
    origin: str | None = None  # the log's origin line; default: the key's name
    max_body: int = 16 * 1024 * 1024
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    max_connections: int = 1024


class AttestApp:
    """The sidecar's ASGI app; the key and log open in the lifespan."""

    notary: Notary  # set at startup
    _pool: HttpPool
    _base: bytes

    def __init__(self, settings: AttestSettings) -> None:
        self._settings = settings
        self._log: ProvenanceLog | None = None
        self._events = get_logger("owngate.attest")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, self._startup, self._shutdown)
            return
        if scope["type"] != "http":
            return
        try:
            await self._relay(scope, receive, send)
        except GatewayError as error:
            await send_error(send, error, header(scope, b"x-request-id") or b"-")

    async def _startup(self) -> str | None:
        s = self._settings
        try:
            signer = load_signer(s.key_file)
            self._log = await ProvenanceLog.open(s.log_dir, s.origin or signer.name, signer)
            self._pool, self._base = HttpPool.for_url(
                s.backend,
                connect_timeout=s.connect_timeout,
                first_byte_timeout=s.read_timeout,
                read_timeout=s.read_timeout,
                max_connections=s.max_connections,
                max_body=s.max_body,
            )
        except (OSError, ValueError, ProvenanceError) as exc:  # key, log or backend URL
            return f"owngate attest: {exc}"
        self.notary = Notary(signer, self._log)
        return None

    async def _shutdown(self) -> str | None:
        if self._log is not None:
            await self._log.close()
        await self._pool.close()
        return None

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(scope, receive, self._settings.max_body)
        path = scope.get("raw_path") or scope["path"].encode()
        method = scope["method"].encode()
        headers = [(k, v) for k, v in scope["headers"] if k in _FORWARDED]
        if method != b"POST":
            await self._plain(method, path, headers, body, send)
            return
        if not self.notary.writable:
            raise GatewayError(
                ErrorCode.provenance_unavailable,
                "the attestation log cannot be written; requests are refused until it can",
            )
        # A client (the gateway) that leaves stops the relay: the backend connection is
        # dropped and nothing is countersigned for an answer it did not receive.
        watch = _Watch()
        watcher = asyncio.create_task(watch.run(receive))
        try:
            await self._attested(scope, send, method, path, headers, body, watch)
        finally:
            watcher.cancel()

    async def _attested(
        self,
        scope: Scope,
        send: Send,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        watch: _Watch,
    ) -> None:
        """Relay one POST and countersign its answer (unless the client left)."""
        given = header(scope, b"x-request-id")
        request_id = (
            given
            if given and _REQUEST_ID.match(given)
            else b"attest-" + os.urandom(8).hex().encode()
        )
        headers.append((b"x-request-id", request_id))
        salts = parse_salts(header(scope, SALTS_HEADER)) or Salts.generate()
        request_commitment = commit("request", salts.request, body)
        response = watch.response = await self._send(method, self._base + path, headers, body)
        try:
            if watch.left:
                return
            content_type = response.header(b"content-type") or b"application/json"
            if response.status >= 400 or not content_type.startswith(_SSE):
                data = await self._read(response)
                if watch.left:
                    return
                extra: tuple[tuple[bytes, bytes], ...] = ()
                if response.status < 400:
                    digest = commit("response", salts.response, data)
                    envelope = self.notary.countersign(
                        request_id.decode(), request_commitment, digest
                    )
                    extra = ((ATTEST_HEADER, base64.b64encode(envelope)),)
                await respond(send, response.status, data, content_type, extra)
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")],
                }
            )
            hashed = hashlib.sha256()
            try:
                async for chunk in response.chunks(response.stream_deadline):
                    hashed.update(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError:
                if watch.left:
                    return
                raise  # the backend broke off: the connection closes, nothing is signed
            digest = commit_digest("response", salts.response, hashed.digest())
            envelope = self.notary.countersign(request_id.decode(), request_commitment, digest)
            line = SSE_PREFIX + base64.b64encode(envelope) + b"\n\n"
            await send({"type": "http.response.body", "body": line, "more_body": False})
        finally:
            response.abort()  # no-op once the exchange completed and the connection is pooled

    async def _plain(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        send: Send,
    ) -> None:
        """Relay without a statement (probes, metrics, model lists)."""
        response = await self._send(method, self._base + path, headers, body)
        try:
            data = await self._read(response)
        finally:
            response.abort()
        content_type = response.header(b"content-type") or b"text/plain"
        await respond(send, response.status, data, content_type)

    async def _send(
        self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        try:
            return await self._pool.request(method, path, headers, body)
        except UpstreamError as exc:
            raise GatewayError(
                ErrorCode.backend_unavailable, f"the backend did not answer: {exc.kind}"
            ) from exc

    async def _read(self, response: UpstreamResponse) -> bytes:
        try:
            data = await response.read()
        except UpstreamError as exc:
            raise GatewayError(
                ErrorCode.upstream_error, f"the backend's answer broke off: {exc.kind}"
            ) from exc
        return data


class _Watch:
    """Whether the client left, and the backend answer to drop when it does."""

    def __init__(self) -> None:
        self.left = False
        self.response: UpstreamResponse | None = None

    async def run(self, receive: Receive) -> None:
        """Wait for the disconnect (after a complete response uvicorn reports one too:
        aborting a finished answer is a no-op)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = True
        if self.response is not None:
            self.response.abort()
