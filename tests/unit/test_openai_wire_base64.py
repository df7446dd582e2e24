"""OpenAI's base64 encoding of an embedding, as the gateway writes it for an adapter that
answered floats to a request for base64 (gateway/upstream/openai_wire.py)."""

from __future__ import annotations

import base64

import pytest

from gateway.upstream.openai_wire import base64_embedding


def test_base64_embedding_is_openai_s_encoding() -> None:
    # OpenAI's base64 embedding of [0.5, -1.25, 3.0]: three little-endian float32s.
    assert (
        base64_embedding([0.5, -1.25, 3])
        == base64.b64encode(
            b"\x00\x00\x00\x3f" + b"\x00\x00\xa0\xbf" + b"\x00\x00\x40\x40"
        ).decode()
    )
    for bad in ([True], ["0.5"], [None], [10**40]):
        with pytest.raises(TypeError):
            base64_embedding(bad)
