"""The media check's walk (gateway/api/media_walk.py) costs no Python step per string of an
array, and reads at most `limits.max_media_walk_values` members and arrays one at a time:
an 8 MiB body of `{"a":"b"}` in `mm_payload` held the event loop 4.2 s, one of
`{"type":"text","x":"a"}` parts 2.0 s, against 0.2 to 0.8 s for orjson's parse. Steps are
counted (Python lines and calls, C calls too), never timed."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from gateway.api.private_media import MediaRefs
from gateway.config.media import MediaUrlSettings
from gateway.config.schema import MAX_MEDIA_WALK_VALUES, LimitSettings
from gateway.errors import GatewayError
from tests.helpers.python_calls import python_steps

_HEAD = b'{"model":"m","messages":[{"role":"user","content":'


def _many(head: bytes, unit: bytes, n: int, tail: bytes) -> bytes:
    return head + b",".join([unit] * n) + tail


# Arrays of strings: each string judged in C.
STRINGS: dict[str, Callable[[int], bytes]] = {
    "mm_payload strings": lambda n: _many(_HEAD + b'"hi"}],"mm_payload":[', b'"b"', n, b"]}"),
    "message images": lambda n: _many(_HEAD + b'"a","images":[', b'"a"', n, b"]}]}"),
    "an array in a part": lambda n: _many(
        _HEAD + b'[{"type":"image_url","x":[', b'"a"', n, b"]}]}]}"
    ),
    "an array in mm_payload at a url": lambda n: _many(
        _HEAD + b'"hi"}],"mm_payload":{"image_url":[', b'"data:a"', n, b"]}}"
    ),
}
# Objects, each member read one at a time: counted against the bound.
OBJECTS: dict[str, Callable[[int], bytes]] = {
    "mm_payload objects": lambda n: _many(_HEAD + b'"hi"}],"mm_payload":[', b'{"a":"b"}', n, b"]}"),
    "content parts": lambda n: _many(_HEAD + b"[", b'{"type":"text","x":"a"}', n, b"]}]}"),
    "text parts": lambda n: _many(_HEAD + b"[", b'{"type":"text","text":"a"}', n, b"]}]}"),
    "prompt objects": lambda n: _many(
        b'{"model":"m","prompt":[', b'{"prompt_string":"a","multimodal_data":["a"]}', n, b"]}"
    ),
    "sglang input objects": lambda n: _many(
        b'{"model":"m","input":[', b'{"text":"a","x":"a"}', n, b'],"image":1}'
    ),
    "nested objects in a part": lambda n: _many(
        _HEAD + b'[{"type":"image_url","x":[', b'{"a":"b"}', n, b"]}]}]}"
    ),
    # An empty object is read one at a time too: it counts as one value (before, as none,
    # and an 8 MiB body of `{}` walked whole, unbounded: 2.8 million objects).
    "empty parts": lambda n: _many(_HEAD + b"[", b"{}", n, b"]}]}"),
    "empty mm_payload objects": lambda n: _many(_HEAD + b'"hi"}],"mm_payload":[', b"{}", n, b"]}"),
    "empty prompt objects": lambda n: _many(
        b'{"model":"m","prompt":[', b"{}", n, b'],"x":"multimodal_data"}'
    ),
    "empty input objects": lambda n: _many(b'{"model":"m","input":[', b"{}", n, b'],"image":1}'),
    "empty objects in images": lambda n: _many(_HEAD + b'"a","images":[', b"{}", n, b"]}]}"),
    # Arrays where a part stands, and what they hold: the duplicate-key check reads them one
    # at a time (gateway/api/part_keys.py), the walk does not; counted all the same.
    "arrays as parts": lambda n: _many(_HEAD + b"[", b"[]", n, b"]}]}"),
    "objects in an array as a part": lambda n: _many(_HEAD + b"[[", b"{}", n, b"]]}]}"),
}
# Values the walk does not read (not objects where a part or a prompt object stands):
# picked out in C, neither counted nor a Python step each.
SKIPPED: dict[str, Callable[[int], bytes]] = {
    "numbers as parts": lambda n: _many(_HEAD + b"[", b"1", n, b"]}]}"),
    "strings as parts": lambda n: _many(_HEAD + b"[", b'"a"', n, b"]}]}"),
    "numbers beside a prompt object": lambda n: _many(
        b'{"model":"m","prompt":[{"multimodal_data":[]},', b"1", n, b"]}"
    ),
}


def _steps(body: bytes, most: int = MAX_MEDIA_WALK_VALUES) -> int:
    """The Python lines run and functions called (C ones too) by `MediaRefs.of`."""
    doc = orjson.loads(body)
    return python_steps(lambda: MediaRefs.of(doc, body, most), (GatewayError,))


@pytest.mark.parametrize("shape", STRINGS.values(), ids=STRINGS.keys())
def test_the_strings_of_an_array_cost_no_python_step_each(shape: Callable[[int], bytes]) -> None:
    """Before, 36 to 40 steps per string (a generator frame, an f-string, a parse of it as a
    URL raising BadURL); now the strings that may matter are picked out in C."""
    assert MediaRefs.of(orjson.loads(shape(3)), shape(3)) is None
    # both past `json_loads.COLLECT_UNDER`: the collector is turned off for each
    assert _steps(shape(40_000)) == _steps(shape(20_000))


@pytest.mark.parametrize("shape", SKIPPED.values(), ids=SKIPPED.keys())
def test_values_the_walk_does_not_read_cost_no_python_step_each(
    shape: Callable[[int], bytes],
) -> None:
    """Before, a Python step per item (a loop that skipped it)."""
    assert MediaRefs.of(orjson.loads(shape(3)), shape(3), 10) is None
    assert _steps(shape(40_000), 10) == _steps(shape(20_000), 10)


@pytest.mark.parametrize("shape", OBJECTS.values(), ids=OBJECTS.keys())
def test_the_walk_stops_at_its_bound_whatever_the_body_holds_past_it(
    shape: Callable[[int], bytes],
) -> None:
    """A body of objects past `most` costs what the first `most` values cost: the steps of
    a body twice as long are the same, and it is refused naming the setting."""
    most = 1000
    # both past `json_loads.COLLECT_UNDER` (the duplicate-key check's parse)
    assert _steps(shape(12_000), most) == _steps(shape(24_000), most)
    body = shape(4000)
    with pytest.raises(GatewayError) as refused:
        MediaRefs.of(orjson.loads(body), body, most)
    assert refused.value.status == 400
    assert "limits.max_media_walk_values" in str(refused.value)
    assert f"more than {most} values" in str(refused.value)


@pytest.mark.parametrize("shape", OBJECTS.values(), ids=OBJECTS.keys())
def test_a_body_within_the_bound_is_walked_whole(shape: Callable[[int], bytes]) -> None:
    body = shape(300)
    MediaRefs.of(orjson.loads(body), body, 10_000)  # no 400
    with pytest.raises(GatewayError, match="max_media_walk_values"):
        MediaRefs.of(orjson.loads(body), body, 299)  # each unit is one value or more


def test_the_most_image_parts_a_request_may_hold_are_within_the_default() -> None:
    """65,536 image parts (usage_bound.MEDIA_MOST) of three values each, and 32,768 text
    parts beside them, are read whole: no honest request reaches the default."""
    image = b'{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}'
    text = b'{"type":"text","text":"and these?"}'
    units = [image] * 65_536 + [text] * 32_768
    body = _HEAD + b"[" + b",".join(units) + b"]}]}"
    assert MediaRefs.of(orjson.loads(body), body) is None
    assert LimitSettings().max_media_walk_values == MAX_MEDIA_WALK_VALUES
    with pytest.raises(GatewayError, match="max_media_walk_values"):
        MediaRefs.of(orjson.loads(body), body, MAX_MEDIA_WALK_VALUES - 1)


def test_references_past_the_walk_s_c_filters_are_still_found() -> None:
    """Strings picked out in C are judged as before: a URL at an `_url` key's array in
    `mm_payload`, a scheme in a part's nested array, `http` in any case; text is not read."""
    cases = {
        b'"hi"}],"mm_payload":{"image_url":["data:a","http://10.0.0.5/"]}}': "mm_payload",
        b'"hi"}],"mm_payload":[["a"],["file:///etc/passwd"]]}': "mm_payload",
        b'[{"type":"image_url","x":["a",["b","HTTP@127.0.0.1"]]}]}]}': "messages[0].content[0]",
        b'"a","images":["a","gopher://x/"]}]}': "messages[0].images",
    }
    for tail, param in cases.items():
        body = _HEAD + tail
        media = MediaRefs.of(orjson.loads(body), body)
        assert media is not None, tail
        refused = media.refusal(MediaUrlSettings())
        assert refused is not None and refused.param == param, tail
    prose = (
        _HEAD + b'[{"type":"text","text":"see http://10.0.0.5/"},{"type":"text","x":"a b: c"}]}]}'
    )
    assert MediaRefs.of(orjson.loads(prose), prose) is None
