"""What a request reserves of its tenant's tokens budget (gateway/api/reservation.py), as
a table: the prompt estimate (token ids counted exactly, media parts at their
allowance), the client's limit times the choices, the default without a limit,
embeddings, and the refusal of a limit past the whole budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api import reservation
from gateway.api.reservation import default_per_answer, tokens_to_reserve
from gateway.api.usage_bound import COMPLETION_ALLOWANCE, MEDIA_ALLOWANCE
from gateway.config import ConfigError, parse_config
from gateway.errors import GatewayError

MESSAGES = [{"role": "user", "content": "hi"}]
BODY = 100  # bytes: a prompt estimate of 25 tokens

# name: (request, per_minute, per_answer, tokens reserved)
CASES: dict[str, tuple[dict[str, Any], int, int | None, int]] = {
    "max_tokens": ({"max_tokens": 400}, 1000, None, 25 + 400),
    "max_completion_tokens": ({"max_completion_tokens": 300}, 1000, None, 25 + 300),
    "the larger of both": ({"max_tokens": 10, "max_completion_tokens": 300}, 1000, None, 325),
    "n choices each": ({"max_tokens": 100, "n": 3}, 1000, None, 25 + 300),
    "n as a string": ({"max_tokens": 100, "n": "3"}, 1000, None, 25 + 300),
    "a batch of prompts": ({"max_tokens": 100, "prompt": ["a", "b"]}, 1000, None, 225),
    "min_tokens past the limit": ({"max_tokens": 10, "min_tokens": 90}, 1000, None, 115),
    "no limit: an eighth of the budget": ({}, 1000, None, 25 + 125),
    "no limit: the tenant's setting": ({}, 1000, 50, 25 + 50),
    "no limit, n 2": ({"n": 2}, 1000, 50, 25 + 100),
    # llama.cpp reads n_predict -1 as no limit whatever max_tokens says
    "a limit some backend ignores": ({"max_tokens": 5, "n_predict": -1}, 1000, 50, 75),
    "a limit that is no whole number": ({"max_tokens": "5"}, 1000, 50, 75),
    "max_tokens 0": ({"max_tokens": 0}, 1000, None, 25),
    # cut to the whole budget by the caller: never refused, waits for a full budget
    "a long prompt without a limit": ({}, 10, None, 25 + 2),
    "many choices without a limit": ({"n": 100}, 1000, None, 25 + 100 * 125),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tokens_reserved(name: str) -> None:
    fields, per_minute, per_answer, expected = CASES[name]
    ask = {"model": "m", "messages": MESSAGES, **fields}
    reserved = tokens_to_reserve(ask, BODY, per_minute=per_minute, per_answer=per_answer)
    assert reserved == expected


def _image(i: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"https://img.example/{i}.png"}}


def _body(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, separators=(",", ":")).encode())


# name: (request, tokens per media part configured, media parts)
MEDIA: dict[str, tuple[dict[str, Any], int | None, int]] = {
    "twenty images": (
        {"messages": [{"role": "user", "content": [_image(i) for i in range(20)]}]},
        None,
        20,
    ),
    "audio, a file and a video beside text": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
                        {"type": "file", "file": {"file_id": "f"}},
                        {"type": "video_url", "video_url": {"url": "https://v.example/1"}},
                    ],
                }
            ]
        },
        None,
        3,
    ),
    "the tenant's setting": (
        {"messages": [{"role": "user", "content": [_image(1), _image(2)]}]},
        1000,
        2,
    ),
    # A server in Go reads names in any case, the last copy: these are images to it.
    "images under a `Content` in another case": (
        {
            "messages": [
                {"role": "user", "content": "hi", "Content": [_image(1), _image(2)]},
                {"role": "user", "content": "hi", "CONTENT": [_image(3)]},
            ]
        },
        None,
        3,
    ),
    "an image whose `Type` in another case is not text": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "Type": "image_url", "image_url": {"url": "u"}},
                        {"type": "text", "TYPE": "text", "text": "a"},  # text either way
                        {"type": "text", "Typ\u0117": "image_url"},  # not `type` to Go
                    ],
                }
            ]
        },
        None,
        1,
    ),
    "llama.cpp multimodal_data": (
        {"prompt": {"prompt_string": "<__media__>", "multimodal_data": ["AAAA", "BBBB"]}},
        None,
        2,
    ),
    # llama.cpp's embeddings read prompt objects in `input`, or in `content` without one
    "llama.cpp multimodal_data of an embedding's input batch": (
        {
            "input": [
                {"prompt_string": "<__media__>", "multimodal_data": ["AAAA"]},
                "plain text",
                {"prompt_string": "<__media__><__media__>", "multimodal_data": ["B", "C"]},
            ]
        },
        None,
        3,
    ),
    "llama.cpp multimodal_data of an embedding's content": (
        {"content": {"prompt_string": "<__media__>", "multimodal_data": ["AAAA", "BBBB"]}},
        None,
        2,
    ),
    # SGLang's multimodal embeddings: one image and one video per input object
    "SGLang embedding input objects": (
        {
            "input": [
                {"text": "a cat", "image": "https://example.com/cat.png"},
                {"text": "a clip", "video": "https://example.com/a.mp4", "image": None},
                {"image": "https://example.com/b.png", "video": "https://example.com/b.mp4"},
                {"text": "text alone"},
            ]
        },
        None,
        4,
    ),
    # LiteLLM's (and Ollama's) images beside a message's content, each an image the
    # backend decodes; `Images` too, as a server in Go reads it
    "a message's images": (
        {
            "messages": [
                {"role": "user", "content": "what is this", "images": ["AAAA", "BBBB"]},
                {"role": "user", "content": "and this", "Images": ["CCCC"]},
                {"role": "user", "images": "DDDD"},  # one, as the media check reads it
            ]
        },
        None,
        4,
    ),
    # Infinity's embeddings of media: each string of `input` an image (or audio) URL
    "Infinity embeddings with modality image": (
        {"modality": "image", "input": ["https://example.com/a.png", "data:image/png,AA"]},
        None,
        2,
    ),
    "Infinity embedding of one audio clip": (
        {"modality": "audio", "input": "https://example.com/a.wav"},
        None,
        1,
    ),
    "Infinity text embeddings": ({"modality": "text", "input": ["a", "b"]}, None, 0),
}


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_media_parts_reserve_their_allowance(name: str) -> None:
    """The attack: each part is a short URL a backend turns into hundreds or thousands
    of tokens (the usage bound allows MEDIA_ALLOWANCE each), but reserved its bytes / 4:
    a burst of 20-image requests was admitted about fifty times over the budget."""
    fields, per_media, parts = MEDIA[name]
    ask = {"model": "m", "max_tokens": 1, **fields}
    body = _body(ask)
    reserved = tokens_to_reserve(ask, body, per_minute=10**6, per_answer=None, per_media=per_media)
    assert reserved == -(-body // 4) + parts * (per_media or reservation.MEDIA_RESERVED) + 1


# name: (request, tokens reserved); each with max_tokens 1. The body's bytes other than
# the ids' digits (their separators too) are estimated at 4 a token, as any text.
IDS: dict[str, tuple[dict[str, Any], int]] = {
    # 2039 bytes: 1000 ids of 1 digit, 1039 others (260 tokens), 1 answer token
    "one prompt of ids": ({"prompt": [1] * 1000}, 1000 + 260 + 1),
    # 1243 bytes: 300 ids of 1 digit, 200 of 2, 543 others; two prompts, an answer each
    "a batch of id arrays": ({"prompt": [[1] * 300, [22] * 200]}, 500 + 136 + 2),
    # 52 bytes: 3 ids of 1 digit, 49 others; four answers (usage_bound reads a batch)
    "llama.cpp's mixed prompt": ({"prompt": [5, 6, "text", 7]}, 3 + 13 + 4),
    # 109 bytes: 10 ids of 6 digits, 49 others (bytes / 4 reserved 28 before)
    "long ids": ({"prompt": [151_643] * 10}, 10 + 13 + 1),
}


@pytest.mark.parametrize("name", sorted(IDS))
def test_token_ids_are_counted_exactly(name: str) -> None:
    """A prompt of token ids is exactly that many tokens; `[1,1,...]` is 2 bytes a token,
    which bytes / 4 reserved as half a token: a burst used twice its reservations."""
    fields, expected = IDS[name]
    ask = {"model": "m", "max_tokens": 1, **fields}
    reserved = tokens_to_reserve(ask, _body(ask), per_minute=10**6, per_answer=None)
    assert reserved == expected


def test_embedding_token_arrays_are_counted_exactly() -> None:
    ask = {"model": "m", "input": [[7] * 4000, [8] * 4000]}
    body = _body(ask)
    reserved = tokens_to_reserve(ask, body, per_minute=10**6, per_answer=None, embeddings=True)
    assert reserved == 8000 + 2007  # 16027 bytes: 8000 of digits, 8027 others


def test_llamacpp_embedding_content_ids_are_counted_exactly() -> None:
    # llama.cpp's `/v1/embeddings` reads `content` when there is no `input`, ids included
    ask = {"model": "m", "content": [7] * 4000}
    body = _body(ask)
    reserved = tokens_to_reserve(ask, body, per_minute=10**6, per_answer=None, embeddings=True)
    assert reserved == 4000 + 1007  # 8025 bytes: 4000 of digits, 4025 others


def test_embeddings_reserve_their_prompt_alone() -> None:
    ask = {"model": "m", "input": "hi", "max_tokens": 10**9}
    assert tokens_to_reserve(ask, BODY, per_minute=1000, per_answer=None, embeddings=True) == 25


@pytest.mark.parametrize(
    ("fields", "requested"),
    [({"max_tokens": 1001}, 1001), ({"max_tokens": 400, "n": 3}, 1200)],
)
def test_a_limit_past_the_whole_budget_is_refused(fields: dict[str, Any], requested: int) -> None:
    with pytest.raises(GatewayError) as caught:
        tokens_to_reserve({"model": "m", **fields}, BODY, per_minute=1000, per_answer=None)
    error = caught.value
    assert (error.status, error.code.value, error.error_type) == (
        429,
        "rate_limit_exceeded",
        "tokens",
    )
    assert f"Limit 1000, Requested {requested}" in error.message
    assert error.headers == ()  # no retry-after: waiting never makes it fit


@pytest.mark.parametrize(
    ("per_minute", "default"),
    [(1, 1), (8, 1), (1000, 125), (1001, 126), (10**8, COMPLETION_ALLOWANCE)],
)
def test_the_default_per_answer(per_minute: int, default: int) -> None:
    assert default_per_answer(per_minute) == default


TENANT = """
backends:
  - {id: gpu, kind: vllm, base_url: "http://127.0.0.1:9", region: eu-west-1, owner: t,
     models: [{name: m}]}
tenants:
  - id: acme
    limits: %s
"""


@pytest.mark.parametrize(
    "limits",
    ["{reserved_tokens_per_answer: 10}", "{tokens_per_minute: 10, reserved_tokens_per_answer: 11}"],
)
def test_the_setting_needs_a_budget_that_holds_it(limits: str) -> None:
    with pytest.raises(ConfigError, match="reserved_tokens_per_answer"):
        parse_config(TENANT % limits)


def test_the_setting_is_read() -> None:
    config = parse_config(TENANT % "{tokens_per_minute: 10, reserved_tokens_per_answer: 10}")
    assert config.tenants[0].limits.reserved_tokens_per_answer == 10


def test_the_media_setting_is_read_and_bounded() -> None:
    config = parse_config(TENANT % "{tokens_per_minute: 10, reserved_tokens_per_media: 700}")
    assert config.tenants[0].limits.reserved_tokens_per_media == 700
    # never past what the usage bound ever charges a part
    most = f"{{tokens_per_minute: 10, reserved_tokens_per_media: {MEDIA_ALLOWANCE}}}"
    assert parse_config(TENANT % most).tenants[0].limits.reserved_tokens_per_media == 65536
    for limits in (
        f"{{tokens_per_minute: 10, reserved_tokens_per_media: {MEDIA_ALLOWANCE + 1}}}",
        "{reserved_tokens_per_media: 100}",
        "{tokens_per_minute: 10, reserved_tokens_per_media: 0}",
    ):
        with pytest.raises(ConfigError, match="reserved_tokens_per_media"):
            parse_config(TENANT % limits)
