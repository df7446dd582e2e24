"""A hosted provider's answer as `HostedClient` hands it on (gateway/upstream/hosted.py):
`HostedResponse`, OpenAI JSON bytes or a stream of OpenAI SSE events, and the provider's
own ids for it and the model it names (`provider_ids`), never an id LiteLLM made up."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from gateway.upstream.hosted_stream import ProviderStream

__all__ = ["HostedResponse", "provider_ids"]

# LiteLLM names an answer itself when the provider's carries no id, or one it does not
# carry over (Anthropic's `msg_...`): `chatcmpl-` and a random UUID (`generate_id` in
# litellm/types/utils.py). Recorded as the provider's, an auditor would look for it in
# the provider's usage export in vain: it is recorded as missing. (A provider that names
# its answers the same way loses its id from the record, never gains a false one.)
_MADE_UP_ID: Final = re.compile(
    r"chatcmpl-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z"
)


class HostedResponse:
    """A provider's answer: `body` when complete, `chunks()` for both shapes.

    Streams: `chunks()` yields one `data: {...}\\n\\n` event per provider chunk and ends
    with `data: [DONE]\\n\\n` once the provider finished it (else `HostedError`); call
    `aclose()` when the client goes away (it closes the provider connection, which stops
    the provider's work) and after the relay in any case. `usage` holds the token counts
    once the provider reported them, even when the client did not ask for the usage
    chunk. `ignored_fields` names request fields not sent.
    """

    def __init__(
        self,
        *,
        content_type: bytes,
        body: bytes | None = None,
        usage: dict[str, int] | None = None,
        ignored_fields: tuple[str, ...] = (),
        stream: ProviderStream | None = None,
        provider_ids: tuple[object, list[tuple[str, str]], object] = (None, [], None),
    ) -> None:
        self.status = 200
        self.content_type = content_type
        self.body = body
        self.usage = usage
        self.ignored_fields = ignored_fields
        self._stream = stream
        # The provider's own ids for the answer, unchecked: the `id` of the answer (of a
        # stream's first chunk), its response headers and its `model` (gateway/api/
        # hosted_relay.py keeps only allow-listed, id-shaped ones).
        self.provider_ids = provider_ids

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
    (the one the client's body names). An id of the shape LiteLLM makes up
    (`_MADE_UP_ID`) is not the provider's: None."""
    answer_id = getattr(answer, "id", None)
    if isinstance(answer_id, str) and _MADE_UP_ID.match(answer_id):
        answer_id = None
    received = getattr(carrier, "_response_headers", None)
    if not isinstance(received, Mapping) or not received:
        hidden = getattr(carrier, "_hidden_params", None)
        received = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    headers = _sent_headers(received if isinstance(received, Mapping) else {})
    return answer_id, headers, getattr(answer, "model", None)


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
