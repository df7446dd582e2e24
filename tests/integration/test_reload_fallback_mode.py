"""A reload that makes a policy's fallback mode stricter reaches a request in flight.

A request decided under `when_private_saturated` may fall back because its private
backend answered busy (429), or because the private tier was saturated when it was
planned. A reload to `when_private_unavailable` accepts neither as a reason: the hosted
fallback of a plan made before the reload must not run, though the hosted backend is
still admitted (the set checks each attempt's backend, and now its reason too). Before,
only the backend's membership was checked, so both requests went hosted.

Private backends are scripted raw backends that hold their answer until the test lets
them go; the hosted backends are reached through LiteLLM on loopback (a simulator, and in
the saturated case a raw backend that holds, then answers 503, so that the request moves
on to the next hosted backend after the reload).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    served,
)
from tests.helpers.raw_backend import ERROR_BODY, Answer, RawBackend, json_answer
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: MODE
    to: [{backend: hosted-a}, {backend: hosted-b}]
"""
SATURATED = "when_private_saturated\n    saturation_threshold: THRESHOLD"
ANSWER = (
    b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": '
    b'[{"index": 0, "message": {"role": "assistant", "content": "ok"}, '
    b'"finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, '
    b'"total_tokens": 2}}'
)


def write_policy(path: Path, version: str, mode: str) -> None:
    path.write_text(POLICY.replace("VERSION", version).replace("MODE", mode))


def chat(gateway: Gateway) -> httpx.Response:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{gateway.url}/v1/chat/completions"
    return httpx.post(url, json=body, headers=gateway.headers, timeout=60)


def reloaded(gateway: Gateway, version: str) -> None:
    until(
        lambda: gateway.app.policies.current.compiled("eu").version == version,
        "the reload",
        timeout=30.0,
    )


def _saturated_gateway(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    threshold: str,
    private: RawBackend,
    hosted_urls: tuple[str, str],
    **private_settings: Any,
) -> tuple[Gateway, Path]:
    """A gateway over the private backend `private` and hosted-a, hosted-b at
    `hosted_urls`, under policy version 1 (`when_private_saturated` at `threshold`),
    reloaded every 50 ms from its file; the gateway and that file."""
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    write_policy(policy, "1", SATURATED.replace("THRESHOLD", threshold))
    gateway = start_gateway(
        [
            backend("gpu-eu", private.url, "m", **EU_ZERO, **private_settings),
            hosted_backend("hosted-a", f"{hosted_urls[0]}/v1", "m"),
            hosted_backend("hosted-b", f"{hosted_urls[1]}/v1", "m"),
        ],
        policy={"paths": [str(policy.parent)], "reload_interval_s": 0.05},
        environ={"HOSTED_KEY": "test-key"},
    )
    return gateway, policy


def test_a_busy_private_backend_no_longer_lets_a_request_fall_back_after_a_reload(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """Decided under `when_private_saturated` (a 429 is a reason to fall back); the private
    backend holds, the policy is reloaded to `when_private_unavailable`, then the private
    backend answers 429: busy is no longer a reason, so nothing goes hosted."""
    release = threading.Event()
    private = start_raw(json_answer(ERROR_BODY, b"429 Too Many Requests", release))
    hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
    hosted = (hosted_sim.url, hosted_sim.url)
    gateway, policy = _saturated_gateway(start_gateway, tmp_path, "100", private, hosted)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(chat, gateway)
            until(lambda: bool(private.posts), "the private attempt")
            write_policy(policy, "2", "when_private_unavailable")
            reloaded(gateway, "2")
            release.set()
            response = answer.result(timeout=60)
    finally:
        release.set()
    assert served(hosted_sim) == 0, "a busy private backend let the request go hosted"
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "backend_unavailable"


def test_a_saturated_private_tier_no_longer_lets_a_request_fall_back_after_a_reload(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """Two requests hold the private backend's one slot, so a third is planned hosted
    first (saturated). Its first hosted backend holds; the policy is reloaded to
    `when_private_unavailable`; the first hosted backend answers 503. The second hosted
    backend must get nothing: the private tier is up, only saturated. The request is
    served by the private backend once it lets go."""
    private_go, hosted_go = threading.Event(), threading.Event()
    private = start_raw(json_answer(ANSWER, release=private_go))
    first_hosted = start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", hosted_go))
    hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
    hosted = (first_hosted.url, hosted_sim.url)
    gateway, policy = _saturated_gateway(
        start_gateway, tmp_path, "0.5", private, hosted, capacity={"max_concurrency": 1}
    )
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            holding = [pool.submit(chat, gateway) for _ in range(2)]
            until(lambda: len(private.posts) >= 2, "two requests at the private backend")
            answer = pool.submit(chat, gateway)
            # LiteLLM loads on the first hosted attempt: seconds on a busy machine.
            until(
                lambda: bool(first_hosted.posts),
                "the saturated fallback's first attempt",
                timeout=60.0,
            )
            write_policy(policy, "2", "when_private_unavailable")
            reloaded(gateway, "2")
            hosted_go.set()
            until(
                lambda: len(private.posts) >= 3 or answer.done(),
                "the request moving on from the first hosted backend",
                timeout=30.0,
            )
            private_go.set()
            response = answer.result(timeout=60)
            assert all(h.result(timeout=30).status_code == 200 for h in holding)
    finally:
        private_go.set()
        hosted_go.set()
    assert served(hosted_sim) == 0, "a saturated private tier let the request go hosted"
    assert response.status_code == 200, response.text
    assert len(private.posts) == 3
