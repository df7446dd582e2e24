"""Serving a request from a hosted provider (through LiteLLM), only as policy allows.

The dispatcher reaches this only for backends the tenant's trust policy listed as
fallbacks, in the order and as often as the request's plan says
(gateway/routing/router.py). `prepare` checks the request for the provider before the
attempt's dispatch record (`NotSent`: nothing sent, no record, the next backend may
serve); `attempt` sends it. Answers come back in OpenAI format (JSON, or SSE events
relayed as the provider sends them); a failure before the client saw a byte raises
`TryNext`, except a request LiteLLM or the provider refused as invalid (400, 413, 422):
that is the client's 400 `upstream_bad_request`, as from a private backend, and no other
backend is tried. The provider's own ids for the answer (its `id`, request-id headers from
an allow-list) go into the completion record (`upstream`). A whole answer is held
against `limits.max_held_answer_bytes` as a private one is (gateway/api/answer_reads.py),
once LiteLLM has read it.

A provider has circuit breakers as a private backend has (gateway/routing/attempt.py,
the same classes and `routing.breaker` settings; with several tenants, per tenant too):
the plan admits the attempt by them before its dispatch record (one not admitted is
skipped, not dispatched), and it is judged only by what the provider did (`judge`,
gateway/api/hosted_failures.py). Its failures: no connection (refused, TLS), a timeout,
a 5xx (an error object in a 200 answer with a 5xx code too), a protocol failure, a
stream that broke off; each charged to the tenant too (with several tenants configured,
the provider's breaker opens once a run of them holds two tenants' failures). Not
failures, and no verdict: a 429 (the provider is up and rate-limits: the next request
may go, its breaker does not keep requests away), a 400, 413 or 422 (the client's,
whether the provider answered it or LiteLLM refused to send it), 401, 403, 404, a
redirect, a failure before anything was sent (`untranslated`: the next backend is tried,
and the client gets its 400 only if none serves), and the gateway's own limits (answer
budget, size, `limits.stream_timeout_s`). A real answer closes the breakers.

LiteLLM failing to load (`HostedUnavailable`, in `prepare`: before the dispatch record)
is the gateway's own failure and no provider's: no verdict, counted as
`kind="litellm_load"` and logged (gateway/api/hosted_signals.py), and `NotSent` marked
`hosted_down`, so that the plan tries no other hosted backend for the request (each
would fail the same way); a private one may still serve. The attempt has no record; if
nothing was dispatched, the client gets 503 `backend_unavailable` naming the backends
"hosted provider unavailable", with a refusal record (`owngate/hosted_unavailable`).
`owngate_hosted_attempts_total` counts only the calls made (`attempt`).

A hosted backend's calls are held to each tenant's share of them, as a private pool's
connections are (`limits.tenant_share_of_backend` of `max_connections_per_backend`;
gateway/upstream/tenant_share.py): every tenant shares LiteLLM's connector, and one
tenant's unread streams could hold all its connections. A tenant at its share is `busy`
on the backend before anything is sent (no verdict; it fails over, or gets 503), and an
admitted call counts until its answer was relayed or abandoned.

Every tenant shares the provider account: `prompt_cache_key`, `user` and
`safety_identifier` are sent as the tenant's own, keyed digests of what the client wrote
(gateway/upstream/tenant_ids.py), so that no tenant names another's prompt cache or end
user at the provider. The records commit to the client's body, as it sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gateway.api.answer_reads import cover_answer
from gateway.api.exchange import (
    Exchange,
    TryNext,
    client_left,
    first_chunk_seconds,
    relayed,
    send_relayed,
    send_whole,
)
from gateway.api.hosted_failures import judge, last_error, untranslated
from gateway.api.hosted_signals import HostedSignals
from gateway.api.metrics import GatewayMetrics
from gateway.api.stream_writes import break_stream, end_stream, start_stream
from gateway.asgi import Send
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.formats.upstream_ids import UpstreamIds
from gateway.routing.attempt import Attempt
from gateway.routing.registry import BackendState
from gateway.upstream.errors import sanitize_upstream_message
from gateway.upstream.hosted import (
    HostedClient,
    HostedError,
    HostedResponse,
    HostedUnavailable,
    Prepared,
)
from gateway.upstream.http import DEFAULT_MAX_BODY
from gateway.upstream.openai_wire import DONE
from gateway.upstream.tenant_ids import scoped_params

__all__ = ["HostedRelay", "NotSent"]

# The statuses that blame the request, as for private backends (`translate_upstream_error`).
_CLIENT_ERRORS = frozenset({400, 413, 422})
# Failures after which the prompt is not charged (`Trail.offered`), as on the private path
# (gateway/api/passthrough.py): never sent (`untranslated`), never reached the provider
# (`connect`; `exhausted`: the gateway had no descriptor to call it), or refused with an
# error status. A timeout or a broken answer is charged: the provider may have read (and
# be working on) the prompt.
_NOT_SERVED: Final = frozenset({"untranslated", "connect", "exhausted", "status"})
_PAST_SHARE: Final = "this tenant holds its share of the backend's calls"


class NotSent(Exception):
    """A hosted attempt refused before anything was sent, or its dispatch record written
    (`HostedRelay.prepare`): `reason` says why (`<backend>: ...`), `error` is the 400
    `upstream_bad_request` the client gets if no other backend serves; or, `hosted_down`,
    LiteLLM did not load (no hosted backend can be called: `error` is None)."""

    def __init__(
        self, reason: str, error: GatewayError | None, *, hosted_down: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.hosted_down = hosted_down


class HostedRelay:
    def __init__(
        self,
        metrics: GatewayMetrics,
        environ: Mapping[str, str],
        timeout_s: float,
        backends: Iterable[BackendState] = (),
        *,
        max_response_bytes: int = DEFAULT_MAX_BODY,
        response_timeout_s: float | None = None,
        stream_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
    ) -> None:
        """`stream_timeout_s`: how long a stream may run from the call (None: unbounded,
        as `limits.stream_timeout_s` is by default); past it, it ends with an
        `upstream_timeout` error event and the provider call is closed. `read_timeout_s`:
        how long a stream may go without an event after its first (None: unbounded), as
        `limits.read_timeout_s` bounds a private stream's silence; past it, the same."""
        self._metrics = metrics
        self._signals = HostedSignals(metrics)
        self._stream_timeout_s = stream_timeout_s
        # LiteLLM reads a whole answer before the gateway sees it: the limit keeps an
        # oversized one from the client, not from this process's memory.
        self._max_response_bytes = max_response_bytes
        self._response_timeout_s = response_timeout_s
        self._environ = environ
        self._timeout_s = timeout_s
        self._read_timeout_s = read_timeout_s
        self._clients: dict[str, HostedClient] = {}
        # Built at startup (LiteLLM itself is imported on the first call): a provider key
        # named in the config but missing from the environment stops the gateway starting.
        for backend in backends:
            if not backend.config.is_private:
                self._client(backend)

    def _client(self, backend: BackendState) -> HostedClient:
        client = self._clients.get(backend.id)
        if client is None:
            client = HostedClient(
                backend.config,
                environ=self._environ,
                timeout_s=self._timeout_s,
                response_timeout_s=self._response_timeout_s,
                max_answer_bytes=self._max_response_bytes,
                idle_timeout_s=self._read_timeout_s,
            )
            self._clients[backend.id] = client
        return client

    async def prepare(self, exchange: Exchange, attempt: Attempt, doc: dict[str, Any]) -> Prepared:
        """The request checked for `attempt`'s provider without sending anything
        (`HostedClient.prepare`), before the attempt's dispatch record: one it refuses
        raises `NotSent` (the 400 the client gets if no other backend serves), and the
        attempt is not made; so is one for which LiteLLM cannot be loaded (`NotSent`
        marked `hosted_down`, counted and logged). No verdict on the provider: its
        breakers are not told."""
        backend = attempt.backend
        try:
            return await self._client(backend).prepare(
                exchange.endpoint,  # type: ignore[arg-type]
                scoped_params(doc, exchange.tenant),  # the tenant's own cache key and user
                attempt.route.upstream_model,
                exchange.tenant,
            )
        except HostedUnavailable as exc:  # no verdict: no provider was called
            exchange.upstream_error = "litellm_load"
            self._signals.load_failed(backend.id, exc.error_class, _now())
            reason = f"{backend.id}: hosted provider unavailable"
            raise NotSent(reason, None, hosted_down=True) from exc
        except HostedError as exc:
            error = GatewayError(
                ErrorCode.upstream_bad_request,
                sanitize_upstream_message(exc.public),  # names no provider
                param=exc.param,
            )
            reason = f"{backend.id}: {sanitize_upstream_message(exc.message)}"
            raise NotSent(reason, error) from None

    async def attempt(
        self, exchange: Exchange, attempt: Attempt, prepared: Prepared, send: Send
    ) -> None:
        """Serve the request `prepare` checked from `attempt`'s provider, or raise
        `TryNext` before any byte (its in-flight count is the plan's,
        gateway/routing/router.py). The plan admitted the attempt (its breakers) before
        its dispatch record was written. A tenant holding its share of the backend's
        calls (`BackendState.calls`, gateway/upstream/tenant_share.py) is `busy` here,
        before anything is sent, as at a private pool's share; a call admitted counts
        until its answer was relayed or abandoned, whichever way this returns."""
        backend = attempt.backend
        exchange.backend = backend.id
        calls, tenant = backend.calls, exchange.tenant
        if calls is not None and not calls.hold(tenant):  # past its share: nothing sent
            self._metrics.upstream_error(backend.id, "busy")
            exchange.upstream_error = "busy"
            attempt.upstream_failed("busy", _PAST_SHARE)  # the gateway's limit: no verdict
            raise TryNext(f"{backend.id}: busy", busy=True)
        try:
            await self._call(exchange, attempt, prepared, send)
        finally:  # answered, failed, cancelled or the client gone: the call is over
            if calls is not None:
                calls.release(tenant)

    async def _call(
        self, exchange: Exchange, attempt: Attempt, prepared: Prepared, send: Send
    ) -> None:
        """`attempt`'s call, held within its tenant's share of the backend's calls."""
        backend = attempt.backend
        timeout = self._stream_timeout_s
        ends_by = None if timeout is None else asyncio.get_running_loop().time() + timeout
        self._metrics.hosted_attempt(backend.id)  # a call made (LiteLLM loaded in `prepare`)
        trail = exchange.trail
        offered = trail is not None and trail.offered
        if trail is not None:
            trail.offered = True  # charged, even if no byte comes back (`Trail.offered`)
        try:
            response = await self._client(backend).send_prepared(prepared)
        except HostedError as exc:
            exchange.upstream_error = exc.kind
            client_error = exc.kind == "status" and exc.status in _CLIENT_ERRORS
            if trail is not None and exc.kind in _NOT_SERVED:
                trail.offered = offered  # not sent, or an error status: not served
            if exc.kind == "untranslated":
                self._signals.untranslated(backend.id, exc.error_class, _now())
                raise untranslated(backend.id, exc) from exc
            if exc.kind == "too_large":  # as a private backend's: no failover, no breaker
                self._metrics.upstream_error(backend.id, "too_large")
                raise self._too_large() from exc
            if not client_error:  # the provider's failures, never a client's mistake
                self._metrics.upstream_error(backend.id, exc.kind)
            judge(attempt, exc)
            if client_error:
                # The request itself is at fault (LiteLLM would not send it, or the
                # provider refused it): the client's error, not another backend's job.
                raise GatewayError(
                    ErrorCode.upstream_bad_request,
                    sanitize_upstream_message(exc.public),  # names no provider
                    param=exc.param,
                ) from exc
            raise TryNext(f"{backend.id}: {exc.message}", last_error(exc)) from exc
        if not response.is_stream:
            attempt.succeeded()  # a whole answer: what the gateway does with it is its own
        try:
            await self._relay(exchange, attempt, response, send, ends_by)
        finally:
            if exchange.trail is not None:
                # For reconciling with the provider's usage export: it cannot countersign.
                # Read once relayed: a stream's first chunk may name no answer (Azure's).
                exchange.trail.upstream = UpstreamIds.of(*response.provider_ids)
            if exchange.answer is not None and not exchange.response_started:
                exchange.answer.release()  # nothing of it went out: not held for the client
            await response.aclose()

    async def _relay(
        self,
        exchange: Exchange,
        attempt: Attempt,
        response: HostedResponse,
        send: Send,
        ends_by: float | None,
    ) -> None:
        backend = attempt.backend
        if not response.is_stream:
            assert response.body is not None
            if len(response.body) > self._max_response_bytes:
                self._metrics.upstream_error(backend.id, "too_large")
                exchange.upstream_error = "too_large"
                raise self._too_large()
            if exchange.answer is not None:
                # Read whole by LiteLLM already; held by the gateway until its client has
                # taken it. Past the budget for whole answers: 429, no other backend tried.
                cover_answer(exchange.answer, len(response.body))
            exchange.status = 200
            exchange.response_started = True
            relayed(exchange, response.body, whole=True)
            attempt.leave()  # the provider is done: not in flight while its client reads
            await send_whole(send, exchange, 200, response.body, response.content_type)
            return
        await start_stream(send, exchange, 200, b"text/event-stream")
        first = True
        done = False  # the gateway's own `[DONE]` was handed to the client's connection
        try:
            async with asyncio.timeout_at(ends_by):
                async for data in response.chunks():
                    if first:
                        first = False
                        elapsed = first_chunk_seconds(exchange)
                        self._metrics.observe_ttft(exchange.endpoint, backend.id, elapsed)
                    await send_relayed(send, exchange, data)
                    if data == DONE and not client_left(exchange):
                        # The gateway's own `[DONE]` (openai_wire), the last event, went
                        # out: the client has the whole answer, and one that leaves now
                        # (the SDKs close here) is recorded with it, its usage included.
                        done = True
                        _taken(exchange)
                        if response.usage is not None and exchange.trail is not None:
                            exchange.trail.reported(response.usage)
            attempt.succeeded()  # judged by how the stream ended
        except (HostedError, TimeoutError) as exc:
            if done:
                _taken(exchange)  # (what the write buffer held may be out now)
            if client_left(exchange):
                raise asyncio.CancelledError from exc
            if done:  # after `[DONE]` (LiteLLM's close, the stream timeout): the
                # client reads the answer whole; it ends as its end would, never with an
                # error event after `[DONE]`
                attempt.succeeded()
                await end_stream(send, exchange)
                return
            kind = exc.kind if isinstance(exc, HostedError) else "timeout"
            if isinstance(exc, HostedError) and kind != "too_large":
                attempt.failed(f"stream broke off: {kind}")  # not the gateway's own limits
            self._metrics.upstream_error(backend.id, kind)
            message = (
                self._too_large().message
                if kind == "too_large"
                else "the provider's stream sent nothing in time (limits.read_timeout_s)"
                if isinstance(exc, HostedError) and kind == "timeout"
                else "the provider failed mid-stream"
                if isinstance(exc, HostedError)
                else "the provider's stream did not end in time (limits.stream_timeout_s)"
            )
            code = ErrorCode.upstream_timeout if kind == "timeout" else ErrorCode.upstream_error
            await break_stream(send, exchange, GatewayError(code, message))
        if done:
            _taken(exchange)  # (what the write buffer held may be out now)
        if response.usage is not None and exchange.trail is not None:
            exchange.trail.reported(response.usage)  # also when the client did not ask for it
        attempt.leave()  # the provider is done: not in flight while its client takes the end
        await end_stream(send, exchange)

    def _too_large(self) -> GatewayError:
        """The 502 for an answer past limits.max_response_bytes: read whole by LiteLLM, or
        cut as it was read (gateway/upstream/hosted_bound.py)."""
        return GatewayError(
            ErrorCode.upstream_error,
            "the provider's answer is larger than the gateway relays "
            f"({self._max_response_bytes} bytes, limits.max_response_bytes)",
        )

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()


def _now() -> float:
    return asyncio.get_running_loop().time()


def _taken(exchange: Exchange) -> None:
    """The gateway's `[DONE]` was handed to the client's connection: once the kernel took
    it (the connection's write buffer in this process holds none of it,
    `BodyWriter.unsent`, as for a private stream: gateway/api/stream_relay.py `_sent`),
    the client has the whole answer (`Exchange.read_whole`), and one that leaves now is
    recorded with it. One still in that buffer (a client that stopped reading, its
    socket buffers full) never left the gateway, and a reset drops it: a client that
    leaves then is 499. Asked again at the stream's end."""
    if exchange.read_whole or client_left(exchange):
        return
    writer = exchange.writer
    if writer is not None and writer.unsent:  # not the kernel's yet: maybe never sent
        return
    exchange.read_whole = True
