"""Trust policies on the request path, over real sockets: the eligible set is a filter.

Private backends are simulators; the hosted provider is a simulator too, reached through
LiteLLM (an OpenAI-shaped provider), so the fallback path runs for real without network.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config import load_config
from tests.helpers.gateways import (
    EU_ZERO,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    labelled_chat,
    readiness,
    served,
)
from tests.helpers.net import free_port
from tests.helpers.raw_backend import Answer, RawBackend, held_503
from tests.helpers.waiting import until

POLICIES = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu-health, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: {mode}
    {to}
  data_classes:
    phi:
      fallback: {mode: never}
"""


def write_policy(directory: Path, mode: str, extra: str = "") -> Path:
    to = "to: [{backend: hosted-eu}]" if mode != "never" else ""
    if mode == "when_private_saturated":
        to += "\n    saturation_threshold: 0.5"
    text = POLICIES.replace("{mode}", mode).replace("{to}", to) + extra
    directory.mkdir(exist_ok=True)
    (directory / "policy.yaml").write_text(text)
    return directory


def hosted(sim: Sim, id: str = "hosted-eu", **facts: Any) -> dict[str, Any]:
    return hosted_backend(id, f"{sim.url}/v1", "m", **facts)


@pytest.fixture
def setup(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> Callable[..., tuple[Gateway, Sim, Sim]]:
    """(gateway, private sim, hosted sim) with a policy of the given fallback mode."""

    def build(mode: str, *, private_up: bool = True, **private: Any) -> tuple[Gateway, Sim, Sim]:
        private_sim = start_sim("vllm", models=("m",), **{"zero_latency": True, **private})
        hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
        url = private_sim.url if private_up else f"http://127.0.0.1:{free_port()}"
        backends = [
            backend("gpu-eu", url, "m", **EU_ZERO, capacity={"max_concurrency": 1}),
            backend("gpu-us", private_sim.url, "m", region="us-east-1"),
            hosted(hosted_sim),
            hosted(hosted_sim, id="hosted-us", region="us"),
        ]
        policy_dir = write_policy(tmp_path / "policies", mode)
        gateway = start_gateway(
            backends,
            policy={"paths": [str(policy_dir)], "reload_interval_s": 0.05},
            environ={"HOSTED_KEY": "test-key"},
        )
        return gateway, private_sim, hosted_sim

    return build


chat = labelled_chat


def test_private_first_when_healthy(setup: Callable[..., tuple[Gateway, Sim, Sim]]) -> None:
    gateway, private, hosted_sim = setup("when_private_unavailable")
    for _ in range(3):
        assert chat(gateway).status_code == 200
    assert served(private) == 3  # all on gpu-eu: gpu-us is outside the residency
    assert served(hosted_sim) == 0


def test_fallback_to_the_allowed_hosted_provider_when_private_is_down(
    setup: Callable[..., tuple[Gateway, Sim, Sim]],
) -> None:
    gateway, private, hosted_sim = setup("when_private_unavailable", private_up=False)
    response = chat(gateway)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"
    assert served(hosted_sim) == 1
    assert served(private) == 0  # gpu-us is up, but the policy excludes it: never tried
    assert hosted_sim.app.captured()[-1].header("authorization") == b"Bearer test-key"


def test_never_fallback_is_a_clear_503_naming_the_rule(
    setup: Callable[..., tuple[Gateway, Sim, Sim]],
) -> None:
    gateway, private, hosted_sim = setup("never", private_up=False)
    response = chat(gateway)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "no_compliant_backend"
    assert error["message"].startswith("policy eu-health/fallback: no compliant backend")
    assert "gpu-eu" not in error["message"], error  # no backend named, nor its failure
    assert served(hosted_sim) == 0 and served(private) == 0


def test_phi_never_leaves_private_even_when_only_hosted_is_up(
    setup: Callable[..., tuple[Gateway, Sim, Sim]],
) -> None:
    gateway, private, hosted_sim = setup("when_private_unavailable", private_up=False)
    response = chat(gateway, data_class="phi")
    assert response.status_code == 503
    assert "eu-health/data_classes.phi/fallback" in response.json()["error"]["message"]
    assert served(hosted_sim) == 0 and served(private) == 0
    unknown = chat(gateway, data_class="secret-sauce")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "unknown_data_class"


def test_saturated_private_pool_falls_back(
    setup: Callable[..., tuple[Gateway, Sim, Sim]],
) -> None:
    # One slot, slow decode: a second and third request queue behind the first.
    gateway, _private, hosted_sim = setup(
        "when_private_saturated", zero_latency=False, slots=1, decode_tokens_per_s=5.0
    )
    import threading

    slow = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]}
    threads = [
        threading.Thread(
            target=lambda: httpx.post(
                f"{gateway.url}/v1/chat/completions", json=slow, headers=gateway.headers, timeout=60
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    until(
        lambda: gateway.app.registry.backends["gpu-eu"].inflight >= 2,
        "two requests in flight at gpu-eu",
        timeout=30.0,
    )
    response = chat(gateway)
    assert response.status_code == 200
    assert served(hosted_sim) == 1
    for thread in threads:
        thread.join(timeout=30)


def test_reload_swaps_atomically_and_keeps_the_last_good_set(
    setup: Callable[..., tuple[Gateway, Sim, Sim]], tmp_path: Path
) -> None:
    gateway, _private, _hosted = setup("when_private_unavailable", private_up=False)
    assert chat(gateway).status_code == 200  # falls back
    write_policy(tmp_path / "policies", "never")
    until(lambda: chat(gateway).status_code == 503, "the new policy refusing", timeout=30.0)
    assert chat(gateway).status_code == 503
    digest = gateway.app.policies.current.digest
    (tmp_path / "policies" / "policy.yaml").write_text("apiVersion: nonsense\n")
    until(lambda: gateway.app.policies.last_error is not None, "a failed reload", timeout=30.0)
    ready = readiness(gateway.url)
    assert ready["policy"]["last_reload_error"]
    assert ready["policy"]["digest"] == digest  # the last good set is still active
    assert chat(gateway).status_code == 503  # and still enforced
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    # At least one failed reload (a write caught half-done by the poll can count twice).
    failures = [
        line
        for line in metrics.splitlines()
        if line.startswith("owngate_policy_reload_failures_total ")
    ]
    assert failures and float(failures[0].split()[1]) >= 1


def test_a_failover_after_a_policy_reload_is_checked_against_the_new_set(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The first backend hangs, the policy is reloaded to deny the other, then the first
    answers 503: the failover must not go to the backend the active set now denies (it
    did: the plan was made once, from the decision of the set before)."""
    release = threading.Event()
    hang_then_503 = held_503(release)
    raws = {name: start_raw(hang_then_503) for name in ("gpu-a", "gpu-b")}
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    text = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any}
  fallback: {mode: never}
"""
    policy.write_text(text.replace("VERSION", "1"))
    gateway = start_gateway(
        [backend(name, raw.url, "m") for name, raw in raws.items()],
        policy={"paths": [str(policy.parent)], "reload_interval_s": 0.05},
        routing={"failover": {"max_attempts": 2}},
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(chat, gateway)
        until(lambda: any(raw.posts for raw in raws.values()), "the first attempt")
        first = next(name for name, raw in raws.items() if raw.posts)
        other = next(name for name in raws if name != first)
        policy.write_text(text.replace("VERSION", "2") + f"  backends: {{deny: [{other}]}}\n")
        until(
            lambda: gateway.app.policies.current.compiled("p").version == "2",
            "the reload",
            timeout=30.0,
        )
        release.set()
        response = answer.result(timeout=30)
    assert response.status_code == 503, response.text
    assert not raws[other].posts, "the failover reached a backend the active policy denies"


def test_a_fallback_after_a_reload_to_never_reaches_no_hosted_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """The private backend hangs, the policy is reloaded to `fallback: never`, then the
    private backend answers 503: the hosted fallback of the plan made before must not run."""
    release = threading.Event()
    hang_then_503 = held_503(release)
    private = start_raw(hang_then_503)
    hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
    policies = write_policy(tmp_path / "policies", "when_private_unavailable")
    gateway = start_gateway(
        [backend("gpu-eu", private.url, "m", **EU_ZERO), hosted(hosted_sim)],
        policy={"paths": [str(policies)], "reload_interval_s": 0.05},
        environ={"HOSTED_KEY": "test-key"},
    )
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(chat, gateway)
            until(lambda: bool(private.posts), "the private attempt")
            write_policy(policies, "never")
            until(
                lambda: gateway.app.policies.current.decide("acme", "m", None).fallback == "never",
                "the reload",
                timeout=30.0,
            )
            release.set()
            response = answer.result(timeout=30)
    finally:
        release.set()
    assert response.status_code == 503, response.text
    assert served(hosted_sim) == 0, "the fallback reached hosted after fallback: never"


def test_a_failover_after_a_config_reload_is_checked_against_the_new_config(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    """The same across a gateway.yaml reload: the request in flight finishes on the old
    config's parts, but its failover must not reach a backend the new config's declared
    facts put outside the policy (here: moved to us-east-1 under `residency: [eu]`)."""
    from gateway.app import create_app
    from gateway.serving import ServerThread

    release = threading.Event()
    hang_then_503 = held_503(release)
    raws = {name: start_raw(hang_then_503) for name in ("gpu-a", "gpu-b")}
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        POLICIES.replace("{mode}", "never").replace("{to}", "").replace("zero", "any")
    )

    def config(moved: str | None) -> dict[str, Any]:
        backends = [
            backend(name, raw.url, "m", region="us-east-1" if name == moved else "eu-west-1")
            for name, raw in raws.items()
        ]
        return gateway_config(
            backends, policy={"paths": ["policies"]}, routing={"failover": {"max_attempts": 2}}
        ).model_dump(mode="json", exclude_none=True)

    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config(None)))
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    try:
        gateway = Gateway(app, server)
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(chat, gateway)
            until(lambda: any(raw.posts for raw in raws.values()), "the first attempt")
            first = next(name for name, raw in raws.items() if raw.posts)
            other = next(name for name in raws if name != first)
            path.with_suffix(".tmp").write_text(yaml.safe_dump(config(other)))
            path.with_suffix(".tmp").replace(path)
            until(
                lambda: app.parts.registry.backends[other].config.region == "us-east-1",
                "the reload",
                timeout=10.0,
            )
            release.set()
            response = answer.result(timeout=30)
    finally:
        release.set()
        server.stop()
    assert response.status_code == 503, response.text
    assert not raws[other].posts, "the failover reached a backend the new config excludes"


def test_a_missing_provider_key_stops_the_gateway_starting(start_sim: Callable[..., Sim]) -> None:
    from gateway.app import create_app
    from tests.helpers.gateways import gateway_config

    sim = start_sim("vllm", models=("m",), zero_latency=True)
    config = gateway_config([backend("gpu", sim.url, "m"), hosted(sim)])
    with pytest.raises(ValueError, match="HOSTED_KEY"):
        create_app(config, environ={})
