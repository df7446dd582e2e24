"""The circuit breaker's state machine, driven by an injected clock (no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.app import assemble, create_app
from gateway.config.schema import BreakerSettings
from gateway.routing.breaker import Breaker, Pass
from gateway.serving import ServerThread
from tests.helpers.gateways import Gateway, Sim, backend, gateway_config


def state(breaker: Breaker) -> str:
    """Read through a call: mypy would otherwise narrow `breaker.state` across calls."""
    return breaker.state.value


SETTINGS = BreakerSettings(failure_threshold=3, cooldown_s=1.0, max_cooldown_s=4.0)


def tripped(now: float = 0.0) -> Breaker:
    breaker = Breaker(SETTINGS)
    for _ in range(3):
        breaker.failed(now, "connect: refused")
    assert state(breaker) == "open"
    return breaker


def test_opens_after_consecutive_failures_only() -> None:
    breaker = Breaker(SETTINGS)
    breaker.failed(0.0, "HTTP 500")
    breaker.failed(0.0, "HTTP 500")
    breaker.succeeded()  # a success in between resets the count
    breaker.failed(0.0, "HTTP 500")
    breaker.failed(0.0, "HTTP 500")
    assert state(breaker) == "closed" and breaker.available(0.0)
    breaker.failed(0.0, "HTTP 500")
    assert state(breaker) == "open"
    assert not breaker.available(0.5) and breaker.begin(0.5) is None
    assert breaker.opens == 1 and breaker.last_error == "HTTP 500"


def test_outcomes_from_an_earlier_epoch_do_not_judge_the_probe() -> None:
    breaker = Breaker(SETTINGS)
    assert breaker.begin(0.0) is Pass.normal
    old = breaker.epoch  # a slow request, begun while closed
    for _ in range(3):
        breaker.failed(0.0, "connect: refused", breaker.epoch)
    assert state(breaker) == "open" and breaker.opens == 1
    assert breaker.begin(1.0) is Pass.probe
    probe = breaker.epoch
    breaker.failed(1.0, "timeout: old request", old)  # it ends now: only noted
    assert state(breaker) == "half_open" and breaker.opens == 1
    assert breaker.last_error == "timeout: old request"
    breaker.abandoned(old)  # nor does it free the probe slot
    assert breaker.begin(1.0) is None
    breaker.failed(1.0, "HTTP 503", probe)  # the probe's own verdict reopens it
    assert state(breaker) == "open" and breaker.opens == 2


def test_half_open_lets_exactly_one_probe_through() -> None:
    breaker = tripped()
    assert breaker.available(1.0)  # the cooldown is over
    assert breaker.begin(1.0) is Pass.probe
    assert state(breaker) == "half_open"
    assert breaker.begin(1.0) is None and not breaker.available(1.0)
    breaker.succeeded()
    assert state(breaker) == "closed"
    assert breaker.begin(1.0) is Pass.normal


def test_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_cap() -> None:
    breaker = tripped()
    now = 0.0
    cooldowns = []
    for _ in range(4):
        now = breaker.open_until
        assert breaker.begin(now) is Pass.probe
        breaker.failed(now, "timeout: no response")
        cooldowns.append(breaker.open_until - now)
    assert cooldowns == [2.0, 4.0, 4.0, 4.0]
    now = breaker.open_until
    assert breaker.begin(now) is Pass.probe
    breaker.succeeded()  # a request succeeded: the next opening starts from the base again
    for _ in range(3):
        breaker.failed(now, "HTTP 503")
    assert breaker.open_until - now == 1.0


def test_an_abandoned_probe_hands_the_probe_on() -> None:
    breaker = tripped()
    assert breaker.begin(1.0) is Pass.probe
    breaker.abandoned()  # the client left before the backend answered
    assert breaker.begin(1.0) is Pass.probe


def test_health_probes_open_and_close_without_growing_the_cooldown() -> None:
    breaker = Breaker(SETTINGS)
    breaker.probe_failed(0.0, "/health answered HTTP 503")
    assert state(breaker) == "open" and breaker.open_until == 1.0
    breaker.probe_ok(0.5)  # too early: the cooldown holds
    assert state(breaker) == "open"
    breaker.probe_failed(1.0, "/health answered HTTP 503")  # still loading
    assert breaker.open_until == 2.0  # base cooldown again, not doubled
    breaker.probe_ok(2.0)  # the scraper's probe is the half-open trial
    assert state(breaker) == "closed"


def test_outcomes_of_requests_begun_before_opening_do_not_close_it() -> None:
    breaker = tripped()
    breaker.succeeded()  # a long stream that started earlier finishes well
    assert state(breaker) == "open"


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="max_cooldown_s must be at least cooldown_s"):
        BreakerSettings(cooldown_s=5.0, max_cooldown_s=1.0)
    with pytest.raises(ValidationError):
        BreakerSettings(failure_threshold=0)


# Over real sockets: what the relay tells the breaker.


def _backend_app(
    delay_s: float, *, sse_headers_then_hang: bool = False
) -> Callable[..., Awaitable[None]]:
    """A bare ASGI backend: waits `delay_s`, then answers a chat completion; or sends SSE
    headers and never a chunk."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if sse_headers_then_hang:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await asyncio.sleep(3600)
        await asyncio.sleep(delay_s)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        body = b'{"id":"x","object":"chat.completion","choices":[]}'
        await send({"type": "http.response.body", "body": body})

    return app


def _chat(gateway: Gateway, *, stream: bool) -> int:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", headers=gateway.headers, json=body, timeout=20
    )
    return response.status_code


def test_headers_then_silence_opens_the_breaker(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    # Judged by how the answer ended, not by its headers: otherwise every request resets
    # the failure count and the backend keeps eating a first-byte timeout forever.
    good = start_sim("vllm", models=("m",), zero_latency=True)
    with ServerThread(_backend_app(0, sse_headers_then_hang=True)) as hanging:
        gateway = start_gateway(
            [
                backend("hang", hanging.url, "m", kind="openai", first_byte_timeout_s=0.3),
                backend("good", good.url, "m", kind="openai"),
            ],
            routing={
                "default": {"strategy": "round_robin"},
                "breaker": {"failure_threshold": 3, "cooldown_s": 30.0},
            },
        )
        assert [_chat(gateway, stream=True) for _ in range(10)] == [200] * 10
        breaker = gateway.app.registry.backends["hang"].breaker
        assert breaker.opens == 1
        assert breaker.state.value == "open"


def test_a_timeout_the_failover_deadline_cut_short_is_not_the_backends_fault(
    start_gateway: Callable[..., Gateway],
) -> None:
    with (
        ServerThread(_backend_app(3600)) as hung,
        ServerThread(_backend_app(0.5)) as slow,
    ):
        gateway = start_gateway(
            [
                backend("hung", hung.url, "m", kind="openai", first_byte_timeout_s=1.0),
                backend("slow", slow.url, "m", kind="openai", first_byte_timeout_s=5.0),
            ],
            routing={
                "default": {"strategy": "least_inflight"},
                "failover": {"deadline_s": 1.2},
                "breaker": {"failure_threshold": 3, "cooldown_s": 30.0},
            },
        )
        for _ in range(4):
            _chat(gateway, stream=False)
        slow_breaker = gateway.app.registry.backends["slow"].breaker
        assert slow_breaker.state.value == "closed"
        assert slow_breaker.opens == 0


def test_a_reload_applies_new_breaker_settings_to_kept_backends() -> None:
    config = gateway_config(
        [backend("b", "http://127.0.0.1:9", "m")], routing={"breaker": {"failure_threshold": 3}}
    )
    app = create_app(config, environ={})
    changed = gateway_config(
        [backend("b", "http://127.0.0.1:9", "m")],
        routing={"breaker": {"failure_threshold": 50, "cooldown_s": 9.0, "max_cooldown_s": 9.0}},
    )
    app.install(assemble(changed, {}, config_dir=app.config_dir, running=app.parts))
    assert app.registry.backends["b"].breaker.settings.failure_threshold == 50
