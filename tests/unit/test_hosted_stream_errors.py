"""A hosted stream's failure (gateway/upstream/hosted_stream.py `ProviderStream`) says
what failed without the hosted backend's key or base URL, as a whole answer's does: a
LiteLLM refusal quotes what it was given, and the reason is shown to the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.upstream.hosted_errors import HostedError
from gateway.upstream.hosted_stream import ProviderStream

KEY = "sk-live-0123456789abcdef"
BASE = "https://llm.internal.example:8443/v1"


class _Refused(Exception):
    """What a library raises for a request it will not send: a 4xx status, its text."""

    status_code = 400


async def _refusing() -> AsyncIterator[object]:
    raise _Refused(f"Invalid request for {BASE} with key {KEY} - tools are not supported")
    yield  # an async generator


def test_a_stream_failure_never_repeats_the_key_or_the_base_url() -> None:
    stream = ProviderStream(_refusing(), None, "chat", False, "openai", secrets=(KEY, BASE))

    async def drain() -> None:
        async for _ in stream.events():
            pass

    with pytest.raises(HostedError) as failure:
        asyncio.run(drain())
    message = str(failure.value)
    assert KEY not in message and BASE not in message
    assert "not sent" in message  # still says what happened
