"""The media count (gateway/api/media_count.py, `usage_bound.counted_media`) costs no Python
step per message, content part, input object or string, and reads vLLM's `mm_payload` with
the media check's own walk, once per request, within `limits.max_media_walk_values`.

Before, it ran a Python function per part the byte scan could not rule out: an 8 MiB body
of `{"type": "text", "Type": "text", "text": "a"}` parts held the event loop 0.8 s (four
times orjson's parse), with no bound at all; SGLang input objects and `{"a": "b"}` in
`mm_payload` as long. Steps are counted (Python lines and calls, C ones too), never timed;
the count is held to the judgement it made before, part by part (`_reference_part`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.media_walk import MediaWalk
from gateway.api.private_media import MediaRefs
from gateway.api.usage_bound import MEDIA_MOST, counted_media, media_parts
from gateway.config.media import MediaUrlSettings
from gateway.errors import GatewayError
from tests.helpers.python_calls import python_steps

_HEAD = b'{"model":"m","messages":[{"role":"user","content":'
_IMAGE = b'{"type":"image_url","image_url":{"url":"data:a"}}'


def _many(head: bytes, unit: bytes, n: int, tail: bytes) -> bytes:
    return head + b",".join([unit] * n) + tail


# Bodies the byte scan cannot rule out, whose count reads every element: (shape, media).
SHAPES: dict[str, tuple[Callable[[int], bytes], Callable[[int], int]]] = {
    "Type parts": (
        lambda n: _many(_HEAD + b"[", b'{"type":"text","Type":"text","text":"a"}', n, b"]}]}"),
        lambda n: 0,
    ),
    "Type parts of images": (
        lambda n: _many(_HEAD + b"[", b'{"type":"text","Type":"image_url"}', n, b"]}]}"),
        lambda n: n,
    ),
    "parts of another member beside an image": (
        lambda n: _many(_HEAD + b"[" + _IMAGE + b",", b'{"type":"text","x":"a"}', n, b"]}]}"),
        lambda n: 1,
    ),
    "parts named by their media": (
        lambda n: _many(_HEAD + b"[", b'{"input_audio":{"data":"AA"}}', n, b"]}]}"),
        lambda n: n,
    ),
    "messages": (
        lambda n: _many(
            b'{"model":"m","messages":[', b'{"role":"user","content":"an image"}', n, b"]}"
        ),
        lambda n: 0,
    ),
    "messages of Content and IMAGES": (
        lambda n: _many(
            b'{"model":"m","messages":[',
            b'{"role":"user","Content":[' + _IMAGE + b'],"IMAGES":"a"}',
            n,
            b"]}",
        ),
        lambda n: 2 * n,
    ),
    "sglang input objects": (
        lambda n: _many(b'{"model":"m","input":[', b'{"text":"a","x":"a"}', n, b'],"image":1}'),
        lambda n: 0,
    ),
    "sglang image objects": (
        lambda n: _many(b'{"model":"m","input":[', b'{"text":"a","image":"a"}', n, b"]}"),
        lambda n: n,
    ),
    "prompt objects": (
        lambda n: _many(
            b'{"model":"m","prompt":[', b'{"prompt_string":"a","multimodal_data":["a"]}', n, b"]}"
        ),
        lambda n: n,
    ),
    "mm_payload strings": (
        lambda n: _many(_HEAD + b'"hi"}],"mm_payload":[', b'"b"', n, b"]}"),
        lambda n: n,
    ),
}


def _steps(run: Callable[[], object]) -> int:
    """The Python lines run and functions called (C ones too) by `run`."""
    return python_steps(run, (GatewayError,))


def _count_steps(body: bytes) -> int:
    doc = orjson.loads(body)
    return _steps(lambda: counted_media(doc, body))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_count_costs_no_python_step_per_element(
    shape: tuple[Callable[[int], bytes], Callable[[int], int]],
) -> None:
    """Before, 10 to 40 steps per part, message, input object or string."""
    body, media = shape
    for n in (1, 3, 20_000):
        assert counted_media(orjson.loads(body(n)), body(n)) == media(n)
    assert _count_steps(body(15_000)) == _count_steps(body(30_000))


def test_a_batch_past_the_most_media_is_counted_in_c_and_refused() -> None:
    body = SHAPES["sglang image objects"][0](MEDIA_MOST + 1)
    with pytest.raises(GatewayError, match=f"more than {MEDIA_MOST} media items"):
        counted_media(orjson.loads(body), body)


def test_mm_payload_is_walked_once_per_request_within_one_bound() -> None:
    """The count and the media check read `mm_payload` with one walk: its values are spent
    once, the check still judges what it holds, and the bound is the request's, the
    payload's values and the content parts' together."""
    tail = b'"hi"}],"mm_payload":[' + b",".join([b'{"a":"b"}'] * 600) + b',"file:///x"]}'
    body = _HEAD + tail
    doc = orjson.loads(body)
    walk = MediaWalk(1000)
    assert counted_media(doc, body, walk) == 601
    spent = walk.left
    media = MediaRefs.of(doc, body, walk=walk)
    assert walk.left == spent  # not walked again
    assert media is not None
    refused = media.refusal(MediaUrlSettings())
    assert refused is not None and refused.param == "mm_payload"
    # 600 payload values and 600 part values: each under 1,000, together past it
    parts = b"[" + b",".join([b'{"type":"text","x":"a"}'] * 300) + b"]"
    body = _HEAD + parts + tail[4:]
    doc = orjson.loads(body)
    walk = MediaWalk(1000)
    counted_media(doc, body, walk)
    with pytest.raises(GatewayError, match="more than 1000 values"):
        MediaRefs.of(doc, body, walk=walk)
    MediaRefs.of(doc, body, 10_000)  # no 400 for either alone


def test_a_payload_past_the_walk_s_bound_costs_what_the_bound_does() -> None:
    def steps(n: int) -> int:
        body = _many(_HEAD + b'"hi"}],"mm_payload":[', b'{"a":"b"}', n, b"]}")
        doc = orjson.loads(body)
        return _steps(lambda: counted_media(doc, body, MediaWalk(1000)))

    assert steps(4000) == steps(8000)
    body = _many(_HEAD + b'"hi"}],"mm_payload":[', b'{"a":"b"}', 1001, b"]}")
    with pytest.raises(GatewayError, match=r"limits\.max_media_walk_values"):
        counted_media(orjson.loads(body), body, MediaWalk(1000))


# The judgement made before, one part at a time (gateway/api/usage_bound.py `_media_part`
# at the commit that made the count C-level), which the count must make exactly.
_TEXT_PART = frozenset(("type", "text"))


def _reference_part(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "text")
    if kind == "text" and item.keys() <= _TEXT_PART:
        return False
    if kind != "text" and (kind is not None or any(k not in _TEXT_PART for k in item)):
        return True
    if any(name in k.lower() for k in item for name in ("image", "audio", "video")):
        return True
    return len(item) > 1 and any(
        len(k) == 4 and k != "type" and k.casefold() == "type" and v not in ("text", None)
        for k, v in item.items()
    )


def _reference(doc: dict[str, Any]) -> int:
    found = 0
    for message in doc["messages"]:
        if not isinstance(message, dict):
            continue
        for key, value in message.items():
            folded = key.casefold() if len(key) in (6, 7) else ""
            if folded == "content" and isinstance(value, list):
                found += sum(map(_reference_part, value))
            elif folded == "images" and value is not None:
                found += len(value) if isinstance(value, list) else 1
    return found


_KEYS = st.sampled_from(
    ["type", "Type", "TYPE", "tYpE", "text", "Text", "image_url", "x", "Input_Audio", "uuid"]
)
_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(["text", "image_url", "Text", "", "a"]), st.none(), st.just([]), st.just({})
)
_PARTS = st.lists(
    st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=4), st.just("a"), st.just([])),
    max_size=6,
)
_MESSAGE_KEYS = st.sampled_from(
    ["role", "content", "Content", "CONTENT", "conTent", "cONTENT", "images", "Images"]
)
_MESSAGES = st.lists(
    st.one_of(
        st.dictionaries(
            _MESSAGE_KEYS, st.one_of(_PARTS, st.sampled_from(["hi", None])), max_size=7
        ),
        st.just("a"),
    ),
    max_size=4,
)


@settings(max_examples=400, deadline=None)
@given(messages=_MESSAGES)
def test_the_count_judges_each_part_as_before(messages: list[Any]) -> None:
    """Any mix of parts and messages, names in any case, 'content' in more spellings than
    are read one at a time: the count is the one made part by part (and message by
    message, but for the case below)."""
    doc = {"model": "m", "messages": messages}
    assert media_parts(doc) == _reference(doc)
    body = json.dumps(doc).encode()
    assert media_parts(doc, body) == _reference(doc)


def test_a_message_of_one_member_in_another_case_is_counted() -> None:
    """Before, a message's `Images` or `CONTENT` was read only beside another member: a
    message of that one member alone counted none (a Go server reads its media)."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    doc = {"messages": [{"Images": ["a", "b"]}, {"CONTENT": [image]}]}
    assert media_parts(doc) == 3
    assert media_parts(doc, json.dumps(doc).encode()) == 3
