"""`limits.max_media_walk_values` bounds what the media check reads one at a time on every
proxied endpoint: a body past it gets a 400 in OpenAI's format naming the setting, nothing
reaches the backend, and a body within it is served (gateway/api/media_walk.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson

from tests.helpers.gateways import Gateway, backend
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

ANSWER = orjson.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m"})
MOST = 50


def _parts(n: int) -> dict[str, Any]:
    parts = [{"type": "text", "x": "a"}] * n
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


# (path, body past the bound): content parts, llama.cpp prompt objects, SGLang input objects,
# vLLM's mm_payload.
PAST: dict[str, tuple[str, dict[str, Any]]] = {
    "chat parts": ("/v1/chat/completions", _parts(MOST + 1)),
    "chat mm_payload": (
        "/v1/chat/completions",
        {**_parts(1), "mm_payload": [{"a": "b"}] * (MOST + 1)},
    ),
    "completion prompt objects": (
        "/v1/completions",
        {"model": "m", "prompt": [{"prompt_string": "a", "multimodal_data": ["a"]}] * MOST},
    ),
    "embedding input objects": (
        "/v1/embeddings",
        {"model": "m", "input": [{"text": "a", "x": "a"}] * MOST, "image": 1},
    ),
}


def test_a_body_past_the_media_walk_bound_is_refused_on_every_endpoint(
    start_raw: Callable[[Answer], RawBackend], start_gateway: Callable[..., Gateway]
) -> None:
    raw = start_raw(json_answer(ANSWER))
    gateway = start_gateway([backend("gpu", raw.url, "m")], limits={"max_media_walk_values": MOST})
    for case, (path, doc) in PAST.items():
        response = httpx.post(f"{gateway.url}{path}", json=doc, headers=gateway.headers)
        assert response.status_code == 400, (case, response.text)
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
        assert "limits.max_media_walk_values" in error["message"], case
        assert f"more than {MOST} values" in error["message"], case
    assert raw.posts == []  # nothing reached the backend
    served = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=_parts(MOST // 2), headers=gateway.headers
    )
    assert served.status_code == 200, served.text
    assert len(raw.posts) == 1
