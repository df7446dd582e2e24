"""Every failure is an OpenAI error object with the right status, over real sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.sim import Faults
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend
from tests.helpers.net import free_port
from tests.helpers.waiting import until

CHAT = b'{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


def post(gateway: Gateway, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {TENANT_KEY}"} if headers is None else headers,
        timeout=15,
    )


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"].startswith("req_")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (CHAT, {}, 401, "missing_api_key"),
        (CHAT, {"authorization": "Bearer og-unknown"}, 401, "invalid_api_key"),
        (CHAT, {"authorization": f"Basic {TENANT_KEY}"}, 401, "invalid_api_key"),
        (b'{"model": "sim-model", ', None, 400, "invalid_json"),
        (b"[1, 2]", None, 400, "invalid_request"),
        (b'{"messages": []}', None, 400, "missing_model"),
        (b'{"model": 7}', None, 400, "missing_model"),
        (b'{"model": "gpt-17"}', None, 404, "model_not_found"),
    ],
)
def test_client_errors(
    sim_and_gateway: tuple[Sim, Gateway],
    body: bytes,
    headers: dict[str, str] | None,
    status: int,
    code: str,
) -> None:
    _, gateway = sim_and_gateway
    assert_error(post(gateway, body, headers), status, code)


def test_body_over_limit_is_413(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(zero_latency=True)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")], limits={"max_body_bytes": 1000})
    big = b'{"model": "sim-model", "prompt": "' + b"x" * 2000 + b'"}'
    assert_error(post(gateway, big), 413, "request_too_large")
    assert sim.app.stats.started == 0


def test_wrong_method_and_unknown_path(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    assert_error(
        httpx.get(f"{gateway.url}/v1/chat/completions", timeout=5), 405, "method_not_allowed"
    )
    assert_error(httpx.get(f"{gateway.url}/v2/nothing", timeout=5), 404, "not_found")


def test_backend_down_is_503(start_gateway: Callable[..., Gateway]) -> None:
    gateway = start_gateway([backend("gpu", f"http://127.0.0.1:{free_port()}", "sim-model")])
    error = assert_error(post(gateway, CHAT), 503, "no_compliant_backend")
    assert "127.0.0.1" not in error["message"]


def test_fails_over_to_a_live_backend(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(zero_latency=True)
    gateway = start_gateway(
        [
            backend("dead", f"http://127.0.0.1:{free_port()}", "sim-model"),
            backend("live", sim.url, "sim-model"),
        ]
    )
    for _ in range(4):
        assert post(gateway, CHAT).status_code == 200
    assert sim.app.stats.completed == 4


def test_upstream_500_is_502_without_backend_details(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(zero_latency=True, faults=Faults(error_rate=1.0))
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    error = assert_error(post(gateway, CHAT), 502, "upstream_error")
    assert sim.url not in error["message"] and "127.0.0.1" not in error["message"]


def test_upstream_400_is_translated(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # The backend does not know the name it was configured with: vLLM answers 404.
    sim = start_sim(models=("other",), zero_latency=True)
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    assert_error(post(gateway, CHAT), 502, "upstream_error")


def test_hanging_backend_is_504(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(faults=Faults(hang_rate=1.0))
    gateway = start_gateway(
        [backend("gpu", sim.url, "sim-model")], limits={"first_byte_timeout_s": 0.3}
    )
    assert_error(post(gateway, CHAT), 504, "upstream_timeout")


def test_backend_dying_before_answering_is_503(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # Dispatched and failed: the backend is unavailable; the policy refused nothing.
    sim = start_sim(zero_latency=True, faults=Faults(die_mid_stream_rate=1.0))
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    assert_error(post(gateway, CHAT), 503, "backend_unavailable")


def test_stream_dying_midway_ends_with_an_error_event(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim(zero_latency=True, faults=Faults(die_mid_stream_rate=1.0))
    gateway = start_gateway([backend("gpu", sim.url, "sim-model")])
    body = CHAT.replace(b'"max_tokens": 3', b'"max_tokens": 20, "stream": true')
    response = post(gateway, body)
    assert response.status_code == 200
    events = [line for line in response.text.split("\n\n") if line]
    assert "[DONE]" not in response.text
    assert '"code":"upstream_error"' in events[-1]


def test_loading_backend_gets_nothing_until_healthy(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    sim = start_sim("llamacpp", zero_latency=True, faults=Faults(slow_start_s=60.0))
    gateway = start_gateway(
        [backend("cpu", sim.url, "sim-model", kind="llamacpp")],
        scrape={"interval_s": 0.05, "staleness_s": 30.0},  # the mark outlasts any stall
    )
    error = assert_error(post(gateway, CHAT), 503, "no_compliant_backend")
    # Why the backend is out (its probe's answer) is on /admin/status, not the tenant's.
    assert "health" not in error["message"] and "cpu" not in error["message"], error
    assert sim.app.captured("/v1/chat/completions") == []
    sim.app.start_loading(0.0)  # the model has loaded
    # Back once a probe passes and the breaker's cooldown is over: a condition, bounded
    # generously (a loaded machine stalls the scraper), not a time it must beat.
    took = until(
        lambda: gateway.app.registry.backends["cpu"].probe.alive, "a passing probe", timeout=60.0
    )
    until(
        lambda: post(gateway, CHAT).status_code == 200,
        "the loaded backend back",
        timeout=60.0 - took,
        interval=0.05,
    )


def test_backend_key_problems_stop_the_gateway_starting() -> None:
    from gateway.app import create_app
    from tests.helpers.gateways import gateway_config

    config = gateway_config([backend("gpu", "http://127.0.0.1:1", "m", api_key_env="GPU_KEY")])
    with pytest.raises(ValueError, match="GPU_KEY is not set"):
        create_app(config, environ={})
    with pytest.raises(ValueError, match="characters HTTP cannot carry"):
        create_app(config, environ={"GPU_KEY": "abc\r\nx-evil: 1"})
    create_app(config, environ={"GPU_KEY": "abc\n"})  # a trailing newline is only trimmed


def test_every_key_problem_is_named_at_once() -> None:
    """Not one missing variable per restart: every backend's (private and hosted) and a
    key hash shared by two tenants, in one error."""
    from gateway.app import AssemblyError, create_app
    from tests.helpers.gateways import gateway_config

    hosted = {
        "id": "prov",
        "kind": "hosted",
        "provider": "openai",
        "api_key_env": "PROV_KEY",
        "models": [{"name": "p", "provider_model": "openai/p"}],
        "region": "us",
        "owner": "openai",
    }
    backends = [
        backend("gpu", "http://127.0.0.1:1", "m", api_key_env="GPU_KEY"),
        backend("gpu2", "http://127.0.0.1:2", "m", api_key_env="GPU2_KEY"),
        hosted,
    ]
    config = gateway_config(backends)
    shared = config.tenants[0].api_key_hashes
    other = config.tenants[1].model_copy(update={"api_key_hashes": shared})
    config = config.model_copy(update={"tenants": (config.tenants[0], other)})
    with pytest.raises(AssemblyError) as info:
        create_app(config, environ={})
    assert len(info.value.problems) == 4
    for needle in ("GPU_KEY is not set", "GPU2_KEY is not set", "PROV_KEY", "tenants 'acme'"):
        assert any(needle in problem for problem in info.value.problems), needle


def test_a_500_before_any_byte_fails_over(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    broken = start_sim(zero_latency=True, faults=Faults(error_rate=1.0))
    healthy = start_sim(zero_latency=True)
    gateway = start_gateway(
        [backend("broken", broken.url, "sim-model"), backend("healthy", healthy.url, "sim-model")],
        routing={"default": {"strategy": "round_robin"}},
    )
    assert [post(gateway, CHAT).status_code for _ in range(4)] == [200] * 4
    assert healthy.app.stats.completed == 4
    assert broken.app.stats.errors >= 1
