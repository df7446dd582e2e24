"""The tracing switch (`OTEL_*` variables) and the client's `traceparent`, in this process.

Spans of real requests: tests/integration/test_tracing.py (in process, over sockets) and
tests/integration/test_tracing_otlp.py (a real `owngate serve` exporting over OTLP).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.exchange import Exchange
from gateway.config.backends import BackendSettings
from gateway.tracing import TracingSettings, tracing_settings
from gateway.tracing.spans import RequestTracer
from gateway.validation import validate
from tests.helpers.gateways import backend, gateway_config

ENDPOINT = "http://collector.internal:4318"
OTLP = TracingSettings(("otlp",), f"{ENDPOINT}/v1/traces")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "gw"}, None),  # naming the service switches nothing on
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, OTLP),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT + "/"}, OTLP),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"},
            TracingSettings(("otlp",), "http://c:4318/custom"),  # used as given
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp"},
            TracingSettings(("otlp",), "http://localhost:4318/v1/traces"),
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console"},
            TracingSettings(("console",), "http://localhost:4318/v1/traces"),
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp, console,otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT},
            TracingSettings(("otlp", "console"), f"{ENDPOINT}/v1/traces"),
        ),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, None),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, OTLP),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
            },
            OTLP,
        ),
        (  # the traces-specific protocol wins over the general one
            {
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
            },
            OTLP,
        ),
        (  # only the console exporter: the OTLP protocol does not matter
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            TracingSettings(("console",), "http://localhost:4318/v1/traces"),
        ),
    ],
)
def test_the_switch(environ: dict[str, str], expected: TracingSettings | None) -> None:
    assert tracing_settings(environ) == expected


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_what_owngate_cannot_export_is_refused_by_name(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        tracing_settings(environ)
    # `owngate config validate` (and `serve`, through the same assembly) names it
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "g")])
    problems = validate(config, environ=environ, config_dir=Path.cwd())
    assert [p for p in problems if named in p], problems


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _request_span(*headers: tuple[bytes, bytes]) -> ReadableSpan:
    """The request span of a request with `headers`: a root, whatever the client sent."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": list(headers),
    }
    RequestTracer(provider).request(scope, "chat", b"req_1").end(Exchange(b"req_1", 0.0, "chat"))
    (span,) = spans.get_finished_spans()
    assert span.parent is None
    assert f"{span.context.trace_id:032x}" != TRACE_ID
    return span


def _linked(span: ReadableSpan) -> list[str]:
    return [f"{link.context.trace_id:032x}" for link in span.links]


def test_a_valid_traceparent_is_a_link_never_the_parent() -> None:
    assert _linked(_request_span((b"traceparent", PARENT.encode()))) == [TRACE_ID]


def test_the_client_s_tracestate_is_dropped() -> None:
    span = _request_span((b"traceparent", PARENT.encode()), (b"tracestate", b"vendor=secret-text"))
    (link,) = span.links
    assert not link.context.trace_state
    assert "secret-text" not in span.to_json()


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"traceparent", b"garbage")],
        [(b"traceparent", f"00-{'0' * 32}-00f067aa0ba902b7-01".encode())],  # invalid id
        [(b"traceparent", f"00-{TRACE_ID}-{'0' * 16}-01".encode())],
        [(b"traceparent", f"ff-{TRACE_ID}-00f067aa0ba902b7-01".encode())],  # version ff
        [(b"traceparent", PARENT.upper().encode())],  # hex must be lower case
        [(b"traceparent", PARENT.encode()), (b"traceparent", PARENT.encode())],  # two
        [(b"traceparent", (PARENT + "-" + "a" * 300).encode())],  # over the bound
        [(b"traceparent", PARENT.encode()[:-2] + b"\xff\xfe")],  # not ASCII
    ],
)
def test_an_invalid_traceparent_is_ignored(headers: list[tuple[bytes, bytes]]) -> None:
    assert _linked(_request_span(*headers)) == []


@pytest.mark.parametrize(
    ("provider", "route", "name"),
    [
        ("bedrock", "bedrock/anthropic.claude-3", "aws.bedrock"),
        ("mistral", "mistral/mistral-small", "mistral_ai"),
        ("xai", "xai/grok-2", "x_ai"),
        ("openai", "openai/gpt-4o", "openai"),
    ],
)
def test_a_hosted_providers_name_is_the_semantic_conventions_well_known_value(
    provider: str, route: str, name: str
) -> None:
    """`gen_ai.provider.name` is one of the GenAI conventions' well-known values where
    LiteLLM names the provider otherwise (`bedrock` is `aws.bedrock`, ...)."""
    settings = BackendSettings.model_validate(
        {
            "id": "hosted",
            "kind": "hosted",
            "provider": provider,
            "api_key_env": "HOSTED_KEY",
            "models": [{"name": "m", "provider_model": route}],
            "region": "eu",
            "owner": "provider",
            "retention": {"days": 30},
        }
    )
    attributes = RequestTracer(TracerProvider()).backend(settings)
    assert attributes["gen_ai.provider.name"] == name
