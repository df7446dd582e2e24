"""A gateway.yaml reload that moves a backend or changes how it is trusted reaches a
request in flight.

A request runs on the config it arrived under, its backends' addresses and TLS settings
included. When a reload gives `gpu-b` another `base_url`, or other TLS trust (a pin
rotated, a CA replaced), with the same declared facts, a failover of a request planned
before it would go to the old address under the old trust: the very address or key the
operator stopped trusting (a box decommissioned and its IP given away, a key leaked).
The attempt is skipped instead (no record, nothing sent, not even a connection), as one
on a redeclared backend is (tests/integration/test_reload_declared_facts.py); requests
that arrive after the reload go to the new address, and their dispatch records name the
key the new connection authenticated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.api.app import GatewayApp
from gateway.api.recorder import Recorder
from gateway.app import create_app
from gateway.config import load_config
from gateway.provenance.keys import write_signing_key
from gateway.routing.router import Router
from gateway.serving import ServerThread
from tests.helpers.audit_rig import ANSWER, request_log, settled
from tests.helpers.gateways import (
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
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer
from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.tls_fixtures import pki, sim, start_front
from tests.helpers.waiting import until

__all__ = ["pki", "sim", "start_front"]  # fixtures, used by name
pytestmark = LITELLM_WARNINGS

BODY = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"authorization": f"Bearer {TENANT_KEY}"}
ORIGIN = "owngate.test/reload-reach"
FALLBACK_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted}]}
"""


def first_503_then_held(release: threading.Event) -> Answer:
    """`gpu-a`: its first request answered 503 at once (it fails over to `gpu-b`, which
    pools the connection), every later one 503 once `release` is set (60 s at most)."""

    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        if answered:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        answered.append(post)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    answered: list[Post] = []
    return answer


class Rig:
    """A logged gateway (round robin, 2 attempts) over `gpu-a` (a raw backend) and
    `gpu-b`, reloaded by rewriting gateway.yaml."""

    def __init__(self, tmp_path: Path, start_raw: Callable[[Answer], RawBackend]) -> None:
        self.release = threading.Event()  # lets gpu-a answer the held request
        self.gpu_a = start_raw(first_503_then_held(self.release))
        self.tmp_path = tmp_path
        self.hosted: list[dict[str, Any]] = []  # hosted backends beside gpu-a and gpu-b
        self.policy: dict[str, Any] = {}  # the `policy` section, if any
        self.vkey = write_signing_key(tmp_path / "log.key", ORIGIN)
        self.path = tmp_path / "gateway.yaml"
        self.app: GatewayApp | None = None
        self.server: ServerThread | None = None

    def write(self, gpu_b: dict[str, Any]) -> None:
        config: dict[str, Any] = gateway_config(
            [backend("gpu-a", self.gpu_a.url, "m", **EU_ZERO), gpu_b, *self.hosted],
            **({"policy": self.policy} if self.policy else {}),
            routing={"failover": {"max_attempts": 2}, "default": {"strategy": "round_robin"}},
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

    def start(self, gpu_b: dict[str, Any]) -> None:
        self.write(gpu_b)
        self.app = create_app(
            load_config(self.path),
            environ={"HOSTED_KEY": "test-key"},
            config_dir=self.tmp_path,
            config_file=self.path,
        )
        self.server = ServerThread(self.app).start()

    def reload(self, gpu_b: dict[str, Any]) -> None:
        """Install `gpu_b` by the file poll, and wait until it is active."""
        app = self.app
        assert app is not None
        before = app.parts.registry
        self.write(gpu_b)
        until(lambda: app.parts.registry is not before, "the reload", timeout=30.0)

    def records(self, response: httpx.Response) -> list[dict[str, Any]]:
        request_id = response.headers["x-request-id"]
        settled(self.tmp_path / "log", self.vkey, request_id)
        return request_log(self.tmp_path / "log", self.vkey, request_id)

    def send(self) -> httpx.Response:
        assert self.server is not None
        url = f"{self.server.url}/v1/chat/completions"
        return httpx.post(url, json=BODY, headers=HEADERS, timeout=90)

    def warm(self) -> list[httpx.Response]:
        """Two requests gpu-b serves: the first fails over from gpu-a, the second goes to
        gpu-b first (round robin); gpu-b's pool keeps the connection idle."""
        warm = [self.send(), self.send()]
        assert [r.status_code for r in warm] == [200, 200], [r.text for r in warm]
        return warm

    def held_across_reload(self, gpu_b: dict[str, Any]) -> httpx.Response:
        """A request held at gpu-a (round robin) while gateway.yaml is reloaded with
        `gpu_b`; released, it fails over. What it came to."""
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(self.send)
            until(lambda: len(self.gpu_a.posts) == 2, "the third request, held at gpu-a")
            self.reload(gpu_b)
            self.release.set()
            return answer.result(timeout=60)

    def until_up(self, backend_id: str) -> None:
        app = self.app
        assert app is not None
        registry = app.parts.registry
        state = registry.backends[backend_id]
        until(lambda: not registry.is_down(state), f"{backend_id} up again", timeout=60)

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def rig(tmp_path: Path, start_raw: Callable[[Answer], RawBackend]) -> Iterator[Rig]:
    made = Rig(tmp_path, start_raw)
    yield made
    made.stop()


def dispatched_to(records: list[dict[str, Any]]) -> list[str]:
    return [r["backend"]["id"] for r in records if r["type"] == "dispatch"]


def gpu_b_keys(records: list[dict[str, Any]]) -> list[str | None]:
    """The key gpu-b's connection presented, as each dispatch record to gpu-b names it."""
    dispatched = [r["backend"] for r in records if r["type"] == "dispatch"]
    return [b.get("peer", {}).get("spki_sha256") for b in dispatched if b["id"] == "gpu-b"]


def test_a_failover_never_reaches_the_old_address_of_a_moved_backend(
    rig: Rig, start_raw: Callable[[Answer], RawBackend]
) -> None:
    old, new = start_raw(json_answer(ANSWER)), start_raw(json_answer(ANSWER))  # gpu-b's boxes
    rig.start(backend("gpu-b", old.url, "m", **EU_ZERO))
    rig.warm()
    response = rig.held_across_reload(backend("gpu-b", new.url, "m", **EU_ZERO))
    assert len(old.posts) == 2, "the failover reached gpu-b's old address"
    assert not new.posts  # the request runs on the config it arrived under
    assert response.status_code == 503, response.text
    assert dispatched_to(rig.records(response)) == ["gpu-a"]
    after = rig.send()  # a new request (gpu-a first, round robin anew): the new box
    assert after.status_code == 200, after.text
    assert (len(old.posts), len(new.posts)) == (2, 1)
    assert dispatched_to(rig.records(after))[-1] == "gpu-b"


def test_a_moved_backend_was_not_shown_unavailable_to_a_hosted_fallback(
    rig: Rig, start_raw: Callable[[Answer], RawBackend], start_sim: Callable[..., Sim]
) -> None:
    """`when_private_unavailable`: gpu-a failed, gpu-b was skipped as moved. gpu-b at its
    new address was never tried, so the request may not go hosted for it (as for a
    redeclared backend): the fallback is withheld, the client gets gpu-a's 503."""
    provider = with_hosted_fallback(rig, start_sim)
    old, new = start_raw(json_answer(ANSWER)), start_raw(json_answer(ANSWER))
    rig.start(backend("gpu-b", old.url, "m", **EU_ZERO))
    rig.warm()
    response = rig.held_across_reload(backend("gpu-b", new.url, "m", **EU_ZERO))
    assert len(old.posts) == 2 and not new.posts
    assert served(provider) == 0, "a hosted fallback for a private backend never tried"
    assert response.status_code == 503, response.text
    assert dispatched_to(rig.records(response)) == ["gpu-a"]


def with_hosted_fallback(rig: Rig, start_sim: Callable[..., Sim]) -> Sim:
    """`rig` under FALLBACK_POLICY, its hosted backend a simulator (returned)."""
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    policies = rig.tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(FALLBACK_POLICY)
    rig.policy = {"paths": ["policies"]}
    rig.hosted = [hosted_backend("hosted", f"{provider.url}/v1", "m")]
    return provider


@pytest.mark.parametrize("where", ["routed", "recorded"])
def test_a_move_undone_before_the_fallback_leaves_the_backend_retired(
    rig: Rig,
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A reload moves gpu-b between routing and its turn (`routed`: skipped), or while its
    dispatch record is written (`recorded`: it fails before it sends, its completion
    saying why), and a second reload moves it back while gpu-a holds the request; gpu-a
    then fails. gpu-b was sent nothing: the operator's config change is not gpu-b
    failing, so under `when_private_unavailable` the request may not go hosted for it,
    as for a rebuild at the same address (`retired`,
    tests/integration/test_fallback_retired_pool.py). Before, the move counted `down`
    (routed) or `failed` (recorded): once it was undone nothing left gpu-b out of the
    fallback's basis, and the hosted provider served, its dispatch record saying so."""
    provider = with_hosted_fallback(rig, start_sim)
    old, new = start_raw(json_answer(ANSWER)), start_raw(json_answer(ANSWER))
    rig.start(backend("gpu-b", old.url, "m", **EU_ZERO))
    first = rig.send()  # gpu-a fails it at once, gpu-b serves; the next starts at gpu-b
    assert first.status_code == 200, first.text
    if where == "routed":
        hold = Hold(monkeypatch, Router, "plan", after=True)
    else:
        at_b: Callable[..., bool] = lambda *a: a[4].id == "gpu-b"  # noqa: E731
        hold = Hold(monkeypatch, Recorder, "dispatch", after=True, when=at_b)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(rig.send)
        until(hold.entered.is_set, "the request routed", timeout=30)
        rig.reload(backend("gpu-b", new.url, "m", **EU_ZERO))
        hold.released.set()
        until(lambda: len(rig.gpu_a.posts) == 2, "the request held at gpu-a", timeout=30)
        rig.reload(backend("gpu-b", old.url, "m", **EU_ZERO))  # the move undone
        rig.release.set()
        response = pending.result(timeout=60)
    assert served(provider) == 0, "a hosted fallback for a private backend never tried"
    assert (len(old.posts), len(new.posts)) == (1, 0)
    assert response.status_code == 503, response.text
    records = rig.records(response)
    if where == "routed":
        assert dispatched_to(records) == ["gpu-a"]
    else:
        assert dispatched_to(records) == ["gpu-b", "gpu-a"]
        moved = next(r for r in records if r["type"] == "completion")
        assert (moved["status"], moved["response_commitment"]) == (503, None), moved
        assert moved["error"] == "gpu-b: its address or TLS settings changed by a config reload"


def test_a_reload_during_the_dispatch_record_stops_the_attempt_before_it_sends(
    rig: Rig, start_raw: Callable[[Answer], RawBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu-a fails at once; gpu-b's attempt has its connection (to the old address) and
    its dispatch record is durable when the reload moving gpu-b lands: it sends nothing
    on it, its completion says why, and the client gets the 503."""
    old, new = start_raw(json_answer(ANSWER)), start_raw(json_answer(ANSWER))
    rig.start(backend("gpu-b", old.url, "m", **EU_ZERO))
    hold = Hold(monkeypatch, Recorder, "dispatch", after=True, when=lambda *a: a[4].id == "gpu-b")
    response = hold.across(rig.send, lambda: rig.reload(backend("gpu-b", new.url, "m", **EU_ZERO)))
    assert not old.posts, "sent to gpu-b's old address after the reload"
    assert not new.posts
    assert response.status_code == 503, response.text
    records = rig.records(response)
    assert dispatched_to(records) == ["gpu-a", "gpu-b"]
    last = records[-1]
    assert (last["type"], last["status"]) == ("completion", 503), last
    assert last["error"] == "gpu-b: its address or TLS settings changed by a config reload"
    assert last["response_commitment"] is None


def tls_backend(front: TLSFront, *pins: str) -> dict[str, Any]:
    tls: dict[str, Any] = {"ca_file": "ca.pem"}
    if pins:
        tls["pin_spki_sha256"] = list(pins)
    return backend("gpu-b", front.url, "m", kind="openai", tls=tls, **EU_ZERO)


def test_a_failover_never_reuses_a_pooled_connection_to_the_old_address_of_a_moved_backend(
    rig: Rig, pki: Pki, sim: Sim, start_front: Callable[[Any], TLSFront], tmp_path: Path
) -> None:
    """The same TLS settings at another address: nothing about the old pool's idle
    connection (to the old address) is refused by them, so it was reused."""
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem)
    a = pki.server()
    old, new = start_front(server_context(pki, a)), start_front(server_context(pki, a))
    rig.start(tls_backend(old, a.pin))
    rig.warm()
    response = rig.held_across_reload(tls_backend(new, a.pin))
    assert response.status_code == 503, response.text  # 200: the old address served it
    assert dispatched_to(rig.records(response)) == ["gpu-a"]
    assert new.handshakes == 0  # nor the new address: the request's plan was not about it
    handshakes = old.handshakes
    after = rig.send()
    assert after.status_code == 200, after.text
    assert new.handshakes == 1 and old.handshakes == handshakes
    assert gpu_b_keys(rig.records(after)) == [a.pin]


def test_a_failover_never_connects_to_a_backend_whose_pin_a_reload_rotated(
    rig: Rig, pki: Pki, sim: Sim, start_front: Callable[[Any], TLSFront], tmp_path: Path
) -> None:
    """Key A leaked: the operator pins key B. The server at gpu-b's address still presents
    A (it may be anyone's now); a request running at the reload does not connect to it,
    its client certificate and server name are not shown there, and no dispatch record
    names gpu-b for it. A new request's record names the key its connection presented."""
    (tmp_path / "ca.pem").write_bytes(pki.ca.cert_pem)
    a, b = pki.server(), pki.server()
    front = start_front(server_context(pki, a))
    rig.start(tls_backend(front, a.pin))
    warm = rig.warm()
    assert gpu_b_keys(rig.records(warm[1])) == [a.pin]
    handshakes = front.handshakes
    response = rig.held_across_reload(tls_backend(front, b.pin))
    assert response.status_code == 503, response.text
    assert dispatched_to(rig.records(response)) == ["gpu-a"], "a record for gpu-b's old key"
    assert front.handshakes == handshakes, "a connection to gpu-b under the withdrawn key"
    # A new request while the address still presents key A: the connection the warm-up
    # requests left idle (authenticated under A) is not reused, a new one is refused.
    stale = rig.send()
    assert stale.status_code == 503, stale.text
    assert gpu_b_keys(rig.records(stale)) == [None]  # tried, no key accepted
    front.swap(server_context(pki, b))  # the backend now presents key B
    rig.until_up("gpu-b")  # its breaker, opened by the refused key, lets a probe through
    after = rig.send()
    assert after.status_code == 200, after.text
    assert gpu_b_keys(rig.records(after)) == [b.pin]


def kept_alive_then_closed_at(third: int, release: threading.Event) -> Answer:
    """`gpu-b`'s old box: its answers keep the connection open, but post number `third`
    (counting from 1) gets none: once `release` is set (60 s at most), the box closes that
    connection without a byte, as a server that dropped an idle connection does."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        count.append(1)
        if len(count) == third:
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
            return False  # closed, nothing answered: the gateway may retry it fresh
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(ANSWER) + ANSWER)
        await writer.drain()
        return True

    count: list[int] = []
    return answer


def test_a_retry_on_a_fresh_connection_never_reaches_the_old_address_of_a_moved_backend(
    rig: Rig, start_raw: Callable[[Answer], RawBackend]
) -> None:
    """gpu-b's attempt went out on a pooled connection before the reload; the reload moving
    gpu-b lands while its old box holds it, and the box then closes that connection
    without answering. The pool would retry once on a fresh connection: not to the old
    address, which the request may no longer reach, and not to the new one either."""
    rig.release.set()  # gpu-a answers 503 at once: every request fails over to gpu-b
    dropped = threading.Event()
    old = start_raw(kept_alive_then_closed_at(3, dropped))
    new = start_raw(json_answer(ANSWER))
    rig.start(backend("gpu-b", old.url, "m", **EU_ZERO))
    rig.warm()  # gpu-b's connection to its old box stays open in its pool
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(rig.send)
        until(lambda: len(old.posts) == 3, "the request at gpu-b's old box")
        rig.reload(backend("gpu-b", new.url, "m", **EU_ZERO))
        dropped.set()
        response = pending.result(timeout=60)
    assert len(old.posts) == 3, "the retry reached gpu-b's old address after the reload"
    assert not new.posts
    assert response.status_code == 503, response.text
    records = rig.records(response)
    assert dispatched_to(records) == ["gpu-a", "gpu-b"]
    last = records[-1]
    assert (last["type"], last["status"]) == ("completion", 503), last
    assert last["error"] == "gpu-b: its address or TLS settings changed by a config reload"
