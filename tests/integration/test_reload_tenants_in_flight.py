"""A key revoked, or given away or stripped of its model by a gateway.yaml reload, while its
request is in flight (waiting for a slot, connecting, failing over, its dispatch record
being made durable): nothing more of the request is sent (docs/security.md, "A reload
reaches requests in flight"; gateway/api/standing.py).

The client gets 401 `invalid_api_key` (404 `model_not_found` for a model taken away) and
the log says so: a refusal record when nothing was dispatched, else the completion record
of the attempt that was (the status the client got). Backend `a` is a scripted raw backend
that holds each request until the test lets it go, then closes it unanswered (a failure:
the plan goes on to the hosted fallback, a simulator reached through LiteLLM).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.api.passthrough import PrivateRelay
from gateway.api.recorder import Recorder
from gateway.app import create_app
from gateway.config import load_config
from gateway.provenance import write_signing_key
from gateway.routing.router import Router
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    EU_ZERO,
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    OTHER_KEY,
    TENANT_KEY,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.hold import Hold
from tests.helpers.log_truth import ORIGIN
from tests.helpers.provenance import request_records
from tests.helpers.raw_backend import Post, RawBackend
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

ACME = {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}
BETA = {"id": "beta", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["*"]}
# acme may fall back to `hosted`; beta may not.
POLICIES = (
    HOSTED_ONLY_POLICY
    + """\
---
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: strict, version: "1"}
spec:
  tenants: [beta]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback: {mode: never}
"""
)
GOOD = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Rig:
    """A gateway served from `path` (reloaded when the file changes) with its log on."""

    path: Path
    backends: list[dict[str, Any]]
    a: RawBackend
    hosted: Sim
    released: threading.Event  # `a` lets its held requests go (and fails them)
    app: Any = None
    server: ServerThread | None = None

    def write(self, tenants: list[dict[str, Any]]) -> None:
        log = self.path.parent
        config = gateway_config(
            self.backends,
            tenants=tenants,
            policy={"paths": ["policies"]},
            provenance={
                "dir": "log",
                "origin": ORIGIN,
                "signing_key_file": "log.key",
                "checkpoint_interval_ms": 20,
            },
            routing={"default": {"strategy": "round_robin"}},
        ).model_dump(mode="json", exclude_none=True)
        temporary = log / "gateway.yaml.tmp"
        temporary.write_text(yaml.safe_dump(config))
        temporary.replace(self.path)  # atomic, as a deploy tool writes it

    def reload(self, tenants: list[dict[str, Any]]) -> None:
        arrival = self.app.parts
        self.write(tenants)
        until(lambda: self.app.parts is not arrival, "the config reload", timeout=30)

    def revoke(self) -> None:  # what the admin API and `owngate keys revoke` do here
        assert asyncio.run(self.app.parts.state.revoke_key(hash_api_key(TENANT_KEY)))

    def post(self) -> httpx.Response:
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        url = f"{self.server.url}/v1/chat/completions" if self.server else ""
        return httpx.post(url, json=GOOD, headers=headers, timeout=120)  # imports LiteLLM

    def records(self, response: httpx.Response, last: str) -> list[dict[str, Any]]:
        """The request's records, once a signed checkpoint covers its `last` one."""
        request_id, log = response.headers["x-request-id"], self.path.parent / "log"
        request_records(log, request_id, last, within_s=30)
        return request_records(log, request_id)


@pytest.fixture
def rig(start_raw: Any, start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Rig]:
    released = threading.Event()

    async def hold_then_close(_writer: asyncio.StreamWriter, _post: Post) -> bool:
        await until_async(released.is_set, "the test to let `a` fail", timeout=60)
        return False

    a: RawBackend = start_raw(hold_then_close)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    backends = [
        backend("a", a.url, "m", "n", **EU_ZERO),
        hosted_backend("hosted", f"{hosted.url}/v1", "m"),
    ]
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "policies.yaml").write_text(POLICIES)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    rig = Rig(tmp_path / "gateway.yaml", backends, a, hosted, released)
    rig.write([ACME, BETA])
    rig.app = create_app(
        load_config(rig.path),
        environ={"HOSTED_KEY": "k"},
        config_dir=tmp_path,
        config_file=rig.path,
    )
    rig.server = ServerThread(rig.app).start()
    try:
        yield rig
    finally:
        released.set()
        rig.server.stop()


def refused_401(rig: Rig, response: httpx.Response) -> None:
    """Refused with 401 before anything was dispatched: no backend saw the request, and
    its one record is a refusal saying why."""
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key", error
    assert error["type"] == "invalid_request_error", error
    assert "revoked while the request was in flight" in error["message"], error
    assert rig.a.posts == [] and served(rig.hosted) == 0
    found = rig.records(response, "refusal")
    assert [r["type"] for r in found] == ["refusal"], found
    assert (found[0]["reason"], found[0]["rule"]) == ("invalid_api_key", "owngate/tenant")


def test_a_key_revoked_while_its_request_waits_for_a_slot_is_refused(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held where the plan is made (a saturated pool's queue waits there): the key is
    # revoked, then the plan's first attempt comes.
    rig.released.set()  # `a` fails at once: without the check, the hosted fallback served
    hold = Hold(monkeypatch, Router, "plan")
    refused_401(rig, hold.across(rig.post, rig.revoke))


def test_a_key_revoked_while_its_attempt_connects_is_refused(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.released.set()
    hold = Hold(monkeypatch, PrivateRelay, "connect")
    refused_401(rig, hold.across(rig.post, rig.revoke))


def test_a_key_revoked_while_its_dispatch_record_is_written_sends_nothing(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dispatch record is durable; the key is revoked before the attempt sends: nothing
    # is sent, and the dispatch is completed with the 401 the client gets.
    rig.released.set()
    hold = Hold(monkeypatch, Recorder, "dispatch", after=True)
    response = hold.across(rig.post, rig.revoke)
    found = dispatched_to_a_alone(rig, response, 401, "invalid_api_key", sent=0)
    assert found[1]["response_commitment"] is None


def failing_over(rig: Rig, change: Callable[[], None]) -> httpx.Response:
    """Post; while `a` holds the request, `change()`; then `a` fails it."""
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(rig.post)
            until(lambda: len(rig.a.posts) == 1, "the request held by `a`", timeout=30)
            change()
            rig.released.set()
            return pending.result(timeout=120)
    finally:
        rig.released.set()


def dispatched_to_a_alone(
    rig: Rig, response: httpx.Response, status: int, code: str, *, sent: int = 1
) -> list[dict[str, Any]]:
    """`a` was dispatched to (`sent` requests reached it, then it failed them); the hosted
    fallback was not: the client got `status` `code`, which the completion of a's
    dispatch (the last record) holds."""
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert len(rig.a.posts) == sent and served(rig.hosted) == 0
    found = rig.records(response, "completion")
    assert [r["type"] for r in found] == ["dispatch", "completion"], found
    assert found[0]["backend"]["id"] == "a"
    assert (found[1]["status"], found[1]["error"]) == (status, code)
    return found


def test_a_key_revoked_between_failover_attempts_reaches_no_fallback(rig: Rig) -> None:
    response = failing_over(rig, rig.revoke)
    dispatched_to_a_alone(rig, response, 401, "invalid_api_key")


def test_a_reload_giving_the_key_to_a_stricter_tenant_reaches_no_fallback(rig: Rig) -> None:
    # The key is beta's now, whose policy forbids the hosted fallback: the request,
    # admitted and decided as acme's, must not fall back under acme's policy.
    moved = {**BETA, "api_key_hashes": [*BETA["api_key_hashes"], hash_api_key(TENANT_KEY)]}
    response = failing_over(rig, lambda: rig.reload([{**ACME, "api_key_hashes": []}, moved]))
    dispatched_to_a_alone(rig, response, 401, "invalid_api_key")


def test_a_reload_taking_the_model_from_the_tenant_reaches_no_fallback(rig: Rig) -> None:
    response = failing_over(rig, lambda: rig.reload([{**ACME, "models": ["n"]}, BETA]))
    dispatched_to_a_alone(rig, response, 404, "model_not_found")
