"""A real `owngate serve` exporting its spans over OTLP/HTTP to a receiver in this test.

Tracing is switched on the standard way (`OTEL_EXPORTER_OTLP_ENDPOINT`), with a batch
delay far longer than the test (`OTEL_BSP_SCHEDULE_DELAY`), so every span arrives in the
flush at shutdown: the test checks that the flush happens, that the spans decode as
`ExportTraceServiceRequest`s with the request/attempt structure and attributes, and that
no prompt, key, label or header text the clients sent is anywhere in the exported bytes.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, Sim, backend
from tests.helpers.net import free_port
from tests.helpers.otlp_receiver import Receiver, receiving
from tests.helpers.otlp_receiver import attributes as _attributes
from tests.helpers.processes import GatewayProcess

MARKER = "otlp-marker-c4d2a9"
KEY = f"sk-{MARKER}-tenant-key"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as started:
        yield started


def _config(sim: Sim) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [backend("gpu", sim.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "admin": ADMIN,
    }


def test_owngate_serve_exports_request_and_attempt_spans(
    start_sim: Callable[..., Sim], receiver: Receiver, tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = _config(sim)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "600000",  # only the shutdown flush sends them
        "OTEL_SERVICE_NAME": "owngate-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    gateway = GatewayProcess(config, tmp_path / "gw", env=env).start()
    headers = {
        "authorization": f"Bearer {KEY}",
        "x-client-note": MARKER,
        "traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01",
    }
    chat = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": MARKER}]}
    url = f"{gateway.url}/v1/chat/completions"
    try:
        served = httpx.post(url, json=chat, headers=headers, timeout=30)
        assert served.status_code == 200, served.text
        with httpx.stream("POST", url, json={**chat, "stream": True}, headers=headers) as stream:
            assert stream.status_code == 200
            stream.read()
        labelled = {**headers, "x-data-class": MARKER}
        assert httpx.post(url, json=chat, headers=labelled, timeout=30).status_code == 400
        wrong_key = {**headers, "authorization": f"Bearer {MARKER}"}
        assert httpx.post(url, json=chat, headers=wrong_key, timeout=30).status_code == 401
        assert receiver.bodies == []  # nothing before the flush: the batch waits
    finally:
        assert gateway.stop() == 0, gateway.output()

    assert set(receiver.paths) == {"/v1/traces"}
    exported = b"".join(receiver.bodies)
    for secret in (MARKER, KEY, "Bearer", "authorization", "x-client-note"):
        assert secret.encode() not in exported, secret
    spans, resources = receiver.spans()
    assert all(
        r["service.name"] == "owngate-under-test" and r["deployment.environment"] == "test"
        for r in resources
    )
    requests = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    attempts = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert len(spans) == 6 and len(requests) == 4 and len(attempts) == 2
    by_id = {s.span_id: s for s in requests}
    for attempt in attempts:  # one per served request, under its request span
        parent = by_id[attempt.parent_span_id]
        assert parent.trace_id == attempt.trace_id
        attributes = _attributes(attempt.attributes)
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["server.port"] == httpx.URL(sim.url).port
        assert attributes["owngate.backend.id"] == "gpu"
        assert attributes["owngate.attempt.outcome"] == "served"
    for request in requests:
        assert request.parent_span_id == b""  # the client's traceparent is only a link
        assert [link.trace_id.hex() for link in request.links] == [CLIENT_TRACE]
    outcomes = sorted(
        (
            request.name,
            _attributes(request.attributes)["http.response.status_code"],
            _attributes(request.attributes).get("error.type"),
        )
        for request in requests
    )
    assert outcomes == [
        ("chat", 401, "invalid_api_key"),
        ("chat m", 200, None),
        ("chat m", 200, None),
        ("chat m", 400, "unknown_data_class"),
    ]


def test_a_hanging_collector_fails_no_request_and_holds_shutdown_only_so_long(
    start_sim: Callable[..., Sim], tmp_path: Path
) -> None:
    """A collector that takes the connection and never answers: export blocks on its
    own thread (with a 10-minute OTLP timeout), requests are served regardless, and the
    shutdown flush is given up after its bound, so the process exits cleanly long
    before `stop` would kill it."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)  # connections complete in the kernel; none is ever read
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hanging.getsockname()[1]}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "600",
            "OTEL_BSP_SCHEDULE_DELAY": "1",  # export (and hang) as soon as spans end
        }
        gateway = GatewayProcess(_config(sim), tmp_path / "gw", env=env).start()
        chat = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        try:
            for _ in range(5):
                answer = httpx.post(
                    f"{gateway.url}/v1/chat/completions",
                    json=chat,
                    headers={"authorization": f"Bearer {KEY}"},
                    timeout=30,
                )
                assert answer.status_code == 200, answer.text
        finally:
            code = gateway.stop(timeout_s=60)  # SIGKILL (code -9) if the flush held it
        assert code == 0, gateway.output()
        assert "traces not flushed" in gateway.output()
