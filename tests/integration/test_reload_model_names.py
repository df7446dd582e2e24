"""A gateway.yaml reload that gives a public name to another model on a backend reaches a
request in flight.

A request runs on the config it arrived under, whose routes send it to each backend as
the model that config serves its public name as (`chat` as `big`). When one reload serves
`chat` as another model (`small`) and denies `big` by name, the new set admits the
backends for `chat` (they serve it as `small` now), while a failover of the old request
would still ask them for `big`, the model the new policy denies. Before, the declared
facts and the address were compared, not the model an attempt asks for. Nor did the
failure of `big` on a backend show the model it serves now unavailable: a hosted
fallback is withheld, as after a reload that redeclared the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS  # the second test has a hosted backend

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any}
"""
NEVER = "  fallback: {mode: never}\n"
HOSTED = "  fallback:\n    mode: when_private_unavailable\n    to: [{backend: hosted}]\n"
CHAT = {"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}


def held_503(release: threading.Event) -> Answer:
    """Wait for `release` (60 s at most), then answer 503: the request fails over."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    return answer


def _write(tmp_path: Path, version: str, policy: str, backends: list[dict[str, Any]]) -> None:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "p.yaml").write_text(POLICY.replace("VERSION", version) + policy)
    config: dict[str, Any] = gateway_config(
        backends,
        policy={"paths": ["policies"]},
        routing={"failover": {"max_attempts": 2}, "default": {"strategy": "round_robin"}},
    ).model_dump(mode="json", exclude_none=True)
    staged = tmp_path / "gateway.yaml.tmp"
    staged.write_text(yaml.safe_dump(config))
    staged.replace(tmp_path / "gateway.yaml")


@contextlib.contextmanager
def _in_flight_over_a_reload(
    tmp_path: Path,
    first: RawBackend,
    release: threading.Event,
    reload: Callable[[], None],
    environ: dict[str, str] | None = None,
) -> Iterator[httpx.Response]:
    """Send `CHAT`; once `first` has it, `reload()` and wait for the reload; then let the
    held backends answer: the client's answer, the gateway still running."""
    path = tmp_path / "gateway.yaml"
    app = create_app(
        load_config(path), environ=environ or {}, config_dir=tmp_path, config_file=path
    )
    server = ServerThread(app).start()
    try:
        gateway = Gateway(app, server)
        before = app.parts.registry
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(
                httpx.post,
                f"{gateway.url}/v1/chat/completions",
                json=CHAT,
                headers=gateway.headers,
                timeout=90,
            )
            until(lambda: bool(first.posts), "the first attempt, at the first backend")
            reload()
            until(lambda: app.parts.registry is not before, "the reload", timeout=30.0)
            release.set()
            yield answer.result(timeout=60)
    finally:
        release.set()
        server.stop()


def test_a_failover_never_asks_for_a_model_the_reload_denied_under_an_old_alias(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    release = threading.Event()
    first, second = start_raw(held_503(release)), start_raw(held_503(release))

    def serving(model: str) -> list[dict[str, Any]]:
        return [
            backend("gpu-a", first.url, {"name": model, "aliases": ["chat"]}),
            backend("gpu-b", second.url, {"name": model, "aliases": ["chat"]}),
        ]

    _write(tmp_path, "1", NEVER, serving("big"))
    denied = NEVER + "  models: {deny: [big]}\n"
    reload = partial(_write, tmp_path, "2", denied, serving("small"))
    with _in_flight_over_a_reload(tmp_path, first, release, reload) as response:
        pass
    asked = [json.loads(post.body)["model"] for post in second.posts]
    assert asked == [], f"gpu-b was asked for {asked}: `big` is denied by policy set 2"
    assert response.status_code == 503, response.text


def test_no_hosted_fallback_after_a_failure_of_the_model_a_reload_replaced(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    tmp_path: Path,
) -> None:
    release = threading.Event()
    first = start_raw(held_503(release))
    provider = start_sim("vllm", models=("chat",), zero_latency=True)

    def serving(model: str) -> list[dict[str, Any]]:
        return [
            backend("gpu-a", first.url, {"name": model, "aliases": ["chat"]}),
            hosted_backend("hosted", f"{provider.url}/v1", "chat"),
        ]

    _write(tmp_path, "1", HOSTED, serving("big"))
    reload = partial(_write, tmp_path, "2", HOSTED, serving("small"))
    with _in_flight_over_a_reload(
        tmp_path, first, release, reload, {"HOSTED_KEY": "k"}
    ) as response:
        pass
    # `big` failed on gpu-a; `small`, what it serves `chat` as now, was never tried.
    assert served(provider) == 0, "the prompt went to the hosted provider"
    assert response.status_code == 503, response.text
