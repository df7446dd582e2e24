"""An attempt that sends nothing has no dispatch record, and the last record of the
request still holds what its client got (docs/provenance.md, "What the client saw").

Such attempts: a hosted one whose request the provider's checks refuse before anything
is sent (its shape, fields, media URLs: gateway/upstream/hosted.py
`HostedClient.prepare`, run before the dispatch record); a hosted one for which LiteLLM
does not load (also in `prepare`); a private one that a policy reload withdrew while the
request was failing over (its fallback's `fallback_basis` says "down", not "failed": no
dispatch or completion record of it precedes); and one a reload withdrew while it
connected or was checked, after its turn came but before its dispatch record.

Private backends are scripted raw backends (their `/health` answers 200); the hosted one
is a simulator reached through LiteLLM's OpenAI adapter, so nothing leaves loopback.
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
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.passthrough import PrivateRelay
from gateway.upstream import hosted_prepare
from gateway.upstream.hosted import HostedClient
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_gateway,
    served,
)
from tests.helpers.hold import Hold
from tests.helpers.log_truth import ORIGIN
from tests.helpers.provenance import records
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until, until_async

pytestmark = LITELLM_WARNINGS

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: eu, version: "{version}"}}
spec:
  tenants: [acme]
  residency: {{allow: [{regions}]}}
  retention: {{max_days: zero}}
  fallback:
    mode: when_private_unavailable
    to: [{{backend: hosted}}]
"""
USER = {"role": "user", "content": "hi"}
# A shape every hosted provider's checks refuse (openai_shapes.py): a bare-string
# tool_choice other than none/auto/required.
MALFORMED = {"model": "m", "messages": [USER], "tool_choice": "function"}
INTERNAL_IMAGE = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/secret.png"}}
# Requests refused before sending, and the field each 400 names: a malformed shape, a
# field that would have the provider keep the prompt (hosted_fields.py), a content-part
# URL on the gateway's own network (media_urls.py).
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "shape": (MALFORMED, "tool_choice"),
    "provider action": ({"model": "m", "messages": [USER], "store": True}, "store"),
    "internal media URL": (
        {"model": "m", "messages": [{"role": "user", "content": [INTERNAL_IMAGE]}]},
        "messages[0].content[0]",
    ),
}
GOOD = {"model": "m", "messages": [USER]}


async def close_unanswered(_writer: asyncio.StreamWriter, _post: Post) -> bool:
    return False  # closed, no answer: a failure before the client saw a byte


def start(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    private: list[dict[str, Any]],
    hosted: Sim,
    regions: str = "eu",
) -> Gateway:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "policy.yaml").write_text(POLICY.format(version="1", regions=regions))
    return logged_gateway(
        start_gateway,
        tmp_path,
        [*private, hosted_backend("hosted", f"{hosted.url}/v1", "m")],
        ORIGIN,
        policy={"paths": [str(policies)]},
        routing={"default": {"strategy": "round_robin"}},
        environ={"HOSTED_KEY": "k"},
    )


def post(gateway: Gateway, doc: dict[str, Any]) -> httpx.Response:
    url = f"{gateway.url}/v1/chat/completions"
    return httpx.post(url, json=doc, headers=gateway.headers, timeout=120)  # imports LiteLLM


CALLS = "owngate_hosted_attempts_total"


def calls_made(gateway: Gateway) -> float:
    """`owngate_hosted_attempts_total` of the backend `hosted`: the calls made to it."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name, sample.labels.get("backend")) == (CALLS, "hosted"):
                return sample.value
    return 0.0


async def broken_load() -> Any:
    raise ImportError("No module named 'litellm.proxy_internals'")  # a broken install


def reload_policy(gateway: Gateway, tmp_path: Path, version: str, regions: str) -> None:
    (tmp_path / "policies" / "policy.yaml").write_text(
        POLICY.format(version=version, regions=regions)
    )
    assert gateway.app.policies.reload()


def request_log(tmp_path: Path, gateway: Gateway, response: httpx.Response) -> list[dict[str, Any]]:
    """Every record of `response`'s request: read once a signed checkpoint covers the
    completion of a later request that the hosted fallback served (records are appended
    in order, and all of a request's are before its client has the answer)."""
    later = post(gateway, GOOD)
    assert later.status_code == 200, later.text
    later_id, log = later.headers["x-request-id"], tmp_path / "log"

    def covered() -> bool:
        return any(
            r["request_id"] == later_id and r["type"] == "completion" and r["status"] == 200
            for r in records(log)
        )

    until(covered, f"the signed completion of {later_id}", timeout=30, interval=0.02)
    request_id = response.headers["x-request-id"]
    return [r for r in records(log) if r["request_id"] == request_id]


@pytest.mark.parametrize("refused", list(REFUSED))
def test_a_hosted_request_refused_before_sending_has_a_refusal_record_not_a_dispatch(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    refused: str,
) -> None:
    doc, param = REFUSED[refused]
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start(start_gateway, tmp_path, [], hosted)  # the hosted tier only
    response = post(gateway, doc)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert "not sent" in error["message"], error["message"]
    assert served(hosted) == 0
    assert response.headers.get("x-owngate-receipt")  # the refusal's receipt
    found = request_log(tmp_path, gateway, response)  # a well-formed one follows, served
    # Nothing was sent anywhere: no dispatch record; the refusal says what the client got.
    assert [r["type"] for r in found] == ["refusal"], found
    assert found[0]["reason"] == "upstream_bad_request"
    assert found[0]["rule"] == "owngate/hosted_request"
    assert served(hosted) == 1  # the well-formed one


def test_a_hosted_fallback_refused_before_sending_leaves_the_failed_attempt_last(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # `a` fails the request; the fallback's checks refuse it, so the provider is not
    # tried: the client gets a's failure, which a's completion (the last record) holds.
    raw = start_raw(close_unanswered)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start(start_gateway, tmp_path, [backend("a", raw.url, "m", **EU_ZERO)], hosted)
    response = post(gateway, MALFORMED)
    assert len(raw.posts) == 1 and served(hosted) == 0
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_unavailable"
    # What each backend came to is the operator's: the client's 503 names none of them.
    assert "hosted" not in error["message"] and "openai" not in error["message"], error
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["dispatch", "completion"], found
    assert found[0]["backend"]["id"] == "a"
    assert found[-1]["status"] == response.status_code


def test_a_private_backend_withdrawn_by_a_reload_is_down_in_the_fallback_basis(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # `a` holds the request while the policy is reloaded without `b` (its region is no
    # longer allowed), then fails it: `b` is not tried, the hosted fallback serves.
    released = threading.Event()

    async def hold_then_close(_writer: asyncio.StreamWriter, _post: Post) -> bool:
        await until_async(released.is_set, "the test to let `a` fail", timeout=60)
        return False

    a, b = start_raw(hold_then_close), start_raw(close_unanswered)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    us = {**EU_ZERO, "region": "us-east-1"}
    private = [backend("a", a.url, "m", **EU_ZERO), backend("b", b.url, "m", **us)]
    gateway = start(start_gateway, tmp_path, private, hosted, regions="eu, us")
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(post, gateway, GOOD)
            until(lambda: len(a.posts) == 1, "the request held by `a`", timeout=30)
            policy = POLICY.format(version="2", regions="eu")
            (tmp_path / "policies" / "policy.yaml").write_text(policy)
            assert gateway.app.policies.reload()
            released.set()
            response = pending.result(timeout=120)
    finally:
        released.set()
    assert response.status_code == 200, response.text
    assert len(b.posts) == 0 and served(hosted) == 1
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["dispatch", "completion"] * 2, found
    assert [r["backend"]["id"] for r in found if r["type"] == "dispatch"] == ["a", "hosted"]
    fallback = found[2]
    assert fallback["fallback"] == "private_unavailable"
    # `b` was never tried (no record of it): "down", where "failed" would name records.
    assert fallback["fallback_basis"] == [
        {"backend": "a", "state": "failed"},
        {"backend": "b", "state": "down"},
    ]


def test_litellm_that_fails_to_load_has_a_refusal_record_not_a_dispatch(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing can be sent (LiteLLM does not load): no dispatch record saying the request
    # went to the provider, no call counted; the client's 503 has a refusal record.
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start(start_gateway, tmp_path, [], hosted)  # the hosted tier only
    monkeypatch.setattr(hosted_prepare, "aload_litellm", broken_load)
    response = post(gateway, GOOD)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_unavailable", error
    # The same words as any request no backend served: no backend id, no cause.
    assert "hosted" not in error["message"], error
    assert response.headers["x-request-id"] in error["message"], error
    assert "ImportError" not in error["message"] and "proxy_internals" not in error["message"]
    assert response.headers.get("x-owngate-receipt")  # the refusal's receipt
    assert served(hosted) == 0
    monkeypatch.undo()  # LiteLLM loads again: the request that reads the log is served
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["refusal"], found
    assert (found[0]["reason"], found[0]["rule"]) == (
        "backend_unavailable",
        "owngate/hosted_unavailable",
    )
    assert served(hosted) == 1 and calls_made(gateway) == 1  # only the later one was a call


def test_litellm_that_fails_to_load_after_a_failed_attempt_leaves_that_attempt_last(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `a` fails; the hosted fallback cannot be called (LiteLLM does not load): the client
    # gets a's failure, which a's completion (the last record) holds.
    raw = start_raw(close_unanswered)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start(start_gateway, tmp_path, [backend("a", raw.url, "m", **EU_ZERO)], hosted)
    monkeypatch.setattr(hosted_prepare, "aload_litellm", broken_load)
    response = post(gateway, GOOD)
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "hosted" not in message and "a:" not in message, message
    assert len(raw.posts) == 1 and served(hosted) == 0
    monkeypatch.undo()
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["dispatch", "completion"], found
    assert found[0]["backend"]["id"] == "a"
    assert found[-1]["status"] == response.status_code
    assert calls_made(gateway) == 1  # only the later one was a call


def test_a_hosted_attempt_withdrawn_while_it_was_checked_has_no_dispatch_record(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The provider's checks (DNS lookups of content-part hosts: up to seconds) are held
    # while a reload takes the hosted backend out of the policy: it is not dispatched to.
    hold = Hold(monkeypatch, HostedClient, "prepare")
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start(start_gateway, tmp_path, [], hosted)
    # the hosted backend is in the EU
    response = hold.across(
        lambda: post(gateway, GOOD), lambda: reload_policy(gateway, tmp_path, "2", "us")
    )
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "no_compliant_backend"
    assert served(hosted) == 0
    reload_policy(gateway, tmp_path, "3", "eu")  # for the request that reads the log
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["refusal"], found


def test_a_private_attempt_withdrawn_while_it_connected_has_no_dispatch_record(
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `a`'s connect is held while a reload takes `a` out of the policy: it is not
    # dispatched to (its connection goes back to the pool), and the fallback serves.
    hold = Hold(monkeypatch, PrivateRelay, "connect")
    a = start_sim("vllm", models=("m",), zero_latency=True)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    us = {**EU_ZERO, "region": "us-east-1"}
    gateway = start(
        start_gateway, tmp_path, [backend("a", a.url, "m", **us)], hosted, regions="eu, us"
    )
    response = hold.across(
        lambda: post(gateway, GOOD), lambda: reload_policy(gateway, tmp_path, "2", "eu")
    )
    assert response.status_code == 200, response.text
    assert served(a) == 0 and served(hosted) == 1
    found = request_log(tmp_path, gateway, response)
    assert [r["type"] for r in found] == ["dispatch", "completion"], found
    assert found[0]["backend"]["id"] == "hosted"
    assert found[0]["fallback_basis"] == [{"backend": "a", "state": "down"}]
