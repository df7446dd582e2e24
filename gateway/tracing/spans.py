"""The spans of one proxied request, in the OpenTelemetry GenAI semantic conventions.

One SERVER span per request (`chat`, `text_completion` or `embeddings`, then
`{gen_ai.operation.name} {gen_ai.request.model}` once the model is known), and under it
one CLIENT span per routing attempt (`{gen_ai.operation.name} {upstream model}`), each
with the backend's `server.address`/`server.port`, `gen_ai.provider.name`, the
attempt's outcome and the index of its dispatch record in the provenance log.

What a span may hold is decided here, from values the gateway itself produced or the
configuration declares: configured model, backend, tenant, policy and rule names, a
declared data class, numbers, and closed sets of codes. Never the prompt, the answer, an
API key, a header's text or any other string the client sent (a model name the config
does not know is left out). A failed hosted attempt's reason is its failure kind, never
the provider's message (which may quote the request back).

An incoming W3C `traceparent` is client input: parsed by the SDK's strict propagator
(one header, at most `_MAX_TRACEPARENT` bytes, `tracestate` ignored) and, if valid,
attached as a span *link*, never as the parent, so a client can neither place the
gateway's spans in its trace nor decide whether they are sampled. Toward private
backends (the organisation's own servers) the attempt's context goes out as
`traceparent`, so their own traces (vLLM's `--otlp-traces-endpoint`) join the
gateway's; hosted providers never get one.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, StatusCode, get_current_span
from opentelemetry.trace import set_span_in_context as _in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway import __version__
from gateway.api.labels import UNKNOWN
from gateway.asgi import Scope, header_values
from gateway.routing.router import Outcome

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.api.exchange import Exchange
    from gateway.api.refusal import Refused
    from gateway.config.schema import BackendSettings
    from gateway.policy import Decision
    from gateway.provenance import LogEntry
    from gateway.routing.router import Attempt

__all__ = ["AttemptSpan", "RequestSpan", "RequestTracer"]

OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
"""`gen_ai.operation.name` of each proxied endpoint (gateway/api/openai.py `PROXIED`)."""

_MAX_TRACEPARENT = 256  # bytes: version 00 is 55; later versions may append fields
_PROPAGATOR = TraceContextTextMapPropagator()
_MAX_CACHED = 4096  # backend configs whose attributes are kept
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
# LiteLLM's provider names whose `gen_ai.provider.name` the GenAI semantic conventions
# spell otherwise (their well-known values); any other name (openai, anthropic, cohere,
# groq, deepseek, perplexity, a private backend's kind) is the same in both.
_SEMCONV_PROVIDERS: Final = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}


class RequestTracer:
    """Starts the spans of proxied requests on `provider` (the gateway's own, never the
    process-global one)."""

    __slots__ = ("_backends", "_provider", "tracer")

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.tracer = provider.get_tracer("owngate", __version__)
        # Per backend config: its attributes, built once (configs are immutable).
        self._backends: dict[int, tuple[BackendSettings, dict[str, AttributeValue]]] = {}

    def request(self, scope: Scope, endpoint: str, request_id: bytes) -> RequestSpan:
        """The span of one request to a proxied path (`endpoint`: its name in `PROXIED`)."""
        operation, method = OPERATIONS[endpoint], scope["method"]
        span = self.tracer.start_span(
            operation,
            context=Context(),  # a root: a client's traceparent is only a link
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": operation,
                "http.request.method": method if method in _METHODS else "_OTHER",
                "http.route": scope["path"],  # one of the three proxied paths, matched exactly
                "owngate.request_id": request_id.decode(),
            },
            links=_client_link(scope),
        )
        return RequestSpan(self, span, operation)

    def backend(self, settings: BackendSettings) -> dict[str, AttributeValue]:
        """The attributes naming a backend (declared in gateway.yaml)."""
        found = self._backends.get(id(settings))
        if found is not None and found[0] is settings:
            return found[1]
        provider = settings.provider or settings.kind
        provider = _SEMCONV_PROVIDERS.get(provider, provider)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,  # the name before semantic conventions 1.37
            "owngate.backend.id": settings.id,
            "owngate.backend.tier": "private" if settings.is_private else "hosted",
            "owngate.backend.kind": settings.kind,
            "owngate.backend.region": settings.region,
        }
        if settings.base_url is not None:  # a hosted one without it: the provider's default
            url = urlsplit(settings.base_url)
            if url.hostname:
                attributes["server.address"] = url.hostname
                attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        if len(self._backends) >= _MAX_CACHED:
            self._backends.clear()
        self._backends[id(settings)] = (settings, attributes)
        return attributes

    async def shutdown(self, timeout_s: float) -> bool:
        """Export what is queued and stop, within `timeout_s` (a collector that does not
        answer is given up on); returns whether everything was flushed in time."""
        worker = threading.Thread(
            target=self._provider.shutdown, name="owngate-trace-flush", daemon=True
        )
        worker.start()
        await asyncio.to_thread(worker.join, timeout_s)
        return not worker.is_alive()


class RequestSpan:
    """The span of one proxied request; `end` it once, when the answer is over."""

    __slots__ = ("_context", "_operation", "_refused", "_served", "_span", "_tracer")

    def __init__(self, tracer: RequestTracer, span: Span, operation: str) -> None:
        self._tracer = tracer
        self._span = span
        self._operation = operation
        self._context: Context | None = None  # the attempts' parent, made at the first
        self._served: Attempt | None = None
        self._refused: Refused | None = None

    def requested(self, doc: Mapping[str, Any]) -> None:
        """The request parameters worth a span attribute (numbers only)."""
        attributes: dict[str, AttributeValue] = {}
        max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
        if type(max_tokens) is int and 0 <= max_tokens < 2**53:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        for field in ("temperature", "top_p"):
            value = doc.get(field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue  # JSON's true is an int to Python: not a number here
            if math.isfinite(value):
                attributes[f"gen_ai.request.{field}"] = float(value)
        if attributes:
            self._span.set_attributes(attributes)

    def attempt(self, attempt: Attempt, exchange: Exchange, fallback: str | None) -> AttemptSpan:
        """The span of one routing attempt (`fallback`: why a hosted backend is tried).
        A private attempt's context goes to its backend as `traceparent`."""
        if self._context is None:
            self._context = _in_context(self._span, Context())
        model = attempt.route.upstream_model
        attributes = {
            **self._tracer.backend(attempt.backend.config),
            "gen_ai.operation.name": self._operation,
            "gen_ai.request.model": model,
        }
        if fallback is not None:
            attributes["owngate.fallback"] = fallback
        span = self._tracer.tracer.start_span(
            f"{self._operation} {model}",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        exchange.traceparent = _traceparent(span) if attempt.private else None
        trail = exchange.trail
        return AttemptSpan(self, span, attempt, None if trail is None else trail.dispatch)

    def refused(self, refused: Refused) -> None:
        """The policy refused the request (nothing was dispatched)."""
        self._refused = refused

    def end(self, exchange: Exchange) -> None:
        """The answer is over: what came of the request, then the span ends."""
        span, attributes = self._span, _outcome(exchange)
        model = exchange.model
        if model not in ("-", UNKNOWN):  # a configured name: the client's text otherwise
            attributes["gen_ai.request.model"] = model
            span.update_name(f"{self._operation} {model}")
        served = self._served
        if served is not None:
            backend = self._tracer.backend(served.backend.config)
            attributes["gen_ai.response.model"] = served.route.upstream_model
            attributes["gen_ai.provider.name"] = backend["gen_ai.provider.name"]
            attributes["owngate.backend.id"] = backend["owngate.backend.id"]
        refused = self._refused
        decision = exchange.decision if refused is None else refused.decision
        if decision is not None:
            _policy(attributes, decision, exchange, refused)
        trail = exchange.trail
        if trail is not None:
            usage = trail.usage()
            if usage is not None:
                attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
                attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
            record = trail.dispatch or trail.refusal
            if record is not None:
                attributes["owngate.provenance.index"] = record.index
        span.set_attributes(attributes)
        if exchange.status >= 500 or exchange.status == 0:
            span.set_status(StatusCode.ERROR)  # a server span: a 4xx is the client's error
        span.end()


class AttemptSpan:
    """The span of one routing attempt; `end` it once, when the plan hears its outcome."""

    __slots__ = ("_attempt", "_before", "_request", "_span")

    def __init__(
        self, request: RequestSpan, span: Span, attempt: Attempt, before: LogEntry | None
    ) -> None:
        self._request = request
        self._span = span
        self._attempt = attempt
        self._before = before  # the request's dispatch record before this attempt

    def end(self, outcome: Outcome, reason: str, exchange: Exchange) -> None:
        span, attempt = self._span, self._attempt
        attributes: dict[str, AttributeValue] = {"owngate.attempt.outcome": outcome.value}
        if outcome is Outcome.served:
            self._request._served = attempt
            if exchange.status:
                attributes["http.response.status_code"] = exchange.status
        elif outcome is Outcome.failed:
            # A private attempt's reason is the gateway's own ("<backend>: <kind>"); a
            # hosted one's may quote the provider, so only its failure kind is kept.
            why = reason.partition(": ")[2] if attempt.private else exchange.upstream_error
            attributes["owngate.attempt.reason"] = why or "failed"
            attributes["error.type"] = exchange.upstream_error or why or "_OTHER"
            span.set_status(StatusCode.ERROR)
        elif exchange.upstream_error is not None:
            attributes["error.type"] = exchange.upstream_error
        trail = exchange.trail
        dispatch = None if trail is None else trail.dispatch
        if dispatch is not None and dispatch is not self._before:
            attributes["owngate.provenance.index"] = dispatch.index
        span.set_attributes(attributes)
        span.end()
        exchange.traceparent = None


def _outcome(exchange: Exchange) -> dict[str, AttributeValue]:
    """The request's result: status, error code, stream, tenant, fallback."""
    attributes: dict[str, AttributeValue] = {"owngate.stream": exchange.stream}
    status = exchange.status
    if status:
        attributes["http.response.status_code"] = status
    if status >= 400 or status == 0:
        attributes["error.type"] = exchange.error_code or str(status or "_OTHER")
    if exchange.tenant != "-":
        attributes["owngate.tenant"] = exchange.tenant  # a configured tenant id
    if exchange.fallback is not None:
        attributes["owngate.fallback"] = exchange.fallback
    return attributes


def _policy(
    attributes: dict[str, AttributeValue],
    decision: Decision,
    exchange: Exchange,
    refused: Refused | None,
) -> None:
    """The decision: policy, rule, fallback mode, and the data class if declared."""
    attributes["owngate.policy.id"] = decision.policy_id
    attributes["owngate.policy.version"] = decision.policy_version
    attributes["owngate.policy.digest"] = decision.policy_digest
    attributes["owngate.policy.fallback"] = decision.fallback
    if refused is not None:
        attributes["owngate.policy.rule"] = refused.rule
    elif exchange.fallback is not None:
        attributes["owngate.policy.rule"] = decision.fallback_rule
    data_class = exchange.data_class  # set only once the label proved a declared class
    if data_class is not None and data_class != UNKNOWN:
        attributes["owngate.data_class"] = data_class
        attributes["owngate.data_class.defaulted"] = exchange.data_class_defaulted


def _client_link(scope: Scope) -> Sequence[Link] | None:
    """The client's trace context as a link, if it sent exactly one valid `traceparent`."""
    values = header_values(scope, b"traceparent")
    if len(values) != 1 or len(values[0]) > _MAX_TRACEPARENT:
        return None
    try:
        text = values[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    context = get_current_span(_PROPAGATOR.extract({"traceparent": text})).get_span_context()
    return [Link(context)] if context.is_valid else None


def _traceparent(span: Span) -> bytes:
    """The W3C `traceparent` of `span` (version 00)."""
    context = span.get_span_context()
    return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)
