"""A gateway.yaml reload that redeclares a backend reaches a request in flight.

A request runs on the config it arrived under (its backends' addresses), but each attempt
is checked against the policy set active now, compiled against the new config's declared
facts. When one reload both tightens the policy and moves a backend id to another server
with new facts (`gpu-b`: from a French server to an Irish one, residency from `eu` to
`ie`), the new set admits `gpu-b` for what it declares now, while a failover of the old
request would go to the old, French server. Before, only the id was checked, and it did.
"""

from __future__ import annotations

import asyncio
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
from tests.helpers.gateways import Gateway, backend, gateway_config
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [RESIDENCY]}
  retention: {max_days: any}
  fallback: {mode: never}
"""


def held_503(release: threading.Event) -> Answer:
    """Wait for `release` (60 s at most), then answer 503: the request fails over."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    return answer


def test_a_failover_never_reaches_the_old_server_of_a_redeclared_backend(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    release = threading.Event()
    first = start_raw(held_503(release))  # gpu-a, eu-west-1 throughout
    french = start_raw(held_503(release))  # gpu-b before the reload: eu-west-3 (France)
    irish = start_raw(held_503(release))  # gpu-b after it: eu-west-1 (Ireland)
    policies = tmp_path / "policies"
    policies.mkdir()

    def write(version: str, residency: str, gpu_b: tuple[RawBackend, str]) -> None:
        text = POLICY.replace("VERSION", version).replace("RESIDENCY", residency)
        (policies / "p.yaml").write_text(text)
        config: dict[str, Any] = gateway_config(
            [
                backend("gpu-a", first.url, "m", region="eu-west-1"),
                backend("gpu-b", gpu_b[0].url, "m", region=gpu_b[1]),
            ],
            policy={"paths": ["policies"]},
            routing={"failover": {"max_attempts": 2}, "default": {"strategy": "round_robin"}},
        ).model_dump(mode="json", exclude_none=True)
        staged = tmp_path / "gateway.yaml.tmp"
        staged.write_text(yaml.safe_dump(config))
        staged.replace(tmp_path / "gateway.yaml")

    write("1", "eu", (french, "eu-west-3"))
    path = tmp_path / "gateway.yaml"
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    try:
        gateway = Gateway(app, server)
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
            write("2", "ie", (irish, "eu-west-1"))
            until(
                lambda: app.parts.registry.backends["gpu-b"].config.region == "eu-west-1",
                "the reload",
                timeout=30.0,
            )
            release.set()
            response = answer.result(timeout=60)
    finally:
        release.set()
        server.stop()
    assert not french.posts, "the failover reached gpu-b's old server, outside residency [ie]"
    assert not irish.posts  # the request runs on the config it arrived under
    assert response.status_code == 503, response.text
