"""OpenTelemetry traces of proxied requests: the switch, read from the standard `OTEL_*`
variables, and the lazy start of the SDK.

Tracing is off unless the environment asks for it, and off costs nothing: this module
imports no OpenTelemetry package, and the request path tests one reference for None.
It is on when `OTEL_SDK_DISABLED` is not `true` and either `OTEL_TRACES_EXPORTER`
names an exporter (`otlp`, `console`, or both, comma-separated; `none` is off) or an
OTLP endpoint variable (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
`OTEL_EXPORTER_OTLP_ENDPOINT`) is set. `tracing_settings` decides that without
importing anything (the composition root calls it, so `owngate config validate` names
an unsupported exporter or protocol); `start_tracing` loads the SDK (gateway/tracing/
sdk.py) when the gateway starts. What a span holds: gateway/tracing/spans.py and
docs/observability.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.tracing.spans import RequestTracer

__all__ = ["EXPORTERS", "TracingSettings", "start_tracing", "tracing_settings"]

EXPORTERS = ("otlp", "console")
"""The span exporters owngate can run (`OTEL_TRACES_EXPORTER`): OTLP over HTTP/protobuf
(opentelemetry-exporter-otlp-proto-http) and the SDK's console exporter."""

_PROTOCOL = "http/protobuf"  # the one OTLP protocol whose exporter is installed
_DEFAULT_ENDPOINT = "http://localhost:4318"  # the OTLP/HTTP default (the OTel spec's)


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Tracing as the environment configures it (see the module docstring)."""

    exporters: tuple[str, ...]  # some of `EXPORTERS`
    endpoint: str  # where OTLP spans are sent (the full URL, ending in /v1/traces)


def tracing_settings(environ: Mapping[str, str]) -> TracingSettings | None:
    """The tracing `environ` asks for, or None when tracing is off.

    Raises ValueError naming the variable when it asks for what owngate cannot do (an
    exporter other than `EXPORTERS`, an OTLP protocol other than http/protobuf)."""

    def value(name: str) -> str:
        return environ.get(name, "").strip()

    if value("OTEL_SDK_DISABLED").lower() == "true":
        return None
    traces_endpoint, endpoint = (
        value("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        value("OTEL_EXPORTER_OTLP_ENDPOINT"),
    )
    named = value("OTEL_TRACES_EXPORTER").lower()
    if named:
        exporters = tuple(dict.fromkeys(n.strip() for n in named.split(",") if n.strip()))
        if exporters == ("none",):
            return None
        unknown = [n for n in exporters if n not in EXPORTERS]
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER: unsupported exporter {', '.join(unknown)} "
                f"(owngate exports spans with {', '.join(EXPORTERS)}, or none)"
            )
    elif traces_endpoint or endpoint:
        exporters = ("otlp",)
    else:
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = value(name)
        if "otlp" in exporters and protocol and protocol != _PROTOCOL:
            raise ValueError(f"{name}: owngate exports OTLP as {_PROTOCOL} only, not {protocol}")
        if protocol:
            break  # the traces-specific variable wins over the general one
    # The traces endpoint is used as given; the general one gets the signal's path.
    url = traces_endpoint or (endpoint or _DEFAULT_ENDPOINT).rstrip("/") + "/v1/traces"
    return TracingSettings(exporters, url)


def start_tracing(settings: TracingSettings) -> RequestTracer:
    """Load the SDK and start exporting (a background thread batches the spans)."""
    from gateway.tracing.sdk import start  # the SDK loads only when tracing is on

    return start(settings)
