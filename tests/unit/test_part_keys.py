"""Content parts that mean one thing (gateway/api/part_keys.py): a body the media check
walks may not hold a key twice, or in two cases, where a media reference stands. Bodies are
written as bytes: a dict cannot hold a key twice."""

from __future__ import annotations

import orjson
import pytest

from gateway.api.media_walk import MediaWalk
from gateway.api.part_keys import refuse_ambiguous_parts
from gateway.api.private_media import MediaRefs
from gateway.config.media import MediaUrlSettings
from gateway.config.schema import MAX_MEDIA_WALK_VALUES
from gateway.errors import GatewayError
from tests.helpers.python_calls import by_name, python_calls, python_steps

PRIVATE = "http://10.0.0.5/admin"
PUBLIC = "https://images.example.com/cat.png"


def chat(*parts: str, message: str = "") -> bytes:
    """A chat body whose one user message holds `parts` (JSON texts, written as given)."""
    return (
        b'{"model": "m", "messages": [{"role": "user", '
        + message.encode()
        + b'"content": ['
        + ", ".join(parts).encode()
        + b"]}]}"
    )


def refused(body: bytes) -> GatewayError:
    doc = orjson.loads(body)
    with pytest.raises(GatewayError) as caught:
        MediaRefs.of(doc, body)
    return caught.value


# (body, the place named): each is read by some backend as a part the check did not judge,
# or of a kind the gateway did not count.
AMBIGUOUS: dict[str, tuple[bytes, str]] = {
    # Go keeps a string over a later `null`: fetched there, no URL to the check.
    "url then null": (
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PRIVATE}", "url": null}}}}'),
        "messages[0].content[0]",
    ),
    "url escaped, then null": (
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PRIVATE}", "u\\u0072l": null}}}}'),
        "messages[0].content[0]",
    ),
    # Go merges two copies of an object: the URL of the first, the detail of the second.
    "an object twice": (
        chat(
            f'{{"type": "image_url", "image_url": {{"url": "{PRIVATE}"}}, '
            '"image_url": {"detail": "low"}}'
        ),
        "messages[0].content[0]",
    ),
    # Go keeps a string over a later value of another type.
    "url then a number": (
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PRIVATE}", "url": 1}}}}'),
        "messages[0].content[0]",
    ),
    "input_audio twice": (
        chat(
            f'{{"type": "input_audio", "input_audio": {{"data": "{PRIVATE}"}}, '
            '"input_audio": null}'
        ),
        "messages[0].content[0]",
    ),
    "file_data twice": (
        chat(f'{{"type": "file", "file": {{"file_data": "{PRIVATE}", "file_data": null}}}}'),
        "messages[0].content[0]",
    ),
    "video_url in two cases": (
        chat(f'{{"type": "video_url", "video_url": {{"url": "{PUBLIC}"}}, "Video_Url": null}}'),
        "messages[0].content[0]",
    ),
    # One reader sees text, another an image.
    "type twice": (
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}"}}, "type": "text"}}'),
        "messages[0].content[0]",
    ),
    "type in two cases": (
        chat(f'{{"type": "text", "text": "hi", "Type": "image_url", "image_url": "{PUBLIC}"}}'),
        "messages[0].content[0]",
    ),
    "URL beside url": (
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}", "URL": null}}}}'),
        "messages[0].content[0]",
    ),
    # Go's folds: U+212A (Kelvin) is k, U+017F (long s) is s.
    "a Kelvin sign": (
        chat(f'{{"type": "image_url", "image_url": "{PUBLIC}", "kind": 1, "\\u212aind": 2}}'),
        "messages[0].content[0]",
    ),
    "a long s": (
        chat(f'{{"type": "image_url", "image_url": "{PUBLIC}", "size": 1, "\\u017fize": 2}}'),
        "messages[0].content[0]",
    ),
    # U+1E9E folds to U+00DF in Go (one character to one; Python's casefold makes `ss`).
    "a capital sharp s": (
        chat(f'{{"type": "image_url", "image_url": "{PUBLIC}", "\u00df": 1, "\u1e9e": 2}}'),
        "messages[0].content[0]",
    ),
    "the second part": (
        chat(
            '{"type": "text", "text": "a"}',
            f'{{"image_url": {{"url": "{PRIVATE}", "url": null}}}}',
        ),
        "messages[0].content[1]",
    ),
    # A message beside a walked one: its earlier `content` (parts) hidden by a string.
    "a message's content twice": (
        chat(
            f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}"}}}}',
            message=f'"content": [{{"type": "image_url", "image_url": "{PRIVATE}"}}], ',
        ),
        "messages[0]",
    ),
    "a message's images twice": (
        chat(
            f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}"}}}}',
            message=f'"images": [{{"url": "{PRIVATE}", "url": null}}], ',
        ),
        "messages[0].images[0]",
    ),
    "in a tool message": (
        b'{"model": "m", "messages": [{"role": "tool", "tool_call_id": "c", "content": [{"type": '
        + f'"image_url", "image_url": {{"url": "{PRIVATE}", "url": null}}}}]}}]}}'.encode(),
        "messages[0].content[0]",
    ),
    "llama.cpp's multimodal_data twice": (
        f'{{"model": "m", "prompt": {{"prompt_string": "<__media__>", "multimodal_data": '
        f'["{PRIVATE}"], "multimodal_data": []}}}}'.encode(),
        "prompt",
    ),
    "in a prompt array": (
        f'{{"model": "m", "prompt": ["a", {{"prompt_string": "x", "multimodal_data": '
        f'[{{"url": "{PRIVATE}", "url": null}}]}}]}}'.encode(),
        "prompt[1]",
    ),
}


@pytest.mark.parametrize("case", AMBIGUOUS)
def test_a_key_a_reader_may_read_twice_is_refused(case: str) -> None:
    body, where = AMBIGUOUS[case]
    error = refused(body)
    assert (error.code.value, error.param) == ("invalid_request", where), error.message
    # The place is named; no value of the client's is echoed.
    for spelled in ("10.0.0.5", "images.example.com", "kind", "size", "ind", "url", "Url"):
        assert spelled not in error.message.replace(where, ""), error.message


@pytest.mark.parametrize(
    "body",
    [
        chat(f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}", "detail": "low"}}}}'),
        chat('{"type": "text", "text": "a"}', '{"type": "text", "text": "a"}'),
        # `ß` folds to `ss` in Python, to no other letter in Go: two names to it.
        chat(f'{{"type": "image_url", "image_url": "{PUBLIC}", "ß": 1, "ss": 2}}'),
        # Case variants in a message are read by the media walk, both copies.
        chat(f'{{"type": "image_url", "image_url": "{PUBLIC}"}}', message='"Role": "x", '),
        # The same name in two objects is no repeat.
        chat(
            f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}"}}}}',
            f'{{"type": "image_url", "image_url": {{"url": "{PUBLIC}"}}}}',
        ),
    ],
)
def test_distinct_keys_pass(body: bytes) -> None:
    refs = MediaRefs.of(orjson.loads(body), body)
    assert refs is None or refs.refusal(MediaUrlSettings()) is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [{"role": "system", "content": "be brief"}, '
        b'{"role": "user", "content": "caf\\u00e9 \\u4e2d"}, {"role": "assistant"}]}',
        b'{"model": "m", "messages": []}',
    ],
)
def test_a_plain_chat_is_not_parsed_again(body: bytes) -> None:
    calls = python_calls(lambda: MediaRefs.of(orjson.loads(body), body), by_name)
    assert calls == ["of"]


def plain(*messages: str, extra: str = "") -> bytes:
    """A chat body of `messages` (JSON texts, written as given), each plain to orjson."""
    return f'{{"model": "m", {extra}"messages": [{", ".join(messages)}]}}'.encode()


_PARTS = f'[{{"type": "image_url", "image_url": {{"url": "{PRIVATE}"}}}}]'
# A plain chat to orjson (the last copy a string) whose message wrote its content before:
# parts to a first-wins reader (Go's gjson), both to a Go type that keeps a string and
# parts in two fields.
HIDDEN_CONTENT: dict[str, tuple[bytes, str]] = {
    "parts, then a string": (
        plain(f'{{"role": "user", "content": {_PARTS}, "content": "hi"}}'),
        "messages[0]",
    ),
    "the first copy escaped": (
        plain(f'{{"role": "user", "c\\u006fntent": {_PARTS}, "content": "hi"}}'),
        "messages[0]",
    ),
    "the last copy escaped": (
        plain(f'{{"role": "user", "content": {_PARTS}, "\\u0063ontent": "hi"}}'),
        "messages[0]",
    ),
    "in the second message, the first without content": (
        plain('{"role": "user"}', f'{{"content": {_PARTS}, "role": "user", "content": "hi"}}'),
        "messages[1]",
    ),
    "beside a schema naming content": (
        plain(
            f'{{"role": "user", "content": {_PARTS}, "content": "hi"}}',
            extra='"response_format": {"type": "json_schema", "json_schema": {"name": "a", '
            '"schema": {"properties": {"content": {"type": "string"}}}}}, ',
        ),
        "messages[0]",
    ),
}


@pytest.mark.parametrize("case", HIDDEN_CONTENT)
def test_a_plain_message_hiding_earlier_content_is_refused(case: str) -> None:
    body, where = HIDDEN_CONTENT[case]
    error = refused(body)
    assert (error.code.value, error.param) == ("invalid_request", where), error.message
    assert "10.0.0.5" not in error.message


@pytest.mark.parametrize(
    "body",
    [
        # `"content"` written more often than kept, none of it a repeat.
        plain('{"role": "user", "content": "content"}'),
        plain(
            '{"role": "user", "content": "hi"}',
            extra='"tools": [{"type": "function", "function": {"name": "f", "parameters": '
            '{"properties": {"content": {}, "Content": {}, "Name": {}, "name": {}}}}}], ',
        ),
        # An escaped letter elsewhere, and a role written twice (no media place).
        plain('{"role": "user", "content": "\\u0041 is A"}'),
        plain('{"role": "user", "role": "user", "content": "hi"}', extra='"user": "\\u0061", '),
    ],
)
def test_a_plain_chat_that_only_looks_repeated_passes(body: bytes) -> None:
    assert MediaRefs.of(orjson.loads(body), body) is None


def test_a_repeat_outside_media_places_is_not_read() -> None:
    # Top-level repeats are body.py's (decided and bounding names only); tools are not
    # fetched from.
    body = (
        b'{"model": "m", "tools": [{"type": "function", "type": "function"}], '
        + chat(f'{{"type": "image_url", "image_url": "{PUBLIC}"}}')[1:]
    )
    refs = MediaRefs.of(orjson.loads(body), body)
    assert refs is None or refs.refusal(MediaUrlSettings()) is None


def _refuse(body: bytes) -> None:
    """`refuse_ambiguous_parts` within the default media walk bound."""
    refuse_ambiguous_parts(body, MediaWalk(MAX_MEDIA_WALK_VALUES).spend)


def _part_keys_steps(body: bytes) -> int:
    """The Python lines run and functions called (C ones too) by `refuse_ambiguous_parts`."""
    return python_steps(lambda: _refuse(body))


@pytest.mark.parametrize(
    "part",
    [
        '{"type": "text", "x": "a"}',
        '{"type": "image_url", "image_url": {"url": "data:a", "detail": "low"}}',
    ],
)
def test_parts_of_distinct_lowercase_keys_cost_no_python_step_each(part: str) -> None:
    """Before, a Python step or more per part: 130,000 parts (within the media walk's
    default bound) took longer than the body's second parse. Both past
    `json_loads.COLLECT_UNDER`: the collector is turned off for each."""
    assert _part_keys_steps(chat(*[part] * 20_000)) == _part_keys_steps(chat(*[part] * 40_000))
    # a key twice, or in two cases, behind them is still found, and named by its place
    for wrong in ('{"type": "text", "x": "a", "x": "b"}', '{"type": "image_url", "TYPE": "x"}'):
        with pytest.raises(GatewayError) as caught:
            _refuse(chat(*[part] * 1000, wrong))
        assert caught.value.param == "messages[0].content[1000]"
    nested = '{"type": "image_url", "image_url": {"url": "data:a", "url": "http://10.0.0.5/"}}'
    with pytest.raises(GatewayError) as caught:
        _refuse(chat(*[part] * 1000, nested))
    assert caught.value.param == "messages[0].content[1000]"
