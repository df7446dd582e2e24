"""A policy reload that withdraws a private backend from a request in flight, undone by a
later reload before the request's hosted fallback, does not let the request go hosted.

The policy (reloaded from its file every 50 ms) admits the private `gpu-a` and `gpu-b`
and, when they are unavailable, the hosted `hosted`. A request is held at `gpu-a`
(round robin: first); version 2 of the policy denies `gpu-b`, so `gpu-b`'s attempt is
withdrawn, before its turn or while its dispatch record is written (nothing sent: "down"
for version 2, which judges the fallback without it);
`gpu-a` then fails, and while the hosted attempt is checked, version 3 admits `gpu-b`
again. Version 3 judges the fallback, and `gpu-b`, which it admits, was never tried: it
was not shown unavailable, so the fallback is withheld and the client gets `gpu-a`'s
503 (as for a move undone: tests/integration/test_reload_backend_reach.py). Before,
the withdrawal stayed "down" in the fallback's basis and the hosted provider served.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.api.hosted_relay import HostedRelay
from gateway.api.recorder import Recorder
from gateway.provenance.keys import write_signing_key
from tests.helpers.audit_rig import ANSWER
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    served,
)
from tests.helpers.hold import Hold
from tests.helpers.provenance import records, request_records
from tests.helpers.raw_backend import Answer, Post, RawBackend, json_answer
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  backends: {deny: [DENIED]}
  fallback: {mode: when_private_unavailable, to: [{backend: hosted}]}
"""
ORIGIN = "owngate.test/policy-withdrawal-undone"
BODY = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def held_then_503(release: threading.Event) -> Answer:
    """503 once `release` is set (60 s at most)."""

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        return False

    return answer


@pytest.mark.parametrize("where", ["turn", "record"])
def test_a_policy_withdrawal_undone_before_the_fallback_withholds_it(
    where: str,
    tmp_path: Path,
    start_gateway: Callable[..., Gateway],
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    gpu_a, gpu_b = start_raw(held_then_503(release)), start_raw(json_answer(ANSWER))
    provider = start_sim("vllm", models=("m",), zero_latency=True)
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()

    def write(version: str, denied: str) -> None:
        policy.write_text(POLICY.replace("VERSION", version).replace("DENIED", denied))

    write("1", "nothing")
    write_signing_key(tmp_path / "log.key", ORIGIN)
    gateway = start_gateway(
        [
            backend("gpu-a", gpu_a.url, "m", **EU_ZERO),
            backend("gpu-b", gpu_b.url, "m", **EU_ZERO),
            hosted_backend("hosted", f"{provider.url}/v1", "m"),
        ],
        policy={"paths": [str(policy.parent)], "reload_interval_s": 0.05},
        routing={"failover": {"max_attempts": 2}, "default": {"strategy": "round_robin"}},
        environ={"HOSTED_KEY": "test-key"},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": ORIGIN,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
    )

    def reload(version: str, denied: str) -> None:
        before = gateway.app.policies.current.digest
        write(version, denied)
        until(lambda: gateway.app.policies.current.digest != before, "the reload", timeout=30)

    at_b: Callable[..., bool] = lambda *a: a[4].id == "gpu-b"  # noqa: E731
    record = Hold(monkeypatch, Recorder, "dispatch", after=True, when=at_b)
    hold = Hold(monkeypatch, HostedRelay, "prepare")  # the hosted attempt, being checked
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            url = f"{gateway.url}/v1/chat/completions"
            pending = pool.submit(httpx.post, url, json=BODY, headers=gateway.headers, timeout=90)
            until(lambda: len(gpu_a.posts) == 1, "the request held at gpu-a", timeout=30)
            if where == "turn":  # gpu-b withdrawn before its turn: skipped
                reload("2", "gpu-b")
                record.released.set()
            release.set()  # gpu-a fails
            if where == "record":  # withdrawn while its dispatch record is written
                until(record.entered.is_set, "gpu-b's dispatch record", timeout=30)
                reload("2", "gpu-b")
                record.released.set()
            until(hold.entered.is_set, "the hosted fallback checked", timeout=30)
            reload("3", "nothing")  # gpu-b admitted again, never tried
            hold.released.set()
            response = pending.result(timeout=60)
    finally:
        release.set()
        record.released.set()
        hold.released.set()
    assert not gpu_b.posts
    assert served(provider) == 0, "a hosted fallback for a private backend never tried"
    assert response.status_code == 503, response.text
    request_id = response.headers["x-request-id"]
    request_records(tmp_path / "log", request_id, "completion")
    mine = [r for r in records(tmp_path / "log") if r["request_id"] == request_id]
    dispatched = [r["backend"]["id"] for r in mine if r["type"] == "dispatch"]
    assert dispatched == (["gpu-a"] if where == "turn" else ["gpu-a", "gpu-b"]), mine
