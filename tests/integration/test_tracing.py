"""OpenTelemetry spans of proxied requests: their shape and attributes, in this process.

A gateway on a real socket (in a thread) in front of simulators: a private backend `gpu`
serving `g`; for `m`, a private backend `dead` (nothing listens) and a hosted fallback.
Its tracer exports to the SDK's `InMemorySpanExporter` through a `SimpleSpanProcessor`
(each span as it ends). The request span ends after the answer is sent, so the tests wait
for it. The end-to-end OTLP path (a real `owngate serve`): test_tracing_otlp.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.provenance import write_signing_key
from gateway.tracing.spans import RequestTracer
from tests.helpers.gateways import EU_ZERO, TENANT_KEY, Gateway, Sim, backend, hosted_backend
from tests.helpers.net import free_port
from tests.helpers.waiting import until

MARKER = "otel-marker-5b1e9c"  # in prompts, labels and keys: never in a span
TRACED_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: traced, version: "7"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted}]
  data_classes:
    internal: {description: Internal data.}
"""


@dataclasses.dataclass
class Traced:
    gateway: Gateway
    private: Sim
    hosted: Sim
    dead_port: int
    spans: InMemorySpanExporter

    def post(self, model: str, *, headers: dict[str, str] | None = None, **body: Any) -> Any:
        doc = {"model": model, "messages": [{"role": "user", "content": MARKER}], **body}
        return httpx.post(
            f"{self.gateway.url}/v1/chat/completions",
            json=doc,
            headers={**self.gateway.headers, **(headers or {})},
            timeout=30,
        )

    def trace(self, count: int) -> tuple[ReadableSpan, list[ReadableSpan]]:
        """The request span and its attempt spans (in order), once `count` spans ended."""
        until(
            lambda: len(self.spans.get_finished_spans()) >= count,
            f"{count} finished spans",
            detail=lambda: [s.name for s in self.spans.get_finished_spans()],
        )
        spans = self.spans.get_finished_spans()
        assert len(spans) == count
        (request,) = [s for s in spans if s.kind is SpanKind.SERVER]
        attempts = sorted((s for s in spans if s is not request), key=lambda s: s.start_time or 0)
        assert request.parent is None
        for attempt in attempts:
            assert attempt.kind is SpanKind.CLIENT
            assert attempt.parent is not None
            assert attempt.parent.span_id == request.context.span_id
            assert attempt.context.trace_id == request.context.trace_id
        exported = b"".join(s.to_json().encode() for s in spans)
        assert MARKER.encode() not in exported
        assert TENANT_KEY.encode() not in exported
        return request, attempts


@pytest.fixture
def traced(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> Traced:
    private = start_sim("vllm", models=("g",), zero_latency=True)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "traced.yaml").write_text(TRACED_POLICY)
    write_signing_key(tmp_path / "log.key", "otel.test/log")
    dead_port = free_port()
    gateway = start_gateway(
        [
            backend("gpu", private.url, "g", **EU_ZERO),
            # Not probed (kind openai): a request for `m` tries it, fails, falls back.
            backend("dead", f"http://127.0.0.1:{dead_port}", "m", kind="openai", **EU_ZERO),
            hosted_backend("hosted", f"{hosted.url}/v1", "m"),
        ],
        environ={"HOSTED_KEY": f"sk-{MARKER}"},
        policy={"paths": [str(tmp_path / "policies")]},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": "otel.test/log",
            "signing_key_file": str(tmp_path / "log.key"),
        },
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    gateway.app.tracer = RequestTracer(provider)
    return Traced(gateway, private, hosted, dead_port, spans)


def test_a_served_request_is_a_server_span_over_one_client_span(traced: Traced) -> None:
    answer = traced.post("g", max_tokens=5, temperature=0.5, headers={"x-data-class": "internal"})
    assert answer.status_code == 200, answer.text
    request, (attempt,) = traced.trace(2)
    usage = answer.json()["usage"]
    assert request.attributes is not None and attempt.attributes is not None
    digest = request.attributes["owngate.policy.digest"]
    assert str(digest).startswith("sha256:")
    assert request.name == "chat g"
    assert request.status.status_code is StatusCode.UNSET
    assert request.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "g",
        "gen_ai.response.model": "g",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.max_tokens": 5,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "owngate.request_id": answer.headers["x-request-id"],
        "owngate.tenant": "acme",
        "owngate.stream": False,
        "owngate.backend.id": "gpu",
        "owngate.policy.id": "traced",
        "owngate.policy.version": "7",
        "owngate.policy.digest": digest,
        "owngate.policy.fallback": "when_private_unavailable",
        "owngate.data_class": "internal",
        "owngate.data_class.defaulted": False,
        "owngate.provenance.index": 0,  # the dispatch record: the log's first entry
    }
    port = httpx.URL(traced.private.url).port
    assert attempt.name == "chat g"
    assert attempt.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "g",
        "gen_ai.provider.name": "vllm",
        "gen_ai.system": "vllm",
        "server.address": "127.0.0.1",
        "server.port": port,
        "owngate.backend.id": "gpu",
        "owngate.backend.tier": "private",
        "owngate.backend.kind": "vllm",
        "owngate.backend.region": "eu-west-1",
        "owngate.attempt.outcome": "served",
        "http.response.status_code": 200,
        "owngate.provenance.index": 0,
    }
    # The private backend joined the trace, under the attempt's span.
    (sent,) = traced.private.app.captured("/v1/chat/completions")
    context = attempt.context
    assert context.trace_flags.sampled
    assert sent.header("traceparent") == b"00-%032x-%016x-%02x" % (
        context.trace_id,
        context.span_id,
        context.trace_flags,
    )


def test_a_fallback_is_a_failed_attempt_then_a_hosted_one(traced: Traced) -> None:
    answer = traced.post("m", max_tokens=3)
    assert answer.status_code == 200, answer.text
    request, (failed, served) = traced.trace(3)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and served.attributes is not None
    assert {k: failed.attributes[k] for k in ("owngate.backend.id", "server.port")} == {
        "owngate.backend.id": "dead",
        "server.port": traced.dead_port,
    }
    assert failed.attributes["owngate.attempt.outcome"] == "failed"
    assert failed.attributes["owngate.attempt.reason"] == "connect"
    assert failed.attributes["error.type"] == "connect"
    assert "owngate.fallback" not in failed.attributes
    assert served.name == "chat m"
    assert served.attributes["owngate.backend.tier"] == "hosted"
    assert served.attributes["gen_ai.provider.name"] == "openai"
    assert served.attributes["owngate.fallback"] == "private_unavailable"
    assert served.attributes["owngate.attempt.outcome"] == "served"
    # each attempt names its own dispatch record
    assert failed.attributes["owngate.provenance.index"] == 0
    assert served.attributes["owngate.provenance.index"] == 2  # after the failure's completion
    assert request.attributes is not None
    assert request.attributes["owngate.fallback"] == "private_unavailable"
    assert request.attributes["gen_ai.response.model"] == "m"
    assert request.attributes["owngate.provenance.index"] == 2
    assert str(request.attributes["owngate.policy.rule"]).startswith("traced/")
    # A hosted provider never gets the gateway's trace context.
    (sent,) = traced.hosted.app.captured("/v1/chat/completions")
    assert sent.header("traceparent") is None


def test_a_refusal_is_a_request_span_without_attempts(traced: Traced) -> None:
    answer = traced.post("g", headers={"x-data-class": MARKER})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "unknown_data_class"
    request, attempts = traced.trace(1)
    assert attempts == []
    assert request.status.status_code is StatusCode.UNSET  # the client's error, not ours
    assert request.attributes is not None
    assert request.attributes["error.type"] == "unknown_data_class"
    assert request.attributes["http.response.status_code"] == 400
    assert request.attributes["owngate.policy.rule"] == "traced/data_classes"
    assert request.attributes["owngate.provenance.index"] == 0  # the refusal record
    assert "owngate.data_class" not in request.attributes  # the label was not declared


def test_a_stream_has_its_usage_and_one_attempt(traced: Traced) -> None:
    with httpx.stream(
        "POST",
        f"{traced.gateway.url}/v1/chat/completions",
        json={"model": "g", "stream": True, "messages": [{"role": "user", "content": MARKER}]},
        headers=traced.gateway.headers,
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        text = answer.read()
    assert b"[DONE]" in text
    request, (attempt,) = traced.trace(2)
    assert request.attributes is not None and attempt.attributes is not None
    assert request.attributes["owngate.stream"] is True
    assert int(request.attributes["gen_ai.usage.output_tokens"]) > 0  # type: ignore[arg-type]
    assert attempt.attributes["owngate.attempt.outcome"] == "served"


def test_an_unknown_model_is_never_named(traced: Traced) -> None:
    answer = traced.post(MARKER)
    assert answer.status_code == 404
    request, attempts = traced.trace(1)
    assert attempts == [] and request.name == "chat"
    assert request.attributes is not None
    assert "gen_ai.request.model" not in request.attributes
    assert request.attributes["error.type"] == "model_not_found"


@pytest.mark.parametrize(("method", "recorded"), [("GET", "GET"), ("PROPFIND", "_OTHER")])
def test_the_method_is_recorded_only_from_the_known_set(
    traced: Traced, method: str, recorded: str
) -> None:
    answer = httpx.request(
        method, f"{traced.gateway.url}/v1/chat/completions", headers=traced.gateway.headers
    )
    assert answer.status_code == 405
    request, _ = traced.trace(1)
    assert request.attributes is not None
    assert request.attributes["http.request.method"] == recorded
    assert request.attributes["error.type"] == "method_not_allowed"


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """Off (no OTEL_* variable): building the app and serving a request through it load
    no OpenTelemetry module, and the backend gets no traceparent."""
    code = """
import sys, dataclasses, httpx
from gateway.app import create_app
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from tests.helpers.gateways import backend, gateway_config
settings = dataclasses.replace(SimSettings.for_kind("vllm", models=("g",)), zero_latency=True)
sim = create_sim_app(settings)
backends = ServerThread(sim).start()
app = create_app(gateway_config([backend("gpu", backends.url, "g")]), environ={})
gateway = ServerThread(app).start()
try:
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
        json={"model": "g", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer og-test-tenant-key-0123456789"})
finally:
    gateway.stop()
    backends.stop()
assert answer.status_code == 200, answer.text
assert app.parts.tracing is None and app.tracer is None
(sent,) = sim.captured("/v1/chat/completions")
assert sent.header("traceparent") is None
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
