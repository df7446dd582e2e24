"""Pass-through to OpenAI-compatible private backends: bytes in, bytes out.

The body goes to the backend byte for byte (only `model` changes for an alias,
`cache_salt` is set to the tenant's for a backend with `isolate_prefix_cache`, and `user`,
`safety_identifier` and `prompt_cache_key` are the tenant's own, but to an attested
backend: gateway/upstream/tenant_ids.py); the
response comes back as the backend wrote it, and streams are relayed as each read
arrives, never re-encoded. A failure before the client saw a byte raises `TryNext`, so
the dispatcher can offer the request to the next eligible backend: a refused or broken
connection, a 5xx, no first byte within the attempt's first-byte budget (the
backend's `first_byte_timeout_s`, cut to what the request's failover deadline leaves),
or a 2xx answer of the other shape than the request asked for (`shape`: a whole answer
to a stream request, a stream to any other, a 204, 205 or 3xx, a body that is empty, not
a JSON object or one that does not parse, a content type other than JSON or an event
stream in UTF-8; the client would read none, nor the usage the record would state).
A stream's response headers are held back until its first chunk arrives, so a backend
that answers headers and then hangs, or ends the stream with no byte, can still be failed
over (stream_relay.py relays a stream). What happens is told to the routing `Attempt`
(gateway/routing/router.py, whose plan had its breakers admit it): its verdict (judged
by how the answer ended), its first byte (the end of its prefill), and each answer
(headers below 500, stream chunks), the health probes' evidence that the backend is
alive.

Every request asks for the answer in no content coding (`accept-encoding: identity`, sent
by the upstream client, which never forwards the client's own): an answer in another
coding fails the attempt (`encoding`, 502 if no other backend serves; the bytes are never
decompressed), since the client would get it undecodable and the record no usage.
What a backend sends back is bounded: a whole answer by `limits.max_response_bytes`
(502, and the connection dropped as soon as it is passed) and `limits.response_timeout_s`
(504), an error body by 64 KiB, a stream by `limits.stream_timeout_s` if set; whole
answers and error bodies of all requests together by `limits.max_held_answer_bytes`
(gateway/api/answer_reads.py: 429, the connection dropped). A stream
the gateway needs the usage of (a token budget, the provenance log) asks the backend for
its usage chunk when the client did not, and keeps that chunk from the client.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any, Final

from gateway.api.answer_reads import (
    Unscanned,
    check_readable,
    check_status,
    ended_by_close,
    is_sse,
    read_error_body,
    read_held,
    relayed_type,
)
from gateway.api.attested import Attester, SseTail
from gateway.api.body_rewrites import ask_for_usage, model_pattern, rewrite_model
from gateway.api.exchange import Exchange, TryNext, relayed, send_whole
from gateway.api.metrics import GatewayMetrics
from gateway.api.private_failures import NO_ROOM, NOT_SENT, REFUSALS, RETRYABLE, last_error
from gateway.api.private_reports import PrivateReports
from gateway.api.sse import StreamWatch
from gateway.api.stream_relay import StreamRelay
from gateway.api.stream_writes import end_stream
from gateway.asgi import Send
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.formats.attestation import ATTEST_HEADER, SALTS_HEADER, salts_value
from gateway.routing.registry import BackendState, Route
from gateway.routing.router import Attempt
from gateway.sse_comments import without_comments_in_turns
from gateway.upstream.errors import translate_upstream_error
from gateway.upstream.http import Connection, UpstreamError, UpstreamResponse
from gateway.upstream.openai_wire import include_usage
from gateway.upstream.tenant_ids import salted_body, scoped_body

__all__ = ["PrivateRelay"]

# What a 2xx answer of the wrong shape was (by whether it is SSE): the gateway's own
# words, never the backend's content type.
_SHAPES: Final = {
    False: "a whole answer (not text/event-stream) to a stream request",
    True: "an event stream (text/event-stream) to a request that is not a stream",
}
# The endpoints whose prompts a server's prefix cache holds (`isolate_prefix_cache`):
# embeddings too (vLLM's pooling requests read `cache_salt`, and a causal embedding
# model's prompts share the prefix cache).
_SALTED: Final = frozenset({"chat", "completions", "embeddings"})


class PrivateRelay:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._rewrites: dict[tuple[str, str], re.Pattern[bytes]] = {}
        self._attesters: dict[tuple[str, str], Attester] = {}
        self._reports = PrivateReports(metrics)
        self._streams = StreamRelay(metrics, self._reports.stripped)

    async def connect(self, exchange: Exchange, attempt: Attempt) -> Connection:
        """The connection `attempt` (its breakers admitted it: the plan does that, before
        the dispatch record) will send on, its TLS peer authenticated (the dispatch record
        names it), or `TryNext` with nothing sent: the backend cannot be reached, or its
        certificate is refused."""
        backend = attempt.backend
        assert backend.pool is not None
        exchange.backend = backend.id
        try:
            return await backend.pool.connect(exchange.tenant)
        except UpstreamError as exc:
            self._reports.failed(exchange, backend, exc)
            attempt.upstream_failed(exc.kind, exc.detail)
            raise TryNext(
                f"{backend.id}: {exc.kind}",
                last_error(exc),
                busy=exc.kind in NO_ROOM,
                retired=exc.kind == "retired",
            ) from exc

    async def attempt(
        self,
        exchange: Exchange,
        attempt: Attempt,
        model: str,
        doc: dict[str, Any],
        body: bytes,
        upstream_path: bytes,
        send: Send,
        connection: Connection | None,
        *,
        moved: Callable[[], str | None] = lambda: None,
    ) -> None:
        """Serve the request from `attempt`'s backend on `connection` (from `connect`), or
        raise `TryNext` before any byte; none once `moved` says why (`Registry.moved`),
        also on the fresh connection a stale one makes the pool retry on.

        The attempt's failover deadline bounds the wait for the first byte; what happens
        is told to the attempt (breaker verdict, prefill, answers)."""
        route = attempt.route
        backend = route.backend
        assert backend.pool is not None
        out = body if route.upstream_model == model else self._rename(doc, body, model, route)
        if backend.config.isolate_prefix_cache and exchange.endpoint in _SALTED:
            out = salted_body(out, doc, exchange.tenant)  # its prefix cache: the tenant's own
        attester = self._attester(backend)
        if attester is None:  # an attested backend countersigns the client's own bytes
            out = scoped_body(out, doc, exchange.tenant)  # its identifiers: the tenant's own
        # The gateway counts a stream's tokens (budget, provenance record): ask for them;
        # not of an attested backend, whose countersigned body must be the client's.
        strip_usage = (
            attester is None and exchange.trail is not None and _streams_text(exchange, doc)
        )
        if strip_usage:
            out = ask_for_usage(out, doc)
        headers = [(b"content-type", b"application/json"), (b"x-request-id", exchange.request_id)]
        if attester is not None and exchange.trail is not None:
            headers.append((SALTS_HEADER, salts_value(exchange.trail.salts)))
        if backend.auth_header is not None:
            headers.append((b"authorization", backend.auth_header))
        if exchange.traceparent is not None:  # tracing on: private backends join the trace
            headers.append((b"traceparent", exchange.traceparent))
        attempt.sending(len(out))
        trail = exchange.trail
        offered = trail is not None and trail.offered
        if trail is not None:
            trail.offered = True  # charged, even if no byte comes back (`Trail.offered`)
        # A timeout the request's own failover deadline cut short says nothing about the
        # backend: the attempt does not charge it to the breaker.
        wait = attempt.first_byte_wait(backend.pool.first_byte_timeout)
        try:
            if wait <= 0:
                raise UpstreamError("timeout", "the request's failover deadline passed")
            first_byte_by = asyncio.get_running_loop().time() + wait
            response = await backend.pool.request(
                b"POST",
                backend.base_path + upstream_path,
                headers,
                out,
                wait,
                connection=connection,
                withdrawn=moved,
                tenant=exchange.tenant,
            )
        except UpstreamError as exc:
            if trail is not None and (exc.kind in NOT_SENT or exc.sent_nothing):
                trail.offered = offered  # the backend never had the prompt
            self._reports.failed(exchange, backend, exc)
            attempt.upstream_failed(exc.kind, exc.detail)
            # Nothing sent (a reconnect refused, say) after a reload withdrew the attempt:
            # that is what it came to; the completion says why when the reload stopped it.
            sent = exc.kind not in NOT_SENT and not exc.sent_nothing
            gone = None if sent else moved()
            raise TryNext(
                (gone if exc.kind == "retired" else None) or f"{backend.id}: {exc.kind}",
                last_error(exc),
                busy=exc.kind in NO_ROOM,
                retired=exc.kind == "retired",
                withdrawn=gone,
                cut_short=attempt.cut_short(exc.kind),
            ) from exc
        if response.status >= 400 and trail is not None:
            trail.offered = offered  # an error status: the backend did not serve it
        if response.status >= 500 and response.status not in REFUSALS:
            attempt.failed(f"HTTP {response.status}")
        else:
            attempt.answered()
        try:
            broke = await self._relay(
                exchange, attempt, response, send, first_byte_by, strip_usage, attester
            )
        except UpstreamError as exc:
            attempt.upstream_failed(exc.kind, exc.detail)
            if exchange.response_started:
                raise
            # Broke off before the client saw a byte: another backend may serve it.
            self._reports.failed(exchange, backend, exc)
            raise TryNext(
                f"{backend.id}: {exc.kind}",
                last_error(exc),
                busy=exc.kind in NO_ROOM,
                cut_short=attempt.cut_short(exc.kind),
            ) from exc
        except GatewayError:
            attempt.succeeded()  # a 4xx, translated for the client: the backend is answering
            raise
        # Judged by how the answer ended, not by its headers: a backend that sends headers
        # and then hangs or breaks off must still open its breaker.
        if broke is None:
            attempt.succeeded()
        else:
            attempt.failed(broke)

    async def _without_comments(self, backend: str, data: bytes) -> bytes:
        """A whole answer to a stream request, less its `owngate-` comment lines."""
        data, lines = await without_comments_in_turns(data)
        self._reports.stripped(backend, lines)
        return data

    async def _relay(
        self,
        exchange: Exchange,
        attempt: Attempt,
        response: UpstreamResponse,
        send: Send,
        first_byte_by: float,
        strip_usage: bool,
        attester: Attester | None,
    ) -> str | None:
        """Relay the answer; returns why a stream failed after its first byte, if it did:
        it broke off, or the backend's own error event reached the client (a failure its
        client's input may cause, as a 5xx: charged to the tenant's breaker first)."""
        try:
            return await self._relay_body(
                exchange, attempt, response, send, first_byte_by, strip_usage, attester
            )
        finally:
            response.abort()  # no-op once the exchange completed and the connection is pooled
            if exchange.answer is not None and not exchange.response_started:
                exchange.answer.release()  # nothing of it went out: not held for the client

    async def _relay_body(
        self,
        exchange: Exchange,
        attempt: Attempt,
        response: UpstreamResponse,
        send: Send,
        first_byte_by: float,
        strip_usage: bool,
        attester: Attester | None,
    ) -> str | None:
        backend = attempt.backend
        status = response.status
        content_type = response.header(b"content-type") or b"application/json"
        sse = is_sse(content_type)
        if not sse or status >= 400:
            attempt.first_byte()  # a whole answer: its prefill is done
        if status >= 400:
            data = await read_error_body(response, first_byte_by, exchange.answer)
            self._metrics.upstream_error(backend.id, "status")
            exchange.upstream_error = f"status {status}"
            pool = backend.pool
            hosts = (pool.host,) if pool else ()
            # Raised as made, never bound to a local first: the error's traceback holds
            # this frame, whose locals would hold the error, a reference cycle keeping the
            # frames up to the request's (its body among their locals) past the body
            # budget's release, until the collector finds it.
            if status in RETRYABLE or status in REFUSALS:
                # nothing reached the client: another backend may serve
                raise TryNext(
                    f"{backend.id}: HTTP {status}",
                    translate_upstream_error(status, data, hosts),
                    busy=status == 429,
                )
            raise translate_upstream_error(status, data, hosts)
        relayed_type(content_type)  # only one its clients read as the gateway did (`shape`)
        check_status(status)  # a 204, 205 or 3xx is no answer, stream or whole
        if sse != _wants_stream(exchange):
            # The client would read it in the other shape (an SDK parses a stream request's
            # answer as SSE, and JSON out of any other), and see none of the usage the
            # record would state: a broken answer, refused before the client saw a byte.
            raise UpstreamError("shape", _SHAPES[sse])
        if not sse:
            data = await self._read_whole(exchange, backend, response)
            if exchange.stream:  # stream: true on embeddings: no SSE client's answer either
                data = await self._without_comments(backend.id, data)
            # no client reads an empty or non-JSON "success", nor a cut one
            closed = ended_by_close(response)
            counted = exchange.trail is not None
            try:
                usage = check_readable(data, counted=counted, closed=closed, aside=True)
            except Unscanned as past:  # past the read bounds: scanned beside the loop
                await past.scanned()
                usage = None  # relayed with its usage unknown
            exchange.status = status
            exchange.response_started = True
            relayed(exchange, data, whole=True)
            if exchange.trail is not None:
                exchange.trail.read_as(usage)
            if attester is not None and exchange.trail is not None:
                countersignature = response.header(ATTEST_HEADER)
                attester.judge(exchange.trail, exchange.request_id.decode(), countersignature)
            attempt.leave()  # the backend is done: not in flight while its client reads
            await send_whole(send, exchange, status, data, content_type)
            return None
        # `[DONE]` tells a complete stream from a cut one (stream_relay.py, sse.py)
        watch = StreamWatch(strip_usage=strip_usage)
        tail = SseTail() if attester is not None else None
        broke, line_open = await self._streams.relay(
            exchange, attempt, response, send, first_byte_by, watch, tail
        )
        if attester is not None and tail is not None and exchange.trail is not None:
            # A stream that broke off ends with the gateway's error event, after the bytes
            # a comment the reads brought before the break countersigned: the client did
            # not get the answer it covers, so it is not taken (`missing`).
            signed = tail.countersignature if broke is None else None
            attester.judge(exchange.trail, exchange.request_id.decode(), signed)
            # Whole once `[DONE]` went out and the countersignature that follows it was
            # accepted: a client that leaves now got the answer the statement covers.
            exchange.read_whole = watch.sent_done and exchange.trail.countersignature is not None
        if broke is None and watch.error_event:
            self._metrics.upstream_error(backend.id, "error_event")
        attempt.leave()  # the backend is done: not in flight while its client takes the end
        await end_stream(send, exchange, line_open=line_open)
        if broke is not None:
            return f"stream broke off: {broke}"
        return "stream carried an error event" if watch.error_event else None

    async def _read_whole(
        self, exchange: Exchange, backend: BackendState, response: UpstreamResponse
    ) -> bytes:
        """A whole answer, within `limits.max_response_bytes` and `response_timeout_s`
        (one the close ended is told whole by its parse: `check_readable`)."""
        limit = backend.pool.max_body if backend.pool else 0
        try:
            # Past the budget for whole answers: `GatewayError` 429, no failover, the
            # backend's breaker not charged (the caller counts it a success).
            data = await read_held(response, exchange.answer, limit)
        except UpstreamError as exc:
            if exc.kind != "too_large":
                raise  # timed out or broke off: the caller may try another backend
            # Not the backend's failure (a client can ask for a huge answer), nor one that
            # another backend would answer differently: no failover, no breaker.
            self._reports.failed(exchange, backend, exc)
            raise GatewayError(
                ErrorCode.upstream_error,
                f"the backend's answer is larger than the gateway relays ({limit} bytes, "
                "limits.max_response_bytes)",
            ) from exc
        return data

    def _attester(self, backend: BackendState) -> Attester | None:
        """The attester of a backend marked `attest` (one per backend id and key, so the
        counters it saw survive a reload that keeps them)."""
        attest = backend.config.attest
        if attest is None:
            return None
        key = (backend.id, attest.key)
        found = self._attesters.get(key)
        if found is None:
            found = self._attesters[key] = Attester(backend.id, attest.key, self._metrics)
        return found

    def _rename(self, doc: dict[str, Any], body: bytes, model: str, route: Route) -> bytes:
        key = (model, route.upstream_model)
        pattern = self._rewrites.get(key)
        if pattern is None:
            pattern = self._rewrites[key] = model_pattern(model)
        return rewrite_model(body, doc, pattern, route.upstream_model)


def _wants_stream(exchange: Exchange) -> bool:
    """Whether the request asks for a stream: `stream: true` on a chat or text completion
    (embeddings have no streams: their answer is whole whatever the flag says)."""
    return exchange.stream and exchange.endpoint != "embeddings"


def _streams_text(exchange: Exchange, doc: dict[str, Any]) -> bool:
    """A chat or text completion stream whose client did not ask for usage."""
    return _wants_stream(exchange) and not include_usage(doc)
