"""A private backend passed over for a media URL it may not be sent is not unavailable:
under `when_private_unavailable`, a client cannot make healthy private backends count as
"down" with a URL they refuse, and so send its request (and the data it holds) to a
hosted provider (docs/policies.md, "What unavailable means").

Private backends are scripted raw backends that would serve (their `/health` answers
200); the hosted one is a simulator reached through LiteLLM, so nothing leaves loopback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.api import attempt_media, router_fields
from gateway.provenance import load_signer
from tests.helpers.audit_rig import request_log, settled
from tests.helpers.gateways import (
    EU_FALLBACK_POLICY,
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    logged_gateway,
    served,
)
from tests.helpers.log_truth import ORIGIN
from tests.helpers.raw_backend import (
    ERROR_BODY,
    Answer,
    RawBackend,
    completion_body,
    json_answer,
)

pytestmark = LITELLM_WARNINGS

POLICY = EU_FALLBACK_POLICY

# A public literal address: a hosted provider may be sent it, a backend whose
# `media_urls:` is `remote: none` may not.
PUBLIC_IMAGE = "https://93.184.216.34/x.png"

Setup = tuple[Gateway, Sim, list[RawBackend]]
Build = Callable[[Answer, dict[str, Any]], Setup]
NONE: dict[str, Any] = {"media_urls": {"remote": "none"}}  # `data:` media only


@pytest.fixture
def setup(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> Build:
    """(gateway, hosted sim, private raw backends a and b): a would serve but may be sent
    `data:` media only; b answers `b_answer`, with `b_media` as its settings."""

    def build(b_answer: Answer, b_media: dict[str, Any]) -> Setup:
        raws = [start_raw(json_answer(completion_body("private"))), start_raw(b_answer)]
        hosted = start_sim("vllm", models=("m",), zero_latency=True)
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "policy.yaml").write_text(POLICY)
        backends = [
            backend("a", raws[0].url, "m", **EU_ZERO, **NONE),
            backend("b", raws[1].url, "m", **EU_ZERO, **b_media),
            hosted_backend("hosted", f"{hosted.url}/v1", "m"),
        ]
        gateway = logged_gateway(
            start_gateway,
            tmp_path,
            backends,
            ORIGIN,
            policy={"paths": [str(policies)]},
            routing={"default": {"strategy": "round_robin"}},
            environ={"HOSTED_KEY": "k"},
        )
        return gateway, hosted, raws

    return build


def chat_with_image(url: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": url}}
    content = [{"type": "text", "text": "what is it?"}, part]
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def post_image(gateway: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=chat_with_image(PUBLIC_IMAGE),
        headers=gateway.headers,
        timeout=30,
    )


def test_a_media_url_the_private_backends_refuse_does_not_unlock_the_hosted_fallback(
    setup: Build,
) -> None:
    gateway, hosted, raws = setup(json_answer(completion_body("private")), NONE)
    response = post_image(gateway)
    assert served(hosted) == 0, response.text
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert [len(raw.posts) for raw in raws] == [0, 0]


def test_one_private_backend_refusing_the_url_withholds_the_fallback_past_another_failing(
    setup: Build,
) -> None:
    """a may not be sent the URL, b may and fails 503: a was never unavailable."""
    gateway, hosted, raws = setup(json_answer(ERROR_BODY, b"503 Service Unavailable"), {})
    response = post_image(gateway)
    assert served(hosted) == 0, response.text
    assert response.status_code == 503, response.text
    assert [len(raw.posts) for raw in raws] == [0, 1]


def test_a_reload_narrowing_media_urls_before_the_dispatch_does_not_unlock_the_fallback(
    setup: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The URL passed each backend's first check (the config the request arrived under
    allowed it) and a reload narrowed `media_urls` before its dispatch record: each attempt
    is withdrawn for the request's own URL, "refused" as at the first check, never "down"
    (before: down, and the request went hosted with the URL)."""
    monkeypatch.setattr(router_fields, "media_refusal", lambda *_: None)  # the arrival config's
    gateway, hosted, raws = setup(json_answer(completion_body("private")), NONE)
    response = post_image(gateway)
    assert served(hosted) == 0, response.text
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["param"] == "messages[0].content[1]"
    assert [len(raw.posts) for raw in raws] == [0, 0]


def test_a_reload_narrowing_media_urls_after_the_dispatch_record_does_not_unlock_it(
    setup: Build, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As above, the reload landing once each dispatch record was written: each attempt
    fails before it sends (its completion says why), "refused" for the fallback, never
    "failed" (before: failed, and the request went hosted with the URL). Each completion
    is written (before, its reason, a `str` subclass, was refused by the record's checks:
    the log held two dispatches and no completion)."""
    real = attempt_media.media_refusal
    asked: dict[str, int] = {}

    def narrowed_after_the_record(media: Any, registry: Any, attempt: Any) -> Any:
        asked[attempt.backend.id] = asked.get(attempt.backend.id, 0) + 1
        if asked[attempt.backend.id] == 1:  # right before the dispatch record: allowed
            return None
        return real(media, registry, attempt)

    monkeypatch.setattr(router_fields, "media_refusal", lambda *_: None)  # the arrival config's
    monkeypatch.setattr(attempt_media, "media_refusal", narrowed_after_the_record)
    gateway, hosted, raws = setup(json_answer(completion_body("private")), NONE)
    response = post_image(gateway)
    assert served(hosted) == 0, response.text
    assert asked == {"a": 2, "b": 2}  # each attempt was asked again after its record
    assert [len(raw.posts) for raw in raws] == [0, 0]
    assert response.status_code == 503, response.text  # the last attempt's: it was dispatched
    log, key = tmp_path / "log", load_signer(tmp_path / "log.key").vkey
    request_id = response.headers["x-request-id"]
    settled(log, key, request_id)
    completions = [r for r in request_log(log, key, request_id) if r["type"] == "completion"]
    assert [(r["status"], r["error"]) for r in completions] == [
        (503, f"{b}: its media_urls narrowed by a config reload") for b in ("a", "b")
    ]
