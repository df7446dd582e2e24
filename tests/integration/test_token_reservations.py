"""A tenant's tokens-per-minute budget is reserved at admission (gateway/api/reservation.py):
a burst of expensive requests is admitted only as far as their reservations fit the
minute's budget (images and token-id prompts at what they cost, not their bytes / 4), a
request that asks for more than the whole budget is refused, a reservation no backend
used is given back, and a request refused at its reservation costs the request of
`requests_per_minute` its admission charged (its body was read and parsed).

The backend is a scripted raw socket (tests/helpers/raw_backend.py) that holds every
request until the test lets it answer, so the burst is all in flight at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.api import reservation as reservations
from gateway.state import TenantLimits
from gateway.tenants import hash_api_key
from tests.helpers.gateways import TENANT_KEY, Gateway, backend
from tests.helpers.net import free_port
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.waiting import until, until_async

TPM = 1000
MAX_TOKENS = 450  # with its prompt, two requests fit the minute's budget, and a third needs
# 24 s of refill: however slowly a loaded machine runs the burst, it is not admitted
BURST = 12
WAIT_S = 30.0
USAGE = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}


def _body(max_tokens: int | None = MAX_TOKENS) -> bytes:
    doc: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    return json.dumps(doc).encode()


def _reservation(body: bytes) -> int:
    """What such a request reserves: its prompt estimate and its max_tokens."""
    max_tokens: int = json.loads(body)["max_tokens"]
    return -(-len(body) // 4) + max_tokens


class HeldBackend:
    """Holds every completion until `go` is set, then answers it with `USAGE`, or with
    `prompt_tokens(post)` prompt tokens and one completion token (an honest server's)."""

    def __init__(self, prompt_tokens: Callable[[Post], int] | None = None) -> None:
        self.go = threading.Event()
        self._prompt_tokens = prompt_tokens

    async def __call__(self, writer: asyncio.StreamWriter, post: Post) -> bool:
        await until_async(self.go.is_set, "the test lets the held answers end", timeout=60)
        usage = USAGE
        if self._prompt_tokens is not None:
            prompt = self._prompt_tokens(post)
            usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": usage,
        }
        data = json.dumps(answer).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(data) + data)
        await writer.drain()
        return False


def _gateway(start_gateway: Callable[..., Gateway], url: str, **limits: int) -> Gateway:
    tenants = [
        {
            "id": "acme",
            "api_key_hashes": [hash_api_key(TENANT_KEY)],
            "models": ["*"],
            "limits": {"tokens_per_minute": TPM, **limits},
        }
    ]
    return start_gateway([backend("gpu", url, "m")], tenants=tenants)


def _post(gateway: Gateway, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        content=body,
        headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"},
        timeout=WAIT_S,
    )


def test_a_burst_is_admitted_only_as_far_as_its_reservations_fit(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    """The attack: one key fires a burst of requests each asking for `MAX_TOKENS`; the
    budget used to be charged only when answers ended, so all were admitted at once."""
    held = HeldBackend()
    raw = start_raw(held)
    gateway = _gateway(start_gateway, raw.url)
    body = _body()
    fits = TPM // _reservation(body)
    assert fits == 2
    limits = TenantLimits(tokens_per_minute=TPM)
    try:
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            calls = [pool.submit(_post, gateway, body) for _ in range(BURST)]
            # Each request either reaches the backend (and is held there) or is refused.
            until(
                lambda: len(raw.posts) + sum(call.done() for call in calls) == BURST,
                "every request of the burst held by the backend or refused",
                timeout=WAIT_S,
                detail=lambda: (len(raw.posts), sum(call.done() for call in calls)),
            )
            assert len(raw.posts) == fits, "admitted past the budget"
            use = gateway.app.state.tenant_use("acme", limits)
            assert use.reserved == fits * _reservation(body)
            refused = [call.result() for call in calls if call.done()]
            assert len(refused) == BURST - fits
            for response in refused:
                assert response.status_code == 429, response.text
                error = response.json()["error"]
                assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
                assert int(response.headers["retry-after"]) >= 1
            held.go.set()
            served = [call.result(timeout=WAIT_S) for call in calls]
    finally:
        held.go.set()
    assert sum(r.status_code == 200 for r in served) == fits
    # Settled: the reservations were replaced by the usage reported.
    assert gateway.app.state.tenant_use("acme", limits).reserved == 0


def test_a_request_asking_for_more_than_the_whole_budget_is_refused(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    held = HeldBackend()
    held.go.set()
    raw = start_raw(held)
    gateway = _gateway(start_gateway, raw.url)
    response = _post(gateway, _body(max_tokens=TPM + 1))
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert f"Limit {TPM}, Requested {TPM + 1}" in error["message"]
    assert "retry-after" not in response.headers  # waiting never makes it fit
    assert raw.posts == []
    assert _post(gateway, _body(max_tokens=TPM - 100)).status_code == 200  # nothing kept


def test_a_reservation_no_backend_took_is_given_back(
    start_gateway: Callable[..., Gateway],
) -> None:
    """Nothing listens at the backend's port: the request fails before any backend took
    its prompt, so its whole reservation comes back and the next one fits."""
    gateway = _gateway(start_gateway, f"http://127.0.0.1:{free_port()}")
    body = _body(max_tokens=TPM - 100)
    first = _post(gateway, body)
    assert first.status_code >= 500, first.text
    limits = TenantLimits(tokens_per_minute=TPM)
    use = gateway.app.state.tenant_use("acme", limits)
    assert (use.reserved, use.tokens) == (0, 0)
    assert _post(gateway, body).status_code >= 500  # admitted again, not 429


def _burst(
    gateway: Gateway, raw: RawBackend, held: HeldBackend, body: bytes, path: str
) -> tuple[int, list[httpx.Response]]:
    """Fire `BURST` copies of `body` at once: how many reached the backend together, and
    every answer once the backend let them end."""
    try:
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            calls = [pool.submit(_post, gateway, body, path) for _ in range(BURST)]
            until(
                lambda: len(raw.posts) + sum(call.done() for call in calls) == BURST,
                "every request of the burst held by the backend or refused",
                timeout=WAIT_S,
                detail=lambda: (len(raw.posts), sum(call.done() for call in calls)),
            )
            admitted = len(raw.posts)
            held.go.set()
            return admitted, [call.result(timeout=WAIT_S) for call in calls]
    finally:
        held.go.set()


IMAGES = 13
PER_IMAGE = 1_000  # what an honest vision model makes of one (well under MEDIA_ALLOWANCE)


def _budget_for(reservation: int, fits: int) -> int:
    """A minute's budget that `fits` such reservations fit, with a tenth of one left over:
    one more needs nine tenths of a reservation to refill (over 25 s at two fitting), so
    however slowly a loaded machine runs the burst, none more is admitted while it lasts
    (the burst's wait is bounded at WAIT_S)."""
    return fits * reservation + reservation // 10


def _images(hidden: str | None) -> list[dict[str, Any]]:
    """The request's messages: `IMAGES` image parts, as the API writes them, or in a
    shape only a server in Go reads as images (it matches names in any case, keeping the
    last copy): the parts under `Content` beside a text `content`, or each part typed by
    an image `Type` only (beside a text `type` it is refused: gateway/api/part_keys.py);
    or in the shape vLLM reads as an image by its key (`untyped`: no `type`)."""
    urls = [{"url": f"https://img.example/{i}.png"} for i in range(IMAGES)]
    if hidden == "Type":
        parts = [{"text": "a", "Type": "image_url", "image_url": u} for u in urls]
    elif hidden == "untyped":  # vLLM's image part without `type`, read by its key
        parts = [{"image_url": u} for u in urls]
    else:
        parts = [{"type": "image_url", "image_url": u} for u in urls]
    if hidden == "Content":
        return [{"role": "user", "content": "look", "Content": parts}]
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize(
    ("per_media", "fits", "hidden"),
    [
        (None, 1, None),
        (3000, 2, None),
        (None, 1, "Content"),
        (None, 1, "Type"),
        (None, 1, "untyped"),
    ],
)
def test_a_burst_of_image_requests_reserves_the_images(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    per_media: int | None,
    fits: int,
    hidden: str | None,
) -> None:
    """The attack: 13 image URLs and `max_tokens: 1` reserved only the body's bytes / 4
    (about 290 tokens) while the images cost 13,000: a burst was admitted as far as
    those fit (the whole burst here; about fifty times the budget with 20 images). Each
    part now reserves `reserved_tokens_per_media`, also where only a server in Go reads
    it as an image, or vLLM by its key (`hidden`: before, such parts reserved nothing and
    the whole burst went through)."""
    held = HeldBackend(lambda _post: IMAGES * PER_IMAGE + 10)
    raw = start_raw(held)
    doc = {"model": "m", "max_tokens": 1, "messages": _images(hidden)}
    body = json.dumps(doc).encode()
    reservation = -(-len(body) // 4) + IMAGES * (per_media or reservations.MEDIA_RESERVED) + 1
    tpm = _budget_for(reservation, fits)
    limits = {"tokens_per_minute": tpm}
    if per_media is not None:
        limits["reserved_tokens_per_media"] = per_media
    gateway = _gateway(start_gateway, raw.url, **limits)
    admitted, answers = _burst(gateway, raw, held, body, "/v1/chat/completions")
    served = sum(r.status_code == 200 for r in answers)
    assert served == admitted
    use = gateway.app.state.tenant_use("acme", TenantLimits(tokens_per_minute=tpm))
    assert use.tokens is not None
    assert use.tokens <= tpm, "the burst overdrew the budget"
    assert served * (IMAGES * PER_IMAGE + 11) <= tpm
    assert admitted == fits


@pytest.mark.parametrize(
    ("field", "path", "answer"),
    # llama.cpp's `/v1/embeddings` reads `content` when there is no `input`, token ids
    # included (the pinned llama-server embeds `{"content": [1] * 100}` as 100 tokens).
    [("prompt", "/v1/completions", 1), ("content", "/v1/embeddings", 0)],
)
def test_a_burst_of_token_id_prompts_reserves_each_id(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    field: str,
    path: str,
    answer: int,
) -> None:
    """The attack: `"prompt": [1,1,...]` is 2 bytes an exact token, reserved at bytes / 4:
    a burst of honest 45,000-token prompts used about twice the budget. One fits now
    (llama.cpp's embeddings' `content` was still reserved at bytes / 4: two fitted)."""
    ids = 45_000
    held = HeldBackend(lambda post: len(json.loads(post.body)[field]))
    raw = start_raw(held)
    doc: dict[str, Any] = {"model": "m", field: [1] * ids}
    if answer:
        doc["max_tokens"] = 1
    body = json.dumps(doc).encode().replace(b", ", b",")  # "1," : 2 bytes a token
    reservation = ids + -(-(len(body) - ids) // 4) + answer  # the digits are the ids
    tpm = _budget_for(reservation, 1)
    gateway = _gateway(start_gateway, raw.url, tokens_per_minute=tpm)
    admitted, answers = _burst(gateway, raw, held, body, path)
    served = sum(r.status_code == 200 for r in answers)
    assert served == admitted
    assert served * (ids + 1) <= tpm, "honest usage past the budget"
    assert admitted == 1


def test_a_request_refused_at_its_reservation_costs_its_request(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    """docs/state.md: a request refused at its token reservation (its tokens do not fit
    now, or never could) costs the request its admission charged. It was given back, so
    a tenant could have bodies that never fit read and parsed as fast as it could send
    them, at no cost to `requests_per_minute` (found by review: 500 under a limit of 2)."""
    held = HeldBackend()
    raw = start_raw(held)
    gateway = _gateway(start_gateway, raw.url, requests_per_minute=3)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(_post, gateway, _body(max_tokens=900))  # 1 of 3 requests
            until(lambda: len(raw.posts) == 1, "the first request held", timeout=WAIT_S)
            for max_tokens in (TPM + 1, 900):  # never fits; does not fit now: 2 and 3 of 3
                refused = _post(gateway, _body(max_tokens=max_tokens))
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["type"] == "tokens", refused.text
            use = gateway.app.state.tenant_use("acme", TenantLimits(3, TPM))
            assert use.requests == 3
            fourth = _post(gateway, _body(max_tokens=10))  # fits the tokens left, not R
            assert fourth.status_code == 429, fourth.text
            assert fourth.json()["error"]["type"] == "requests", fourth.text
            assert "retry-after" in fourth.headers
            held.go.set()
            assert first.result(timeout=WAIT_S).status_code == 200
    finally:
        held.go.set()
    assert len(raw.posts) == 1  # no refused request reached the backend
