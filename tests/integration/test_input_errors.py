"""Hostile or malformed client input is a 4xx OpenAI error, never a 500 or a guess.

The fields the gateway decides on (`model`, `stream`, `stream_options`) must mean one
thing to it and to the backend after it; nesting is bounded; odd bytes, numbers and
headers are refused cleanly. Unit tests of `gateway.api.body`, then the same over real
sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, Final

import httpx
import orjson
import pytest

from gateway.api.body import MAX_DEPTH, parse_body
from gateway.app import create_app
from gateway.errors import GatewayError
from tests.helpers.gateways import TENANT_KEY, Gateway, Sim, backend, gateway_config


def nested(depth: int, inner: bytes = b"1") -> bytes:
    """A JSON value `depth` arrays deep."""
    return b"[" * depth + inner + b"]" * depth


def refused(body: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_body(body)
    assert caught.value.status == 400
    return caught.value


# -- repeated keys the gateway decides on ----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "a", "model": "b"}', "model"),
        (b'{"model": "a", "mod\\u0065l": "b"}', "model"),  # the same name, escaped
        (b'{"\\u006D\\u006F\\u0064\\u0065\\u006C": "a", "model": "b"}', "model"),
        (b'{"model": "a", "stream": false, "stream": true}', "stream"),
        (b'{"model": "a", "str\\u0065am": true, "stream": false}', "stream"),
        (b'{"model": "a", "stream_options": {}, "stream_options": {}}', "stream_options"),
        (
            b'{"model": "a", "stream_options": {"include_usage": false, "include_usage": true}}',
            "stream_options.include_usage",
        ),
        # The fields that bound the tokens reserved and charged: Go leaves a plain integer
        # as it was for a `null`, so a server in Go reads 8 choices where the gateway
        # (last wins) reads none; others read the last copy, which may not be the limit's.
        (b'{"model": "a", "n": 8, "n": null}', "n"),
        (b'{"model": "a", "max_tokens": 100000, "max_t\\u006fkens": null}', "max_tokens"),
        (b'{"model": "a", "messages": [], "messages": null}', "messages"),
        (b'{"model": "a", "prompt": ["a", "b"], "prompt": "a"}', "prompt"),
        (b'{"model": "a", "best_of": 8, "best_of": 1}', "best_of"),
        (b'{"model": "a", "input": [1, 2], "input": "a"}', "input"),
        # Infinity's `modality`: whether `input` is media URLs it fetches, or text
        (b'{"model": "a", "modality": "image", "modality": "text"}', "modality"),
    ],
)
def test_a_repeated_decided_key_is_refused(body: bytes, param: str) -> None:
    error = refused(body)
    assert (error.code.value, error.param) == ("invalid_request", param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # A server that matches names without regard to case (Go's encoding/json: Ollama,
        # LocalAI, behind a `kind: openai` backend) reads the last of these as `model`.
        (b'{"model": "a", "Model": "b"}', "model"),
        (b'{"MODEL": "b", "model": "a"}', "model"),
        (b'{"model": "a", "mod\\u0045l": "b"}', "model"),  # `modEl`, escaped
        (b'{"model": "a", "Stream": true}', "stream"),
        (b'{"model": "a", "\xc5\xbftream": true}', "stream"),  # U+017F folds to `s` in Go
        (b'{"model": "a", "Stream_Options": {"include_usage": true}}', "stream_options"),
        (
            b'{"model": "a", "stream_options": {"include_usage": false, "Include_Usage": true}}',
            "stream_options.include_usage",
        ),
        # The fields that bound the tokens reserved and charged (usage_bound.py): such a
        # server would generate 100,000 tokens, or 8 choices, or read other messages,
        # while the gateway reserved and bounded one token, one choice, these messages.
        (b'{"model": "a", "max_tokens": 1, "Max_tokens": 100000}', "max_tokens"),
        (b'{"model": "a", "max_tokens": 1, "max_to\\u212aens": 100000}', "max_tokens"),
        (b'{"model": "a", "max_tokens": 1, "MAX_COMPLETION_TOKENS": 9}', "max_completion_tokens"),
        (b'{"model": "a", "max_tokens": 1, "N_Predict": 100000}', "n_predict"),
        (b'{"model": "a", "max_tokens": 1, "Min_tokens": 100000}', "min_tokens"),
        (b'{"model": "a", "n": 1, "N": 8}', "n"),
        (b'{"model": "a", "Best_of": 8}', "best_of"),
        (b'{"model": "a", "N_cmpl": 8}', "n_cmpl"),
        (b'{"model": "a", "prompt": "a", "PROMPT": ["a", "b"]}', "prompt"),
        (b'{"model": "a", "messages": [], "Me\\u017f\\u017fages": []}', "messages"),
        # a router in Go would pass Infinity `modality: image`: `input` fetched as URLs,
        # while the gateway read text and checked none of them
        (b'{"model": "a", "input": ["http://10.0.0.5/"], "Modality": "image"}', "modality"),
    ],
)
def test_a_decided_key_in_another_case_is_refused(body: bytes, param: str) -> None:
    error = refused(body)
    assert (error.code.value, error.param) == ("invalid_request", param)


@pytest.mark.parametrize(
    "body",
    [
        # The same name in different objects, or nested: nothing the gateway reads (a
        # name repeated in any one object is refused: tests/unit/test_body_repeated_names.py).
        b'{"model": "a", "tools": [{"model": 1}, {"model": 2}]}',
        b'{"model": "a", "x": {"model": 1, "stream": 2}}',
        # The name as a value, and quoted inside a string.
        b'{"model": "a", "messages": [{"role": "model", "content": "\\"model\\": \\"b\\""}]}',
        # Other names in any case, and decided-on names in another case where the gateway
        # reads nothing (nested, or `include_usage` outside `stream_options`).
        b'{"model": "a", "Temperature": 1, "Include_Usage": 1, "x": {"Model": 1, "STREAM": 2}}',
        # The bounding names nested (a tool's parameters), and a name that folds to one
        # only in more characters (Go folds one character to one: `ß` is not `ss`).
        b'{"model": "a", "tools": [{"n": 1, "N": 3, "Messages": 4}], "Me\xc3\x9fages": 1}',
    ],
)
def test_names_the_gateway_does_not_decide_on_pass(body: bytes) -> None:
    assert parse_body(body)["model"] == "a"


def test_a_deep_body_with_a_repeated_model_is_a_clean_400() -> None:
    # ~1,000 levels: the old check (json.loads with a pairs hook) hit Python's recursion
    # limit and answered 500.
    body = b'{"model": "a", "x": ' + nested(1000) + b', "model": "b"}'
    error = refused(body)
    assert error.code.value == "invalid_request"


# -- nesting ---------------------------------------------------------------------------------


def test_nesting_is_bounded_at_max_depth() -> None:
    # The top-level object is level 1.
    assert parse_body(b'{"model": "a", "x": ' + nested(MAX_DEPTH - 1) + b"}")["model"] == "a"
    error = refused(b'{"model": "a", "x": ' + nested(MAX_DEPTH) + b"}")
    assert error.code.value == "invalid_request"
    assert f"more than {MAX_DEPTH} levels" in error.message
    objects = b'{"a": ' * (MAX_DEPTH - 1) + b"1" + b"}" * (MAX_DEPTH - 1)
    assert parse_body(b'{"model": "a", "x": ' + objects + b"}")["model"] == "a"
    assert refused(b'{"model": "a", "x": {"y": ' + objects + b"}}").code.value == (
        "invalid_request"
    )


def test_the_depth_check_rests_on_orjsons_limit_of_1024() -> None:
    # body.py wraps the body in 1024 - MAX_DEPTH arrays and lets orjson refuse: if a new
    # orjson changes its limit, this test says so before the bound silently moves.
    orjson.loads(nested(1024))
    with pytest.raises(orjson.JSONDecodeError, match="depth"):
        orjson.loads(nested(1025))


def test_brackets_in_strings_are_not_nesting() -> None:
    text = "[" * (MAX_DEPTH * 4)
    doc = parse_body(orjson.dumps({"model": "a", "prompt": text}))
    assert doc["prompt"] == text


def test_beyond_orjsons_own_limit_is_invalid_json() -> None:
    assert refused(b'{"model": "a", "x": ' + nested(2000) + b"}").code.value == "invalid_json"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"model": "a", "prompt": "\xe9t\xe9"}', "invalid continuation byte at byte 26"),
        (b'{"model": "a", "prompt": "\xff\xfe"}', "invalid start byte at byte 26"),
        (b'{"model": "a", "prompt": "\xed\xa0\x80"}', "invalid continuation byte at byte 26"),
        (b'{"model": "a", "prompt": "\xe2\x82"}', "invalid continuation byte at byte 26"),
    ],
)
def test_bytes_that_are_not_utf8_are_named_as_such(body: bytes, where: str) -> None:
    # orjson says "surrogates not allowed ... column 1" of a latin-1 body: a client looking
    # for a surrogate at its first character would look in the wrong place.
    error = refused(body)
    assert error.code.value == "invalid_json"
    assert f"the body is not valid UTF-8: {where}" in error.message
    assert "surrogates" not in error.message


def test_valid_utf8_keeps_orjsons_reason() -> None:
    assert "byte order mark" in refused(b'\xef\xbb\xbf{"model": "a"}').message


# -- types of the decided-on fields --------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (b'"stream": "true"', "stream"),
        (b'"stream": 1', "stream"),
        (b'"stream": {}', "stream"),
        (b'"stream_options": "yes"', "stream_options"),
        (b'"stream_options": {"include_usage": "true"}', "stream_options.include_usage"),
    ],
)
def test_stream_fields_of_the_wrong_type_are_refused(extra: bytes, param: str) -> None:
    error = refused(b'{"model": "a", ' + extra + b"}")
    assert (error.code.value, error.param) == ("invalid_request", param)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a", "stream": null, "stream_options": null}',
        b'{"model": "a", "stream": true, "stream_options": {"include_usage": null}}',
    ],
)
def test_null_stream_fields_pass(body: bytes) -> None:
    assert parse_body(body)["model"] == "a"


# -- integers past 64 bits ------------------------------------------------------------------

# Many strings: `scan_body` does not walk them, the whole body is searched for digits.
_STRINGS = b", ".join(b'"s%d": "%d"' % (i, i) for i in range(300))


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a", "seed": 18446744073709551616}',  # 2**64: orjson reads a float
        b'{"model": "a", "seed": -9223372036854775809}',  # -2**63 - 1
        b'{"model": "a", "logit_bias": {"1": 100000000000000000000000000000}}',
        b'{"model": "a", "x": [[{"y": 1, "z": 123456789012345678901234567890}]]}',
        b'{"model": "a", "input": [' + b"1, " * 40 + b'18446744073709551616, 2], "n": 1}',
        b'{"model": "a", ' + _STRINGS + b', "seed": 99999999999999999999}',
        b'{"model": "a", "x": "' + b"9" * 100 + b'", "seed": 18446744073709551616}',
    ],
)
def test_an_integer_outside_64_bits_is_refused(body: bytes) -> None:
    """Re-encoded (an alias, stream usage, a cache salt, a hosted request), such an
    integer became a float: the backend would read another number than the client sent."""
    error = refused(body)
    assert error.code.value == "invalid_request" and "64-bit" in error.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a", "seed": 18446744073709551615, "x": -9223372036854775808}',
        b'{"model": "a", "seed": 1e19, "x": 12345678901234567890.5}',  # float literals
        b'{"model": "a", "prompt": "18446744073709551616999"}',  # digits in a string
        b'{"model": "a", ' + _STRINGS + b', "p": "99999999999999999999999"}',
    ],
)
def test_integers_within_64_bits_and_digits_in_strings_pass(body: bytes) -> None:
    assert parse_body(body)["model"] == "a"


# -- over the wire ---------------------------------------------------------------------------


def _post(gateway: Gateway, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={**gateway.headers, "content-type": "application/json", **headers},
        timeout=15,
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"model": "sim-model", "x": ' + nested(1000) + b', "model": "embed-model"}', None),
        (b'{"model": "sim-model", "mod\\u0065l": "embed-model", "messages": []}', None),
        # A server matching names without case would serve `embed-model` (and the log
        # would say `sim-model`): the body reaches no backend.
        (
            b'{"model": "sim-model", "Model": "embed-model", '
            b'"messages": [{"role": "user", "content": "hi"}]}',
            None,
        ),
        (b'{"model": "sim-model", "stream": "true", "messages": []}', None),
        # Such a server would also generate 100,000 tokens where the gateway reserved and
        # bounded one (the token budget's check, and the charge, read `max_tokens`).
        (
            b'{"model": "sim-model", "max_tokens": 1, "Max_tokens": 100000, '
            b'"messages": [{"role": "user", "content": "hi"}]}',
            None,
        ),
        (b'{"model": "sim-model", "N": 8, "messages": [{"role": "user", "content": "hi"}]}', None),
        (
            b'{"model": "sim-model", "n": 8, "n": null, '
            b'"messages": [{"role": "user", "content": "hi"}]}',
            None,
        ),
        # An alias with an escaped key is re-encoded: 2**64 became 1.8446744073709552e19.
        (b'{"mod\\u0065l": "chat", "seed": 18446744073709551616, "messages": []}', None),
        # An alias with an escaped key is re-encoded: orjson.dumps refuses depth > 254.
        (b'{"mod\\u0065l": "chat", "x": ' + nested(300) + b"}", None),
        (b'{"model": "sim-model", "prompt": "\xff\xfe"}', "invalid_json"),  # not UTF-8
        (b'{"model": "sim-model", "prompt": "\\ud800"}', "invalid_json"),  # lone surrogate
        (b'{"model": "sim-model", "max_tokens": 1e400}', "invalid_json"),  # infinity
        (b'{"model": "sim-model", "max_tokens": NaN}', "invalid_json"),
        # Encodings other than UTF-8 (a backend in Python detects them), a BOM, a second
        # document or a NUL after the first (a lenient parser reads one or the other).
        (b'\xef\xbb\xbf{"model": "sim-model", "messages": []}', "invalid_json"),
        ('{"model": "sim-model", "messages": []}'.encode("utf-16"), "invalid_json"),
        ('{"model": "sim-model", "messages": []}'.encode("utf-16-le"), "invalid_json"),
        (b'{"model": "sim-model", "messages": []} {"model": "embed-model"}', "invalid_json"),
        (b'{"model": "sim-model", "messages": []}\x00', "invalid_json"),
        (b'{"model": "sim-model", "stream": 1, "messages": []}', None),
        (b'[{"model": "sim-model", "messages": []}]', None),
        # more media than any backend takes (usage_bound.MEDIA_MOST): the count stops there
        (
            b'{"model": "sim-model", "messages": [{"role": "user", "content": ['
            + b",".join([b'{"type": "input_audio", "input_audio": {"data": "AA=="}}'] * 65537)
            + b"]}]}",
            None,
        ),
    ],
)
def test_hostile_bodies_are_400_and_reach_no_backend(
    sim_and_gateway: tuple[Sim, Gateway], body: bytes, code: str | None
) -> None:
    sim, gateway = sim_and_gateway
    response = _post(gateway, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == (code or "invalid_request")
    assert sim.app.captured("/v1/chat/completions") == []


_TEXT: Final = {"type": "text", "text": "a"}


@pytest.mark.parametrize(
    ("path", "doc"),
    [
        # one message of 5,000 text parts; a long agent history of 2 text parts a message
        ("chat/completions", {"messages": [{"role": "user", "content": [_TEXT] * 5000}]}),
        ("chat/completions", {"messages": [{"role": "user", "content": [_TEXT] * 2}] * 2100}),
        # an SGLang embeddings batch of 4,100 image objects: 4,100 media, each counted
        ("embeddings", {"input": [{"text": "a", "image": "data:image/png;base64,AAAA"}] * 4100}),
    ],
)
def test_long_honest_bodies_are_served(
    sim_and_gateway: tuple[Sim, Gateway], path: str, doc: dict[str, Any]
) -> None:
    # More than 4,096 parts and media items were refused (400) whatever the parts were.
    sim, gateway = sim_and_gateway
    model = "sim-model" if path.startswith("chat") else "embed-model"
    response = httpx.post(
        f"{gateway.url}/v1/{path}",
        content=orjson.dumps({"model": model, **doc}),
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=30,
    )
    assert len(sim.app.captured(f"/v1/{path}")) == 1, response.text  # the backend had it
    if path.startswith("chat"):  # (the simulator reads no SGLang input objects)
        assert response.status_code == 200, response.text


def test_a_very_long_model_name_is_a_bounded_404(sim_and_gateway: tuple[Sim, Gateway]) -> None:
    _, gateway = sim_and_gateway
    model = "m" * 200_000
    response = _post(gateway, orjson.dumps({"model": model, "messages": []}))
    assert response.status_code == 404
    assert len(response.json()["error"]["message"]) < 400


@pytest.mark.parametrize(
    "headers",
    [
        {b"authorization": "Bearer og-caf\xe9".encode("latin-1")},
        {b"authorization": b"Bearer \xff\xfe"},
    ],
)
def test_non_ascii_authorization_is_a_401(
    sim_and_gateway: tuple[Sim, Gateway], headers: dict[bytes, bytes]
) -> None:
    _, gateway = sim_and_gateway
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=b'{"model": "sim-model", "messages": []}',
        headers=headers,
        timeout=15,
    )
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_a_content_length_of_thousands_of_digits_is_a_413(start_sim: Any) -> None:
    # HTTP servers refuse such a header first; the app must not depend on it (Python's
    # int() refuses more than 4300 digits: this was a 500).
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    app = create_app(gateway_config([backend("gpu", sim.url, "m")]), environ={})
    app.ready = True
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [
            (b"authorization", f"Bearer {TENANT_KEY}".encode()),
            (b"content-length", b"9" * 5000),
        ],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "request_too_large"


def test_several_authorization_headers_are_a_401(start_sim: Any) -> None:
    # The first copy used to authenticate; a proxy in front may have read another one.
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    app = create_app(gateway_config([backend("gpu", sim.url, "m")]), environ={})
    app.ready = True
    sent: list[MutableMapping[str, Any]] = []
    bodies = [{"type": "http.request", "body": b'{"model": "m"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # the client stays: nothing more arrives
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    good = f"Bearer {TENANT_KEY}".encode()
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", good), (b"authorization", b"Bearer og-other")],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 401
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "invalid_api_key"
    assert sim.app.captured("/v1/chat/completions") == []
