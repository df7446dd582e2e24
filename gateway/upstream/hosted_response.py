"""A hosted provider's answer as `HostedClient` hands it on (gateway/upstream/hosted.py):
`HostedResponse`, OpenAI JSON bytes or a stream of OpenAI SSE events, and the provider's
own ids for it and the model it names (`provider_ids`), never an id LiteLLM made up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.upstream.hosted_stream import ProviderStream, answer_id

__all__ = ["HostedResponse", "provider_ids"]


class HostedResponse:
    """A provider's answer: `body` when complete, `chunks()` for both shapes.

    Streams: `chunks()` yields one `data: {...}\\n\\n` event per provider chunk and ends
    with `data: [DONE]\\n\\n` once the provider finished it (else `HostedError`); call
    `aclose()` when the client goes away (it closes the provider connection, which stops
    the provider's work) and after the relay in any case. `usage` holds the token counts
    once the provider reported them, even when the client did not ask for the usage
    chunk.
    """

    def __init__(
        self,
        *,
        content_type: bytes,
        body: bytes | None = None,
        usage: dict[str, int] | None = None,
        stream: ProviderStream | None = None,
        provider_ids: tuple[object, list[tuple[str, str]], object] = (None, [], None),
    ) -> None:
        self.status = 200
        self.content_type = content_type
        self.body = body
        self.usage = usage
        self._stream = stream
        self._ids = provider_ids

    @property
    def provider_ids(self) -> tuple[object, list[tuple[str, str]], object]:
        """The provider's own ids for the answer, unchecked: the `id` of the answer, its
        response headers and its `model` (gateway/api/hosted_relay.py keeps only
        allow-listed, id-shaped ones). A stream's `id` and `model` are its first chunk's,
        or, when that chunk names no answer (`ProviderStream.named`), those of the first
        chunk read so far that does."""
        named = None if self._stream is None else self._stream.named
        if named is None:
            return self._ids
        return named[0], self._ids[1], named[1]

    @property
    def is_stream(self) -> bool:
        return self._stream is not None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The response bytes as they come; raises `HostedError` if the stream breaks off."""
        if self._stream is None:
            if self.body:
                yield self.body
            return
        try:
            async for data, usage in self._stream.events():
                if usage is not None:
                    self.usage = usage
                if data is not None:
                    yield data
        finally:
            await self._stream.aclose()

    async def aclose(self) -> None:
        """Stop the provider call and release its connection; safe to call repeatedly."""
        if self._stream is not None:
            await self._stream.aclose()


def provider_ids(answer: Any, carrier: Any) -> tuple[object, list[tuple[str, str]], object]:
    """The `id` of `answer`, the provider's response headers: those LiteLLM keeps on
    `carrier` as it received them (`_response_headers`), else its copies in
    `_hidden_params["additional_headers"]` (`_sent_headers`), and the `model` of `answer`
    (the one the client's body names). An id of the shape LiteLLM makes up is not the
    provider's, nor is an empty one: None (`answer_id`)."""
    received = getattr(carrier, "_response_headers", None)
    if not isinstance(received, Mapping) or not received:
        hidden = getattr(carrier, "_hidden_params", None)
        received = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    headers = _sent_headers(received if isinstance(received, Mapping) else {})
    return answer_id(answer), headers, getattr(answer, "model", None)


def _sent_headers(headers: Mapping[Any, Any]) -> list[tuple[str, str]]:
    """The headers the provider sent, from a mapping LiteLLM made: the header lines as
    they came, or (some providers' paths, and `additional_headers` always) its processed
    form, where the provider's are named `llm_provider-<header>` and LiteLLM adds a
    `request-id` of its own, a copy of the provider's `x-request-id`
    (`get_provider_request_id`). Recorded, that copy said the provider sent a header it
    never did: from a processed form only the `llm_provider-` names are taken, and a
    `request-id` equal to the `x-request-id` is left out as the copy (a provider sending
    both with one value loses one, never gains a false one)."""
    pairs = [(n, v) for n, v in headers.items() if isinstance(n, str) and isinstance(v, str)]
    if not any(name.startswith("llm_provider-") for name, _ in pairs):
        return pairs
    sent = {
        name.removeprefix("llm_provider-").lower(): value
        for name, value in pairs
        if name.startswith("llm_provider-")
    }
    if "x-request-id" in sent and sent.get("request-id") == sent["x-request-id"]:
        del sent["request-id"]
    return list(sent.items())
