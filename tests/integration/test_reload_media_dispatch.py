"""A gateway.yaml reload that narrows a private backend's `media_urls` while its
attempt's dispatch record is written: the request's own URL withdrew the attempt, so it
is `refused` for the fallback, never `failed`, also when the attempt's connection had
failed (docs/policies.md, "What unavailable means").

`a`, the only private backend, is up by its health (seen alive, then its probes not
counted) but its server has stopped: its address refuses connections. The request's
image URL is one its `media_urls:` allowed when the request arrived; the reload lands,
by a hook on the dispatch record, after the connection failed and before the attempt
is judged. Before, the connection's failure was what the attempt came to (`failed`),
and under `when_private_unavailable` the request and its URL went to the hosted
provider, which the new config's `media_urls: {remote: none}` was written to prevent.
The completion still says what failed (`a: connect`: a dispatch record that names no
peer passes the pin audit only with such an error, docs/provenance.md). The hosted
backend is a simulator reached through LiteLLM, so nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.api.recorder import Recorder
from gateway.app import create_app
from gateway.config import load_config
from gateway.provenance.keys import write_signing_key
from gateway.serving import ServerThread
from gateway.upstream.http import HttpPool
from tests.helpers.audit_rig import request_log, settled
from tests.helpers.gateways import (
    EU_FALLBACK_POLICY,
    EU_ZERO,
    LITELLM_WARNINGS,
    TENANT_KEY,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.hold import Hold
from tests.helpers.raw_backend import Answer, Post, RawBackend, completion_body
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

ORIGIN = "owngate.test/reload-media-dispatch"
PUBLIC_IMAGE = "https://93.184.216.34/x.png"  # a public literal address
CHAT = {
    "model": "m",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": PUBLIC_IMAGE}},
            ],
        }
    ],
}


def served_then_dropped() -> Answer:
    """`a`: its first request served on a kept-alive connection; each later one gets that
    connection closed without a byte (a server that dropped an idle connection: the
    gateway retries once on a fresh one)."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        count.append(1)
        if len(count) > 1:
            return False
        body = completion_body("private")
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(body) + body)
        await writer.drain()
        return True

    count: list[int] = []
    return answer


class Rig:
    """A logged gateway over `a` (a raw backend) and `hosted`, reloaded by rewriting
    gateway.yaml."""

    def __init__(self, tmp_path: Path, hosted: Sim) -> None:
        self.tmp_path, self.path = tmp_path, tmp_path / "gateway.yaml"
        self.a = RawBackend(served_then_dropped()).start()
        self.a_stopped = False
        self.hosted = hosted
        self.vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "p.yaml").write_text(EU_FALLBACK_POLICY)
        self.server: ServerThread | None = None

    def write(self, media_urls: dict[str, Any]) -> None:
        config: dict[str, Any] = gateway_config(
            [
                backend("a", self.a.url, "m", **EU_ZERO, media_urls=media_urls),
                hosted_backend("hosted", f"{self.hosted.url}/v1", "m"),
            ],
            policy={"paths": ["policies"]},
            health={"failures_to_down": 1000},  # up by its health: it is tried
            provenance={
                "dir": str(self.tmp_path / "log"),
                "origin": ORIGIN,
                "signing_key_file": str(self.tmp_path / "log.key"),
                "checkpoint_interval_ms": 20,
            },
        ).model_dump(mode="json", exclude_none=True)
        staged = self.path.with_suffix(".tmp")
        staged.write_text(yaml.safe_dump(config))
        staged.replace(self.path)

    def start(self) -> None:
        self.write({"remote": "public"})
        self.app = create_app(
            load_config(self.path),
            environ={"HOSTED_KEY": "test-key"},
            config_dir=self.tmp_path,
            config_file=self.path,
        )
        self.server = ServerThread(self.app).start()

    def stop_a(self) -> None:
        """Once `a` was seen alive, stop its server: its probes fail (not counted), a
        connection to it is refused."""
        state = self.app.parts.registry.backends["a"]
        until(lambda: state.probe.alive, "a seen alive by its probes", timeout=30.0)
        self.a.stop()
        self.a_stopped = True

    def narrow(self) -> None:
        """Reload with `a` allowed `data:` media only, and wait until it is active."""
        before = self.app.parts.registry
        self.write({"remote": "none"})
        until(lambda: self.app.parts.registry is not before, "the reload", timeout=30.0)

    def send(self) -> httpx.Response:
        assert self.server is not None
        url = f"{self.server.url}/v1/chat/completions"
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        return httpx.post(url, json=CHAT, headers=headers, timeout=90)

    def records(self, response: httpx.Response) -> list[dict[str, Any]]:
        request_id = response.headers["x-request-id"]
        settled(self.tmp_path / "log", self.vkey, request_id)
        return request_log(self.tmp_path / "log", self.vkey, request_id)


@pytest.fixture
def rig(tmp_path: Path, start_sim: Callable[..., Sim]) -> Iterator[Rig]:
    made = Rig(tmp_path, start_sim("vllm", models=("m",), zero_latency=True))
    yield made
    if made.server is not None:
        made.server.stop()
    if not made.a_stopped:
        made.a.stop()


def test_a_reload_narrowing_media_urls_during_the_dispatch_record_of_a_failed_connection(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.start()
    rig.stop_a()
    hold = Hold(monkeypatch, Recorder, "dispatch", after=True, when=lambda *a: a[4].id == "a")
    response = hold.across(rig.send, rig.narrow)
    assert served(rig.hosted) == 0, "the request and its URL went hosted past a's media_urls"
    assert response.status_code == 503, response.text  # the attempt was dispatched
    records = rig.records(response)
    assert [r["type"] for r in records] == ["dispatch", "completion"]
    completion = records[-1]
    assert (completion["status"], completion["response_commitment"]) == (503, None)
    assert completion["error"] == "a: connect"  # what failed; the reload, what it came to


def test_a_reload_narrowing_media_urls_while_the_attempt_reconnects(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt went out on a kept-alive connection that `a` had dropped: the pool
    reconnects, and the reload (by a hook on that connect) lands meanwhile, as `a` stops.
    The fresh connection is refused: nothing was sent, and the request's URL is what
    withdrew the attempt (before: `connect`, failed, and the request went hosted). The
    completion says what failed on the wire."""
    rig.start()
    warm = rig.send()  # served by a: its connection stays in the pool
    assert warm.status_code == 200, warm.text
    pool = rig.app.parts.registry.backends["a"].pool

    def change() -> None:
        rig.narrow()
        rig.a.stop()
        rig.a_stopped = True

    hold = Hold(monkeypatch, HttpPool, "_connect", when=lambda this: this is pool)
    response = hold.across(rig.send, change)
    assert served(rig.hosted) == 0, "the request and its URL went hosted past a's media_urls"
    assert len(rig.a.posts) == 2  # the warm request, and this one on the dropped connection
    assert response.status_code == 503, response.text
    records = rig.records(response)
    assert [r["type"] for r in records] == ["dispatch", "completion"]
    assert records[-1]["error"] == "a: connect"  # what failed; the reload, what it came to
