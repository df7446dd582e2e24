"""Bodies reach the backend byte for byte; only `model` changes for an alias."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gateway.api.body_rewrites import model_pattern as _model_pattern
from gateway.api.body_rewrites import rewrite_model
from gateway.upstream.errors import sanitize_upstream_message
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim


def _post(gateway: Gateway, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        content=body,
        headers={**gateway.headers, "content-type": "application/json", "x-custom": "client"},
        timeout=10,
    )


def test_body_is_forwarded_byte_for_byte(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    sim, gateway = sim_and_gateway
    # Odd spacing, key order, unicode escapes and fields no OpenAI schema knows.
    body = (
        b'{ "messages":[{"role":"user","content":"h\\u00e9llo"}],  "model" : "sim-model",'
        b'"x_unknown_field": {"nested": [1, 2.50, null]}, "max_tokens": 2 }'
    )
    response = _post(gateway, body)
    assert response.status_code == 200, response.text
    seen = sim.app.captured()[-1]
    assert seen.path == "/v1/chat/completions"
    assert seen.body == body
    # The client's credentials and headers stay at the gateway.
    assert seen.header("authorization") is None
    assert seen.header("x-custom") is None
    assert seen.header("x-request-id") == response.headers["x-request-id"].encode()


def test_alias_rewrites_only_the_model_value(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    sim, gateway = sim_and_gateway
    body = b'{"model":  "chat", "messages": [{"role": "user", "content": "model: chat"}]}'
    assert _post(gateway, body).status_code == 200
    assert sim.app.captured()[-1].body == body.replace(b'"chat"', b'"sim-model"', 1)


def test_backend_api_key_is_sent(start_sim, start_gateway) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.gateways import backend

    sim = start_sim("vllm", models=("m",), zero_latency=True, api_key="backend-secret")
    gateway = start_gateway([backend("gpu", sim.url, "m", api_key="backend-secret")])
    response = _post(gateway, b'{"model": "m", "prompt": "hi", "max_tokens": 1}', "/v1/completions")
    assert response.status_code == 200, response.text
    assert sim.app.captured()[-1].header("authorization") == b"Bearer backend-secret"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"a","x":1}', b'{"model":"b","x":1}'),
        (b'{"x": {"model": "a"}, "model": "a"}', b'{"x":{"model":"a"},"model":"b"}'),  # re-encoded
        (b'{"model": "\\u0061"}', b'{"model":"b"}'),  # escaped name: re-encoded
        # The only literal match is nested; the top-level name is escaped: re-encoded.
        (b'{"model":"\\u0061","m":{"model":"a"}}', b'{"model":"b","m":{"model":"a"}}'),
    ],
)
def test_rewrite_model(body: bytes, expected: bytes) -> None:
    out = rewrite_model(body, orjson.loads(body), _model_pattern("a"), "b")
    assert out == expected


def test_upstream_messages_lose_urls_and_hosts() -> None:
    text = (
        "connect to http://10.0.0.7:8000/v1/x failed; 10.1.2.3:99 and localhost:8001 down; "
        "vllm-0.vllm.ns.svc.cluster.local:8000 [fd00::12]:8000 host gpu-a100-3 port 8000"
    )
    cleaned = sanitize_upstream_message(text, hosts=("gpu-a100-3",))
    for leak in ("10.", "localhost", "http", "cluster.local", "fd00", "gpu-a100"):
        assert leak not in cleaned, cleaned


def test_repeated_model_key_is_refused(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    sim, gateway = sim_and_gateway
    body = b'{"model": "sim-model", "messages": [], "model": "embed-model"}'
    response = _post(gateway, body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"
    assert sim.app.captured("/v1/chat/completions") == []


def test_request_id_header_on_every_response(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    for method, path, headers in [
        ("GET", "/healthz", {}),
        ("GET", "/readyz", {}),
        ("GET", "/metrics", {}),
        ("GET", "/nope", {}),
        ("GET", "/v1/models", {"authorization": f"Bearer {TENANT_KEY}"}),
        ("POST", "/v1/chat/completions", {}),
    ]:
        response = httpx.request(method, f"{gateway.url}{path}", headers=headers, timeout=10)
        assert response.headers["x-request-id"].startswith("req_"), (path, response.status_code)
