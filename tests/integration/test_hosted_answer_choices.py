"""A whole hosted answer holds one choice for each the client asked for (`n`), numbered
0 to n-1 by the provider, and an embeddings answer one vector for each input
(gateway/upstream/hosted_finish.py).

LiteLLM 1.108.7 relays what the provider sent, renumbering a chat's choices by their
place: a provider that answered `n: 2` with one choice, or with two both numbered 0 (or
0 and 2), was relayed as a 200 the client could not tell from a full answer, and the
completion record committed to it. Such an answer is now the provider's failure, as one
without a finish reason is: 502 `upstream_error`, the record says 502 and commits to
nothing. A full answer, in any order, is served as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gateways import LITELLM_WARNINGS, Gateway
from tests.helpers.hosted_answers import ASK, ask, openai_answer
from tests.helpers.raw_backend import Answer, RawBackend

pytestmark = LITELLM_WARNINGS

STOP = {"finish_reason": "stop"}
TWO = {**ASK, "n": 2}


def text_answer(*indices: int) -> bytes:
    choices = [
        {"index": i, "text": "half", "logprobs": None, "finish_reason": "stop"} for i in indices
    ]
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": choices,
            "usage": usage,
        }
    ).encode()


def embeddings_answer(count: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.25]} for i in range(count)]
    usage = {"prompt_tokens": 2, "total_tokens": 2}
    return json.dumps({"object": "list", "model": "m", "data": data, "usage": usage}).encode()


CHAT = "/v1/chat/completions"
SHORT: list[tuple[bytes, dict[str, Any], str]] = [
    (openai_answer(STOP), TWO, CHAT),
    (openai_answer(STOP, STOP, indices=[0, 0]), TWO, CHAT),
    (openai_answer(STOP, STOP, indices=[0, 2]), TWO, CHAT),
    (openai_answer(STOP, STOP), ASK, CHAT),  # two where one was asked for
    (text_answer(0), {"model": "m", "prompt": "hi", "n": 2}, "/v1/completions"),
    (text_answer(0, 0), {"model": "m", "prompt": "hi", "n": 2}, "/v1/completions"),
    (embeddings_answer(1), {"model": "m", "input": ["a", "b"]}, "/v1/embeddings"),
]


@pytest.mark.parametrize(
    ("body", "doc", "path"),
    SHORT,
    ids=[
        "one-of-two",
        "zero-twice",
        "zero-and-two",
        "two-of-one",
        "text-one-of-two",
        "text-zero-twice",
        "one-vector-of-two",
    ],
)
def test_an_answer_short_of_what_was_asked_is_not_relayed(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    doc: dict[str, Any],
    path: str,
) -> None:
    response, completion = ask(start_raw, start_gateway, tmp_path, body, doc=doc, path=path)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_error"
    assert "half" not in response.text
    assert completion["status"] == 502
    assert completion["response_commitment"] is None


@pytest.mark.parametrize(
    ("body", "doc", "path", "count"),
    [
        (openai_answer(STOP, {"finish_reason": "length"}), TWO, CHAT, 2),
        (openai_answer(STOP, STOP, indices=[1, 0]), TWO, CHAT, 2),
        (openai_answer(STOP), {**ASK, "n": 1}, CHAT, 1),
        (text_answer(1, 0), {"model": "m", "prompt": "hi", "n": 2}, "/v1/completions", 2),
        (embeddings_answer(2), {"model": "m", "input": ["a", "b"]}, "/v1/embeddings", 2),
        (embeddings_answer(1), {"model": "m", "input": "a"}, "/v1/embeddings", 1),
        (embeddings_answer(1), {"model": "m", "input": [1, 2, 3]}, "/v1/embeddings", 1),
    ],
    ids=[
        "two",
        "two-reordered",
        "n-1",
        "text-two-reordered",
        "two-vectors",
        "one-string",
        "one-token-array",
    ],
)
def test_a_full_answer_is_served(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    body: bytes,
    doc: dict[str, Any],
    path: str,
    count: int,
) -> None:
    response, completion = ask(start_raw, start_gateway, tmp_path, body, doc=doc, path=path)
    assert response.status_code == 200, response.text
    items = response.json()["data" if path.endswith("embeddings") else "choices"]
    assert sorted(item["index"] for item in items) == list(range(count))
    assert completion["status"] == 200


def test_embeddings_dimensions_a_model_would_not_get_is_refused_unsent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    # LiteLLM leaves `dimensions` out for `openai/<a model not text-embedding-3>`: the
    # client got full-size vectors, and a 200 (gateway/upstream/hosted_support.py).
    doc = {"model": "m", "input": "a", "dimensions": 2}
    response, refusal = ask(
        start_raw,
        start_gateway,
        tmp_path,
        embeddings_answer(1),
        doc=doc,
        path="/v1/embeddings",
        record="refusal",
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "dimensions"
    assert refusal["reason"] == "upstream_bad_request"
