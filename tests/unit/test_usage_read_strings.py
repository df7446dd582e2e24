"""Strings taken out of a document before its brackets are counted (gateway/api/usage_read.py
`_containers`, `_too_deep`) in one pass, whatever a hostile backend writes.

Before, the pattern of a string needed its closing quote: from a quote that opens one
never closed the search scanned to the document's end, failed, and began again at the
next quote, so a document of `\\"[` repeated with no closing quote cost one scan to its
end per quote: 10 s of the event loop for a 48 KB stream event (every event is read), 4
minutes for a 330 KB whole answer past `MAX_CONTAINERS`. Such a document is no JSON (the
client's parser refuses it too): it holds no usage, and it is not past the read bounds.
Counted, not timed: a search that found a quote never fails, so none starts again."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.sse_events import EventReader
from gateway.api.usage_read import _STRING, MAX_CONTAINERS, read_json

USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'


@given(st.lists(st.sampled_from([b'"', b"\\", b"[", b"{", b"a", b"\n", b"\xc3\xa9"])))
def test_a_search_that_found_a_quote_never_fails(parts: list[bytes]) -> None:
    data = b"".join(parts)
    for at in (index for index, byte in enumerate(data) if byte == ord('"')):
        assert _STRING.match(data, at) is not None, (data, at)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | st.text(alphabet='"\\[]{}a\n\u00e9'),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(alphabet='"\\[]{}a'), inner),
)


def _containers(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(map(_containers, value))
    if isinstance(value, dict):
        return 1 + sum(map(_containers, value.values()))
    return 0


@given(JSON)
def test_a_documents_brackets_outside_its_strings_are_its_arrays_and_objects(
    value: object,
) -> None:
    for data in (orjson.dumps(value), json.dumps(value, indent=1).encode()):
        bare = _STRING.sub(b"", data)
        assert bare.count(b"[") + bare.count(b"{") == _containers(value), data


def test_a_stream_event_with_a_string_never_closed_is_no_json_not_past_the_bounds() -> None:
    """Before: `PastBounds` (its brackets taken as nesting), the usage made unknown."""
    event = b'{"choices":[],' + USAGE + b',"x":"' + b'\\"[' * 2000
    with pytest.raises(json.JSONDecodeError):  # no `PastBounds`
        read_json(event, line=True)
    reader = EventReader()
    reader.feed(b"data: " + event + b"\n\n")
    assert not reader.unknown


def test_a_whole_answer_with_a_string_never_closed_is_cut_short_not_past_the_bounds() -> None:
    answer = b'{"choices":[],' + USAGE + b',"x":"' + b"[" * (MAX_CONTAINERS + 1)
    with pytest.raises(json.JSONDecodeError):  # no `PastBounds`
        read_json(answer)
