"""The tenant surface: the proxied OpenAI endpoints (the tenant's authentication is
gateway/api/tenant_auth.py; its read-only paths, `/v1/models` and `/v1/provenance/...`,
are gateway/api/tenant_reads.py).

Every request here authenticates with a tenant API key (`Authorization: Bearer KEY`,
looked up by digest in the key index, `gateway.tenants`). A proxied request
(`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) is then admitted against
the tenant's rate limits, its body read once, and handed to the proxy (api/proxy.py:
decide, plan, record, relay); errors become OpenAI error objects here, with the receipt
headers when the prompt may have left. Each request ends with one access-log line and
its metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING, Final

from gateway import access_log
from gateway.api.body import held_bound, scan_body
from gateway.api.exchange import Exchange, client_left, receipt_headers, receipt_headers_now
from gateway.api.reservation import rate_limited
from gateway.api.runtime import Runtime
from gateway.api.standing import Standing
from gateway.api.stream_writes import end_stream, event_break, send_error_event
from gateway.api.tenant_auth import TenantAuth, key_digest
from gateway.asgi import (
    Receive,
    Scope,
    Send,
    read_body,
    send_error,
)
from gateway.body_budget import Held
from gateway.body_writer import body_writer
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger
from gateway.state import Admission, RateLimited
from gateway.tenants import TenantEntry

if TYPE_CHECKING:
    from gateway.api.proxy import Proxy

__all__ = ["PROXIED", "TenantSurface", "new_request_id"]

PROXIED: Final = {
    "/v1/chat/completions": ("chat", b"/v1/chat/completions"),
    "/v1/completions": ("completions", b"/v1/completions"),
    "/v1/embeddings": ("embeddings", b"/v1/embeddings"),
}
"""The proxied paths: the endpoint name (metrics, logs) and the upstream path."""


def new_request_id() -> bytes:
    return b"req_" + os.urandom(12).hex().encode()


class TenantSurface:
    """The handlers of the tenant-facing paths, reading `runtime` on each request."""

    def __init__(self, runtime: Runtime, auth: TenantAuth) -> None:
        self._runtime = runtime
        self._auth = auth
        self._log = get_logger("owngate.access")

    async def proxied(
        self, scope: Scope, receive: Receive, send: Send, endpoint: str, upstream_path: bytes
    ) -> None:
        """One request to a proxied path, answered whatever happens."""
        runtime = self._runtime
        task = asyncio.current_task()  # one look-up: the set holds it until the answer ends
        exchange = Exchange(new_request_id(), time.perf_counter(), endpoint)
        exchange.writer = body_writer(scope)
        proxy: Proxy | None = None  # the one that served it, told when its answer is over
        answered: int | None = None  # the status of the answer sent, once it went out
        try:
            if runtime.tracer is not None:  # tracing on (gateway/tracing): the request's span
                exchange.span = runtime.tracer.request(scope, endpoint, exchange.request_id)
            if scope["method"] != "POST":
                raise GatewayError(ErrorCode.method_not_allowed, f"{endpoint} accepts only POST")
            if not runtime.ready:
                raise GatewayError(ErrorCode.not_ready, "the gateway is not ready")
            self._auth.refuse_if_stale()
            runtime.serving.add(task)  # type: ignore[arg-type]
            digest = key_digest(scope)
            tenant = self._auth.tenant_of(digest)
            exchange.tenant = tenant.id
            admission = exchange.admission = await self._admit(tenant)
            exchange.charge = lambda: admission.release(_tokens_used(exchange))
            limits = runtime.parts.limits  # plain copies of `config.limits`
            held = runtime.bodies.hold(
                limits.max_held_body_bytes, tenant.id, limits.tenant_held_body_bytes
            )
            answer = exchange.answer = runtime.answers.hold(
                limits.max_held_answer_bytes, tenant.id, limits.tenant_held_answer_bytes
            )
            try:
                body = await read_body(scope, receive, limits.max_body_bytes, held)
                # What parsing it may take, held until the request ends: reserved before
                # the parse, so a body of tiny values cannot grow the process unseen.
                scan = scan_body(body)
                held.cover(held_bound(body, scan))
                # The parts active now, not at arrival: a config reload while the body was
                # arriving binds this request's decision and plan, as it binds later ones;
                # and its tenant (a key removed or revoked, models taken away meanwhile).
                tenant = self._auth.reauthenticated(digest, tenant)
                # ... and asked again while it is in flight (queued, connecting, failing
                # over): a key revoked or removed then stops what was not yet sent.
                standing = Standing(digest, tenant, lambda: runtime.parts)
                proxy = runtime.parts.proxy
                await proxy.forward(
                    exchange, standing, scope, body, scan, upstream_path, receive, send
                )
                answered = exchange.status
            finally:
                # The answer is over: a drain deadline from now on must not cut (and write
                # to) a finished response, nor interrupt the release.
                runtime.serving.discard(task)
                held.release()
                try:
                    await admission.release(_tokens_used(exchange))
                finally:
                    await _answer_taken(exchange, answer)
        except GatewayError as error:
            exchange.status, exchange.error_code = error.status, error.code.value
            if not exchange.response_started:
                # The prompt may have left (and been logged): the receipt says where.
                try:
                    headers = await receipt_headers(exchange)
                except asyncio.CancelledError:
                    answered = await self._cancelled(exchange, send)
                    if answered is None:
                        raise
                    return
                await send_error(send, error, exchange.request_id, headers)
            answered = error.status
        except asyncio.CancelledError:
            if answered is None and exchange.ended:  # its last message went out before
                answered = exchange.status
            if answered is not None:  # the answer went out: nothing to say to the client
                raise
            answered = await self._cancelled(exchange, send)
            if answered is None:
                raise
        except Exception:  # noqa: BLE001 - last resort: logged, answered 500, never passed on
            exchange.status, exchange.error_code = 500, ErrorCode.internal_error.value
            self._log.exception("unhandled error", request_id=exchange.request_id.decode())
            if not exchange.response_started:
                internal = GatewayError(ErrorCode.internal_error, "internal gateway error")
                # Like any error once a dispatch was logged: its receipt says where (the
                # fault may be in what gives it, then the 500 goes out without one).
                receipt: tuple[tuple[bytes, bytes], ...] = ()
                try:
                    with contextlib.suppress(Exception):
                        receipt = await receipt_headers(exchange)
                except asyncio.CancelledError:
                    answered = await self._cancelled(exchange, send)
                    if answered is None:
                        raise
                    return
                await send_error(send, internal, exchange.request_id, receipt)
            answered = exchange.status
        finally:
            runtime.serving.discard(task)
            trail = exchange.trail
            if trail is not None and trail.held is not None and proxy is not None:
                proxy.answered(exchange, answered)  # a held completion: what went out
            self._finish(exchange)

    async def _cancelled(self, exchange: Exchange, send: Send) -> int | None:
        """This request's task was cancelled before its answer went out (the proxy
        absorbs a cancellation of its own, its client leaving): by a shutdown, whose cut
        it answers (`_cut`; the status sent); None: not by a shutdown, it goes on."""
        runtime = self._runtime
        if not runtime.draining:
            return None
        await self._cut(exchange, send, wait=runtime.cutting)
        return exchange.status

    async def _cut(self, exchange: Exchange, send: Send, *, wait: bool) -> None:
        """The gateway is shutting down with this request still running: end it cleanly
        with the 503 its completion record says (a stream gets an error event, its
        receipt and a proper end; a whole answer whose head went out, its connection
        closed; others a 503). `wait`: the app's own cut (its drain
        deadline passed) waits for the receipt; uvicorn's forced shutdown (a second
        signal, or its graceful timeout: it cancels every request still running), or one
        that cancels the wait, gets the answer at once, with the receipt only if it was
        signed already. Before, that cancellation left the app and uvicorn sent its own
        plain 500 (or cut a stream off unended), while the record said 503.

        A request whose refusal record is in the log gets that refusal (its status, its
        receipt), not the 503: the log says it was refused, and the client must hear the
        same (before, it got 503 `not_ready`, with the refusal's receipt if signed)."""
        _uncancel()
        why = "its drain deadline passed" if self._runtime.cutting else "it was forced to stop"
        error = exchange.refused or GatewayError(
            ErrorCode.not_ready, f"the gateway is shutting down and {why}"
        )
        whole = exchange.streaming and exchange.read_whole
        if not whole:  # a stream whose `[DONE]` went out keeps its status (`cut_status`)
            exchange.status, exchange.error_code = error.status, error.code.value
        if not exchange.response_started:
            headers = receipt_headers_now(exchange)
            if wait:
                try:
                    headers = await receipt_headers(exchange)
                except asyncio.CancelledError:
                    _uncancel()
                    headers = receipt_headers_now(exchange)
            await send_error(send, error, exchange.request_id, headers)
            return
        if exchange.streaming:  # a stream, whether or not the request asked for one
            # The relayed bytes may end inside an event (the backend was cut mid-write):
            # the error is an event of its own, as when the backend breaks off. After
            # `[DONE]` none: the client read the answer whole, and it ends as its end would.
            if not whole:
                await send_error_event(send, error, before=event_break(exchange))
                exchange.relayed_before, exchange.last_relayed = b"", b"\n\n"
            if wait:
                try:
                    await end_stream(send, exchange, recorded=True)
                    return
                except asyncio.CancelledError:
                    _uncancel()
                    if client_left(exchange):  # it got nothing more: recorded 499
                        raise
            await end_stream(send, exchange, now=True)
            return
        writer = exchange.writer
        if writer is not None and not writer.body_sent:
            # A whole answer whose head went out alone (after a `100 Continue`) and whose
            # body's send waited for room: no body can follow (its record commits to
            # none), and an empty one would fall short of its content-length (uvicorn
            # raised, logging a traceback). The connection is closed, after what it
            # still buffers (an earlier answer on it, which its record says went out):
            # the client sees the cut this record says, and all of the earlier answer.
            writer.close()
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _finish(self, exchange: Exchange) -> None:
        parts = self._runtime.parts
        elapsed = time.perf_counter() - exchange.started_at
        parts.metrics.observe_request(exchange.endpoint, exchange.status, exchange.backend, elapsed)
        bound = None if exchange.trail is None else exchange.trail.usage_bound()
        if bound is not None:  # the backend reported more than the request justified
            parts.metrics.usage_over_bound(exchange.backend)
            self._log.warning(
                "backend usage over bound: charged the bound",
                request_id=exchange.request_id.decode(),
                tenant=exchange.tenant,
                backend=exchange.backend,
                bound=bound,
            )
        if parts.limits.access_log:
            fields = {
                "request_id": exchange.request_id.decode(),
                "endpoint": exchange.endpoint,
                "tenant": exchange.tenant,
                "model": exchange.model,
                "data_class": exchange.data_class,
                "data_class_defaulted": exchange.data_class_defaulted,
                "policy": exchange.policy,
                "backend": exchange.backend,
                "fallback": exchange.fallback,
                "status": exchange.status,
                "stream": exchange.stream,
                "upstream_error": exchange.upstream_error,
                "duration_ms": round(elapsed * 1000, 3),
            }
            if exchange.unserved is not None:  # only a request no backend served has it
                fields["unserved"] = exchange.unserved
            writer = access_log.current()
            if writer is not None:  # the JSON log: encoded here, written off the loop
                writer.emit(fields)
            else:
                self._log.info("request", **fields)
        if exchange.span is not None:
            exchange.span.end(exchange)

    async def _admit(self, tenant: TenantEntry) -> Admission:
        """The tenant's rate limits (per process, or across replicas with Redis)."""
        try:
            return await self._runtime.parts.state.acquire(tenant.id, tenant.limits)
        except RateLimited as exc:
            raise rate_limited(exc) from exc


async def _answer_taken(exchange: Exchange, answer: Held) -> None:
    """Give the request's share of the budget for whole answers back (`answer`), once its
    client has taken the answer: a client that reads slower than it is answered leaves
    the answer in its connection's write buffer, which holds it until the client has
    read all but the buffer's low-water mark, it leaves, or `listen.write_timeout_s`
    cuts it off. An answer that did not end (a cut: its body never went out) is in no
    buffer: no wait (before, a drain deadline's cut waited here on a client that reads
    nothing, until uvicorn's own shutdown timeout cancelled it again)."""
    try:
        writer = exchange.writer
        if answer.size and exchange.ended and writer is not None and writer.write_paused:
            await writer.drain()
    except asyncio.CancelledError:
        if not exchange.ended:
            raise
        # A shutdown cut the wait (nothing else cancels a request whose answer went out):
        # the answer was handed to the connection whole, so the request ends as answered,
        # not as an error uvicorn logs with its traceback.
        _uncancel()
    finally:
        answer.release()


def _tokens_used(exchange: Exchange) -> int:
    """Tokens to charge to the tenant's per-minute budget: the answer's usage, or an
    estimate when the backend reported none (`Trail.charged_tokens`)."""
    return 0 if exchange.trail is None else exchange.trail.charged_tokens()


def _uncancel() -> None:
    """Take back the cancellation being handled, so that the answer it asks for can go
    out (a cancellation raised by the gateway itself, not `cancel`'s, takes back none)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
