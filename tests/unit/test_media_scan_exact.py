"""The byte scan that lets `media_parts` skip its walk (`_no_media`) never says "no
media" of a body the walk counts media in, however the body is written (spacing,
escapes, a key's case), and the walk counts every part vLLM loads as media: a part
without `type` read by its keys (`{"input_audio": ...}`), or one with a `uuid` whatever
its `type`. Before, both were none to the reservation and the usage bound: a request of
100 audio clips written so was reserved and bounded as text (gateway/api/usage_bound.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.usage_bound import media_parts

URL = {"url": "https://example.com/a"}
AUDIO = {"data": "AAAA", "format": "wav"}
# Parts as clients (honest or not) write them: media to vLLM, a server in Go (names in any
# case) or a hosted provider.
MEDIA_PARTS: list[dict[str, Any]] = [
    {"type": "image_url", "image_url": URL},
    {"type": "input_audio", "input_audio": AUDIO},
    {"type": "audio_url", "audio_url": URL},
    {"type": "video_url", "video_url": URL},
    {"type": "file", "file": {"file_data": "AAAA"}},
    {"type": "input_image", "image_url": "https://example.com/a"},
    {"Type": "input_audio", "input_audio": AUDIO},
    {"TYPE": "audio_url", "audio_url": URL},
    {"type": None, "file": {"file_id": "f"}},
    # media named by none of image, audio, video: only a `type` that is not text says so
    {"Type": "file", "file": {"file_id": "f"}},
    {"type": "text", "TYPE": "file"},
    {"type": "input_file", "file_id": "f"},
    {"type": "text", "text": "a", "Type": "document"},
    # vLLM's parts without `type`, read by their keys
    {"input_audio": AUDIO},
    {"audio_url": URL},
    {"audio_url": "https://example.com/a.wav"},
    {"image_url": "https://example.com/a.png"},
    {"video_url": URL},
    {"audio_embeds": "AAAA"},
    {"image_embeds": "AAAA"},
    # with a `uuid`, vLLM reads a part's keys whatever its `type`
    {"type": "text", "text": "a", "uuid": "u", "audio_url": URL},
    {"type": "text", "text": "a", "uuid": "u", "input_audio": AUDIO},
]
PROSE = ["hi", "type", '"type": "text"', '"type":"input_audio"', "audio", "\u017f", "K"]
TEXT_PARTS: list[Any] = [
    {"type": "text", "text": "a"},
    {"text": "a"},
    "a plain string part",
    {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
]


def _vllm_media(part: Any) -> bool:
    """Whether vLLM's chat parser (vllm/entrypoints/chat_utils.py) loads media for it."""
    if not isinstance(part, dict):
        return False
    kind, uuid = part.get("type"), part.get("uuid")
    if isinstance(kind, str) and uuid is None:
        return kind not in ("text", "input_text", "output_text", "refusal", "thinking")
    if kind is None or uuid is not None:
        keys = ("image_url", "image_pil", "image_embeds", "audio_embeds", "audio_url")
        return (
            any(k in part for k in keys)
            or part.get("input_audio") is not None
            or ("video_url" in part)
        )
    return False


def _encode(value: Any, rng: random.Random, item: str, pair: str, rate: float) -> str:
    """JSON text of `value`, with `item`/`pair` separators and, at random, a key's or a
    string's letters (`rate` of them) written as `\\u` escapes (what a client hiding a
    name may send)."""
    if isinstance(value, dict):
        inner = item.join(
            _string(k, rng, rate) + pair + _encode(v, rng, item, pair, rate)
            for k, v in value.items()
        )
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + item.join(_encode(v, rng, item, pair, rate) for v in value) + "]"
    if isinstance(value, str):
        return _string(value, rng, rate)
    return json.dumps(value)


def _string(text: str, rng: random.Random, rate: float) -> str:
    ascii_only = rng.random() < 0.5
    letters = [i for i, c in enumerate(text) if c.isascii() and c.isalpha()]
    if not letters or rng.random() >= rate:
        return json.dumps(text, ensure_ascii=ascii_only)
    i = rng.choice(letters)
    head = json.dumps(text[:i], ensure_ascii=ascii_only)[:-1]
    return head + f"\\u{ord(text[i]):04X}" + json.dumps(text[i + 1 :], ensure_ascii=ascii_only)[1:]


_SEPARATORS = [(", ", ": "), (",", ":"), (",", " : "), (",", ":\t"), ("\n,", "\n:\n")]
_PART = st.sampled_from(MEDIA_PARTS + TEXT_PARTS) | st.builds(
    lambda t: {"type": "text", "text": t}, st.sampled_from(PROSE)
)
_MESSAGE = st.builds(
    lambda role, parts, key: {"role": role, key: parts},
    st.sampled_from(["user", "system"]),
    st.lists(_PART, min_size=1, max_size=2),
    st.sampled_from(["content", "Content"]),
) | st.builds(lambda t: {"role": "user", "content": t}, st.sampled_from(PROSE))


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(_MESSAGE, min_size=1, max_size=2),
    st.randoms(use_true_random=False),
    st.sampled_from(_SEPARATORS),
    st.sampled_from([0.0, 0.0, 0.05, 0.3]),
)
def test_the_byte_scan_never_hides_media_the_walk_counts(
    messages: list[dict[str, Any]], rng: random.Random, spacing: tuple[str, str], rate: float
) -> None:
    doc = {"model": "m", "messages": messages}
    body = _encode(doc, rng, *spacing, rate).encode()
    assert json.loads(body) == doc
    walked = media_parts(doc)
    assert media_parts(doc, body) == walked  # the scan skips only a walk finding none
    every = [message.get("content", message.get("Content")) for message in messages]
    loaded = sum(_vllm_media(part) for parts in every if isinstance(parts, list) for part in parts)
    assert walked >= loaded  # every part vLLM loads as media is counted


_BY_KEYS = [p for p in MEDIA_PARTS if not any(k.lower() == "type" for k in p) or "uuid" in p]


@pytest.mark.parametrize("part", _BY_KEYS)
def test_a_part_vllm_reads_by_its_keys_is_counted(part: dict[str, Any]) -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": [part] * 100}]}
    for body in (json.dumps(doc).encode(), json.dumps(doc, separators=(",", ":")).encode()):
        assert media_parts(doc, body) == 100  # before: 0, reserved and bounded as text


@pytest.mark.parametrize("part", TEXT_PARTS)
def test_text_parts_stay_uncounted(part: Any) -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": [part] * 3}]}
    assert media_parts(doc, json.dumps(doc).encode()) == 0


@pytest.mark.parametrize(
    "body",
    [
        # a `type` pair written with other spacing is no text pair to the scan: walked
        b'{"messages": [{"content": [{"type" : "file", "file": {"file_id": "f"}}]}]}',
        b'{"messages": [{"content": [{"type":\t"file"}, {"type" :"text"}]}]}',
        b'{"messages": [{"content": [{"type"\n:\n"input_file", "file_id": "f"}]}]}',
        # an escaped capital or `_` in a name the walk reads in any case
        b'{"messages": [{"content": [{"type": "text", "\\u0054YPE": "file"}]}]}',
        b'{"messages": [{"content": [{"\\u0054ype": "file", "file": {"file_id": "f"}}]}]}',
        b'{"messages": [{"content": [{"input\\u005Faudio": {"data": "AAAA"}}]}]}',
        b'{"messages": [{"content": [{"AUDIO_URL": {"url": "https://example.com/a"}}]}]}',
        # a pair inside a string is escaped, no pair: walked
        b'{"messages": [{"content": [{"type": "file", "text": "\\"type\\": \\"text\\""}]}]}',
    ],
)
def test_media_however_written_is_counted(body: bytes) -> None:
    doc = json.loads(body)
    assert media_parts(doc) == media_parts(doc, body) == 1
