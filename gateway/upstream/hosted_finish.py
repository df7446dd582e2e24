"""Whether a hosted provider's whole answer ended without a finish reason of its own.

LiteLLM 1.108.7 writes `"stop"` into a whole answer's choice whose provider gave no finish
reason or `null` (`convert_to_model_response_object` on OpenAI's wire; its `Choices`
default for every adapter) and keeps no trace of it: relayed, that answer tells the
client, and the completion record committing to it, that an answer the provider left
unfinished was complete. A stream is guarded already (gateway/upstream/hosted_stream.py).
The provider's own bytes are read by the gateway's bounded read
(gateway/upstream/hosted_bound.py keeps the last whole 2xx answer on the call's
`Outbound`); `unfinished` reads the finish reason there, in the wire formats it knows:

- OpenAI's (OpenAI, Azure, Mistral, every OpenAI-compatible server): each of `choices`
  has a `finish_reason` (or the legacy `finish_details` LiteLLM also reads), not null;
- Anthropic's Messages (`"type": "message"`): a `stop_reason`, not null.

Another format (Gemini, Bedrock, Cohere, a Responses API answer LiteLLM bridged), an
answer that is not a JSON object, or none read (no `limits.max_response_bytes`) is not
judged: LiteLLM's `"stop"` may still stand in for nothing there (docs/security.md).
Costs one more parse of a whole hosted answer (bounded by `max_response_bytes`).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstream.hosted_errors import HostedError

__all__ = ["Unfinished", "unfinished"]


class Unfinished(HostedError):
    """A whole answer its provider gave no finish reason: the provider's failure
    (`protocol`: another backend may serve, the breaker is charged), 502 `upstream_error`
    when it was the last attempt (gateway/api/hosted_failures.py)."""

    def __init__(self, provider: str) -> None:
        super().__init__(
            "protocol",
            f"{provider} answered without a finish reason",
            public="the provider's answer ended without a finish reason (unfinished)",
        )


def unfinished(answer: bytes | None) -> bool:
    """Whether `answer` (a provider's whole 2xx body) is, in a format named above, one
    whose provider gave no finish reason: for a choice of OpenAI's wire, or Anthropic's."""
    if not answer:
        return False
    try:
        doc: Any = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(doc, dict):
        return False
    choices = doc.get("choices")
    if isinstance(choices, list) and choices:
        return any(
            not isinstance(c, dict) or (c.get("finish_reason") or c.get("finish_details")) is None
            for c in choices
        )
    if doc.get("type") == "message" and "content" in doc:
        return doc.get("stop_reason") is None
    return False
