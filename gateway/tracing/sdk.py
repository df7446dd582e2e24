"""Starting the OpenTelemetry SDK for owngate's spans (imported only when tracing is on).

One `TracerProvider`, owned by the gateway and never installed as the process's global
one, with a `BatchSpanProcessor` per exporter: ending a span only queues it (a bounded
queue that drops when full), and a background thread exports batches, so a slow or dead
collector never blocks the event loop or fails a request. The SDK reads the rest of the
standard variables itself from the process environment: `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` (the resource; `service.name` defaults to `owngate`),
`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*` (batching),
`OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `_CERTIFICATE`.
"""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from gateway import __version__
from gateway.tracing import TracingSettings
from gateway.tracing.spans import RequestTracer

__all__ = ["resource", "start"]


def start(settings: TracingSettings) -> RequestTracer:
    """A tracer exporting to `settings.exporters` through batch processors."""
    # The gateway flushes it at shutdown, bounded (GatewayApp._flush_traces); an atexit
    # flush of its own would be unbounded if that never ran.
    provider = TracerProvider(resource=resource(), shutdown_on_exit=False)
    for name in settings.exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, settings)))
    return RequestTracer(provider)


def resource() -> Resource:
    """The SDK's resource from the environment, with owngate's name and version where the
    environment names none."""
    detected = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: "owngate"}))
    return Resource({SERVICE_VERSION: __version__}).merge(detected)


def _exporter(name: str, settings: TracingSettings) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    return OTLPSpanExporter(endpoint=settings.endpoint)
