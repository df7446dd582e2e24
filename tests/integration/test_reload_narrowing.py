"""A reload that narrows the policy takes effect for every send after it, and the records
of a request decided before it name the set that decided it.

The policy (reloaded from its file every 50 ms) first admits the private `gpu-eu` and,
when it is unavailable, the hosted `hosted-us` (region us-east-1); the reload narrows the
residency. A request held at the private backend across the reload, which then fails
(503, or the connection reset before the first byte), must not fail over to the region
the new set forbids. A reload that lands while an attempt's dispatch record is being
made durable stops that attempt before it sends (before, only a config reload that moved
the backend did: a narrowed policy let the body go to a backend it no longer admits).
Either way the records name the set the request was decided under, and `audit verify`
accepts the log.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.api.recorder import Recorder
from gateway.app import create_app
from gateway.config import load_config
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    TENANT_KEY,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.hold import Hold
from tests.helpers.provenance import records, request_records, run_audit
from tests.helpers.raw_backend import ERROR_BODY, Answer, Post, RawBackend, json_answer
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

ORIGIN = "example.com/reload-narrowing"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [REGIONS]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted-us}]
"""
BODY = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def reset_answer(release: threading.Event) -> Answer:
    """Once `release` is set (60 s at most), the connection reset, no byte answered."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        writer.transport.abort()
        return False

    return answer


class Rig:
    """A logged gateway over the private `private` and the hosted `hosted` (us-east-1),
    its policy admitting residency `eu, us` (version 1)."""

    def __init__(
        self,
        tmp_path: Path,
        start_gateway: Callable[..., Gateway],
        private: RawBackend,
        hosted: Sim,
    ) -> None:
        self.log = tmp_path / "log"
        self.policy = tmp_path / "policies" / "p.yaml"
        self.policy.parent.mkdir()
        self.write("1", "eu, us")
        self.vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
        self.gateway = start_gateway(
            [
                backend("gpu-eu", private.url, "m", **EU_ZERO),
                hosted_backend("hosted-us", f"{hosted.url}/v1", "m", region="us-east-1"),
            ],
            policy={"paths": [str(self.policy.parent)], "reload_interval_s": 0.05},
            environ={"HOSTED_KEY": "test-key"},
            provenance={
                "dir": str(self.log),
                "origin": ORIGIN,
                "signing_key_file": str(tmp_path / "log.key"),
                "checkpoint_interval_ms": 20,
            },
        )
        self.before = self.gateway.app.policies.current.digest

    def write(self, version: str, regions: str) -> None:
        self.policy.write_text(POLICY.replace("VERSION", version).replace("REGIONS", regions))

    def narrow(self, regions: str) -> None:
        """Version 2, residency `regions`, loaded by the running gateway."""
        self.write("2", regions)
        until(
            lambda: self.gateway.app.policies.current.digest != self.before,
            "the narrowing reload",
            timeout=30.0,
        )

    def send(self) -> httpx.Response:
        url = f"{self.gateway.url}/v1/chat/completions"
        return httpx.post(url, json=BODY, headers=self.gateway.headers, timeout=60)

    def records(self, response: httpx.Response) -> list[dict[str, Any]]:
        """The request's records, once a checkpoint covers its completion."""
        request_id = response.headers["x-request-id"]
        request_records(self.log, request_id, "completion")
        return [r for r in records(self.log) if r["request_id"] == request_id]

    def assert_recorded_under_the_first_set(self, response: httpx.Response) -> None:
        """One dispatch, to gpu-eu, under version 1's digest; its completion says the
        status the client got; the log verifies."""
        mine = self.records(response)
        dispatches = [r for r in mine if r["type"] == "dispatch"]
        assert [d["backend"]["id"] for d in dispatches] == ["gpu-eu"], mine
        assert dispatches[0]["policy"]["digest"] == self.before
        assert dispatches[0]["policy"]["version"] == "1"
        completion = mine[-1]
        assert (completion["type"], completion["status"]) == ("completion", 503), mine
        assert completion["response_commitment"] is None
        assert run_audit(["verify", str(self.log), "--key", self.vkey]) == 0


@pytest.mark.parametrize("failure", ["503", "reset"])
def test_a_held_request_never_fails_over_to_a_region_a_reload_took_away(
    failure: str,
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """Held at gpu-eu while the policy narrows to `eu`; gpu-eu then fails before its
    first byte: hosted-us gets nothing, the client 503."""
    release = threading.Event()
    if failure == "503":
        private = start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", release))
    else:
        private = start_raw(reset_answer(release))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    rig = Rig(tmp_path, start_gateway, private, hosted)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(rig.send)
            until(lambda: bool(private.posts), "the private attempt")
            rig.narrow("eu")
            release.set()
            response = pending.result(timeout=60)
    finally:
        release.set()
    assert served(hosted) == 0, "the failover went to a region the reloaded policy forbids"
    assert response.status_code == 503, response.text
    rig.assert_recorded_under_the_first_set(response)


def test_a_policy_narrowed_during_the_dispatch_record_stops_the_attempt_before_it_sends(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gpu-eu's attempt has its connection and its dispatch record is durable when the
    reload narrowing the residency to `ap` (no backend at all) lands: it sends nothing,
    its completion says why, no other backend is tried, the client gets the 503."""
    private = start_raw(json_answer(b"{}"))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    rig = Rig(tmp_path, start_gateway, private, hosted)
    hold = Hold(monkeypatch, Recorder, "dispatch", after=True, when=lambda *a: a[4].id == "gpu-eu")
    response = hold.across(rig.send, lambda: rig.narrow("ap"))
    assert not private.posts, "sent to a private backend the reloaded policy no longer admits"
    assert served(hosted) == 0
    assert response.status_code == 503, response.text
    rig.assert_recorded_under_the_first_set(response)
    error = rig.records(response)[-1]["error"]
    assert error.startswith("gpu-eu: no longer admitted by policy set "), error


def test_a_held_request_never_fails_over_to_a_backend_a_config_reload_removed(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    tmp_path: Path,
) -> None:
    """The same across a gateway.yaml reload that removes hosted-us (the policy files
    unchanged, compiled anew without it): gpu-eu, held across the reload, then fails;
    the removed provider gets nothing, and the records name the set of the config the
    request arrived under."""
    release = threading.Event()
    private = start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", release))
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gpu = backend("gpu-eu", private.url, "m", **EU_ZERO)
    provider = hosted_backend("hosted-us", f"{hosted.url}/v1", "m", region="us-east-1")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        POLICY.replace("VERSION", "1")
        .replace("REGIONS", "eu, us")
        .replace("to: [{backend: hosted-us}]", "to: [{provider: openai}]")
    )
    vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
    path = tmp_path / "gateway.yaml"

    def write(backends: list[dict[str, Any]]) -> None:
        config = gateway_config(
            backends,
            policy={"paths": ["policies"]},
            provenance={
                "dir": "log",
                "origin": ORIGIN,
                "signing_key_file": "log.key",
                "checkpoint_interval_ms": 20,
            },
        ).model_dump(mode="json", exclude_none=True)
        temporary = tmp_path / "gateway.yaml.tmp"
        temporary.write_text(yaml.safe_dump(config))
        temporary.replace(path)

    write([gpu, provider])
    app = create_app(
        load_config(path), environ={"HOSTED_KEY": "k"}, config_dir=tmp_path, config_file=path
    )
    before = app.policies.current.digest
    server = ServerThread(app).start()
    url = f"{server.url}/v1/chat/completions"
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(
                httpx.post,
                url,
                json=BODY,
                headers={"authorization": f"Bearer {TENANT_KEY}"},
                timeout=60,
            )
            until(lambda: bool(private.posts), "the private attempt")
            arrival = app.parts
            write([gpu])
            until(lambda: app.parts is not arrival, "the config reload", timeout=30)
            release.set()
            response = pending.result(timeout=60)
    finally:
        release.set()
        server.stop()
    assert served(hosted) == 0, "the failover went to a provider the reload removed"
    assert response.status_code == 503, response.text
    request_id = response.headers["x-request-id"]
    request_records(tmp_path / "log", request_id, "completion")
    mine = [r for r in records(tmp_path / "log") if r["request_id"] == request_id]
    assert [r["backend"]["id"] for r in mine if r["type"] == "dispatch"] == ["gpu-eu"], mine
    assert mine[0]["policy"]["digest"] == before
    assert run_audit(["verify", str(tmp_path / "log"), "--key", vkey]) == 0
