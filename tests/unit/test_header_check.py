"""uvicorn's header value check in one pass (gateway/header_check.py): the same answer as
uvicorn's regex for every value, installed by the uvicorn settings every server uses."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.protocols.http import httptools_impl

from gateway.header_check import CONTROL_BYTES, UVICORN_PATTERN, HeaderValueCheck, install
from gateway.serving import uvicorn_config
from tests.helpers.listener_protocol import GET, RecordingTransport, listener_protocol

# uvicorn 0.x's own pattern, spelled out: the check must answer as it does.
UVICORN_REGEX = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("not called")


def test_every_byte_is_judged_as_uvicorn_judges_it() -> None:
    check = HeaderValueCheck()
    for byte in range(256):
        for value in (bytes([byte]), b"abc" + bytes([byte]) + b"def"):
            assert bool(check.search(value)) == bool(UVICORN_REGEX.search(value)), value
    assert set(CONTROL_BYTES) == {b for b in range(256) if UVICORN_REGEX.search(bytes([b]))}
    assert not check.search(b"") and not check.search(b"tab\there, and ~!@#$%^&*()")


@given(st.binary(max_size=3000))
def test_any_value_is_judged_as_uvicorn_judges_it(value: bytes) -> None:
    assert bool(HeaderValueCheck().search(value)) == bool(UVICORN_REGEX.search(value))


def test_the_servers_settings_give_uvicorn_the_one_pass_check() -> None:
    uvicorn_config(_app)
    assert isinstance(httptools_impl.HEADER_VALUE_RE, HeaderValueCheck)
    # a receipt-sized value of base64 passes, one control byte in it does not
    receipt = b"QUJD+/=" * 360
    assert not httptools_impl.HEADER_VALUE_RE.search(receipt)
    assert httptools_impl.HEADER_VALUE_RE.search(receipt + b"\r\nx-injected: 1")


def _answer_with(value: bytes) -> tuple[list[BaseException], bytes]:
    """Answer one GET through the listener's protocol with header `x-receipt: value`:
    what `send` raised, and what the connection wrote."""
    raised: list[BaseException] = []
    transport = RecordingTransport()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"x-receipt", value), (b"content-length", b"2")],
                }
            )
            await send({"type": "http.response.body", "body": b"{}"})
        except RuntimeError as exc:
            raised.append(exc)

    async def scenario() -> None:
        protocol = listener_protocol(app)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(GET)
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
        protocol.connection_lost(None)

    asyncio.run(scenario())
    return raised, b"".join(transport.writes)


@pytest.mark.parametrize("control", [b"\r\n", b"\n", b"\x00", b"\x7f", b"\x1b"])
def test_a_header_value_with_a_control_byte_is_still_refused_by_the_server(
    control: bytes,
) -> None:
    raised, written = _answer_with(b"QUJD" * 400 + control + b"x-injected: 1")
    assert [str(exc) for exc in raised] == ["Invalid HTTP header value."]
    assert b"x-injected" not in written


def test_a_receipt_sized_base64_value_goes_out() -> None:
    value = b"QUJD+/==\t" * 300
    raised, written = _answer_with(value)
    assert raised == []
    assert b"x-receipt: " + value + b"\r\n" in written and written.endswith(b"{}")


@pytest.mark.parametrize(
    "pattern",
    [
        b"[\x00-\x1f\x7f]",  # uvicorn before 0.30: a tab refused too
        b"[\x00-\x08\x0a-\x1f\x7f-\xff]",  # one that refuses more (obs-text)
    ],
)
def test_another_uvicorn_check_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, pattern: bytes
) -> None:
    """`install` replaces only the pattern `HeaderValueCheck` answers as: over any other,
    the one-pass check would let through what that uvicorn refuses."""
    own = re.compile(pattern)
    monkeypatch.setattr(httptools_impl, "HEADER_VALUE_RE", own)
    install()
    assert httptools_impl.HEADER_VALUE_RE is own
    monkeypatch.setattr(httptools_impl, "HEADER_VALUE_RE", re.compile(UVICORN_PATTERN))
    install()
    assert isinstance(httptools_impl.HEADER_VALUE_RE, HeaderValueCheck)


def test_the_pattern_reproduced_is_uvicorn_s_own() -> None:
    assert UVICORN_REGEX.pattern == UVICORN_PATTERN
