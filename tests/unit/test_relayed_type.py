"""Which content types of a private backend's 2xx answer the gateway relays
(gateway/api/answer_reads.py `relayed_type`): only those its clients read as the JSON or
the event stream the gateway read, checked and recorded."""

from __future__ import annotations

import pytest

from gateway.api.answer_reads import relayed_type
from gateway.upstream.http import UpstreamError

# (content type, whether it is an event stream): what honest servers send, in any case.
RELAYED = [
    (b"application/json", False),
    (b"application/json; charset=utf-8", False),  # llama-server, Ollama
    (b"Application/JSON;charset=UTF-8", False),
    (b'application/json; charset="utf-8"', False),
    (b"application/json; x=" + b"a" * 236, False),  # 256 bytes: at the bound
    (b"text/event-stream", True),
    (b"text/event-stream; charset=utf-8", True),
    (b"Text/Event-Stream", True),
]
REFUSED = [
    b"text/html",  # a browser renders it
    b"text/plain",  # openai-node hands the caller a string
    b"application/octet-stream",
    b"application/jsonx",
    b"text/event-streaming",
    b"application/json; charset=utf-16",  # `requests` decodes UTF-8 bytes as UTF-16
    b"application/json; charset=iso-8859-1",  # another text than the bytes' UTF-8
    b"application/json; charset=utf-8; charset=latin-1",
    b"application/json; x=" + b"a" * 237,  # past the bound
    b"application/json; x=\xff",
]


@pytest.mark.parametrize(("content_type", "sse"), RELAYED)
def test_a_type_its_clients_read_as_json_or_an_event_stream_is_relayed(
    content_type: bytes, sse: bool
) -> None:
    assert relayed_type(content_type) is sse


@pytest.mark.parametrize("content_type", REFUSED)
def test_any_other_type_fails_the_attempt_as_a_shape(content_type: bytes) -> None:
    with pytest.raises(UpstreamError) as raised:
        relayed_type(content_type)
    assert raised.value.kind == "shape"
    assert "content-type" in raised.value.detail
    assert content_type.decode("latin-1") not in raised.value.detail  # the gateway's words
