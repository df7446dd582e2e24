"""A private backend whose pool a gateway.yaml reload retired is not unavailable.

A request runs on the config it arrived under. When a reload rebuilds one of its private
backends (a changed setting that neither moves it nor changes what it declares) and the
request outlives `limits.drain_timeout_s`, its attempt there meets the closed pool of
the retired config (`retired`: nothing sent, the gateway's doing). That backend was
never tried and is up: under `when_private_unavailable` the request must not go to a
hosted provider for it, and no fallback record may say it failed (docs/policies.md,
"What unavailable means"). Before, the attempt counted as failed and the request went
hosted, its dispatch record's `fallback_basis` saying `gpu-b` failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    EU_FALLBACK_POLICY,
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.raw_backend import (
    ERROR_BODY,
    Answer,
    RawBackend,
    completion_body,
    json_answer,
)
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

POLICY = EU_FALLBACK_POLICY


def test_a_retired_pool_does_not_make_its_private_backend_unavailable(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    tmp_path: Path,
) -> None:
    release = threading.Event()
    first = start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", release))  # gpu-a
    second = start_raw(json_answer(completion_body("private")))  # gpu-b: up, would serve
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(POLICY)

    def write(first_byte_timeout_s: float) -> None:
        config: dict[str, Any] = gateway_config(
            [
                backend("gpu-a", first.url, "m", **EU_ZERO),
                backend(
                    "gpu-b", second.url, "m", **EU_ZERO, first_byte_timeout_s=first_byte_timeout_s
                ),
                hosted_backend("hosted", f"{hosted.url}/v1", "m"),
            ],
            policy={"paths": ["policies"]},
            limits={"drain_timeout_s": 0.2},
            routing={"failover": {"max_attempts": 2}, "default": {"strategy": "round_robin"}},
        ).model_dump(mode="json", exclude_none=True)
        staged = tmp_path / "gateway.yaml.tmp"
        staged.write_text(yaml.safe_dump(config))
        staged.replace(tmp_path / "gateway.yaml")

    write(30.0)
    path = tmp_path / "gateway.yaml"
    environ = {"HOSTED_KEY": "k"}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    try:
        gateway = Gateway(app, server)
        old_b = app.parts.registry.backends["gpu-b"]
        body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(
                httpx.post,
                f"{gateway.url}/v1/chat/completions",
                json=body,
                headers=gateway.headers,
                timeout=90,
            )
            until(lambda: bool(first.posts), "the first attempt, at gpu-a (round robin)")
            write(20.0)  # gpu-b rebuilt: same address, same declaration
            until(
                lambda: app.parts.registry.backends["gpu-b"] is not old_b, "the reload", timeout=30
            )
            old_pool = old_b.pool
            assert old_pool is not None
            until(lambda: old_pool.closed, "the old pool retired", timeout=30)
            release.set()
            response = answer.result(timeout=60)
    finally:
        release.set()
        server.stop()
    assert served(hosted) == 0, "a retired pool let the request go hosted"
    assert not second.posts  # the request runs on the config it arrived under
    assert response.status_code == 503, response.text
