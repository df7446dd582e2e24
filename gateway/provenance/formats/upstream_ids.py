"""A hosted provider's own ids for one answer, for reconciling with its usage export.

Hosted providers cannot countersign, but they name each answer: the `id` field of the
response body (`chatcmpl-...`; not one LiteLLM made up, gateway/upstream/hosted_response.py) and
request-id headers; and the model the answer names (`gpt-4o-mini-2024-07-18` for a request
sent as `openai/gpt-4o-mini`: the one its usage export bills). The completion record's
`upstream` field keeps them, from a fixed allow-list of header names only (never an
arbitrary header), each value bounded in length and limited to a charset ids and model
names use, so a provider's answer cannot put free text (or a prompt) into the log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.provenance.errors import RecordError

__all__ = ["REQUEST_ID_HEADERS", "UpstreamIds", "upstream_id", "upstream_model"]

# Header names, lowercase, that providers use for their request id.
REQUEST_ID_HEADERS: tuple[str, ...] = (
    "x-request-id",  # OpenAI, Mistral, Groq, most OpenAI-compatible APIs
    "request-id",  # Anthropic
    "openai-request-id",
    "anthropic-request-id",
    "x-amzn-requestid",  # Bedrock
    "apim-request-id",  # Azure OpenAI
    "x-goog-request-id",
)
_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}\Z")
_MODEL = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}\Z")  # Vertex names versions `name@date`


def upstream_id(value: object) -> str | None:
    """`value` if it looks like an id (a string of at most 128 id characters), else None."""
    if isinstance(value, str) and _ID.match(value):
        return value
    return None


def upstream_model(value: object) -> str | None:
    """`value` if it looks like a model name (at most 128 id characters or `@`), else None."""
    if isinstance(value, str) and _MODEL.match(value):
        return value
    return None


@dataclass(frozen=True, slots=True)
class UpstreamIds:
    """The provider's response id, request-id headers (allow-listed, checked) and the model
    its answer names (None: none, or not a model name)."""

    response_id: str | None
    request_ids: tuple[tuple[str, str], ...]
    model: str | None = None

    def __post_init__(self) -> None:
        if self.response_id is not None and upstream_id(self.response_id) is None:
            raise RecordError("upstream response_id is not an id")
        for name, value in self.request_ids:
            if name not in REQUEST_ID_HEADERS or upstream_id(value) is None:
                raise RecordError(f"upstream request id header {name!r} is not allowed or valid")
        if self.model is not None and upstream_model(self.model) is None:
            raise RecordError("upstream model is not a model name")

    @classmethod
    def of(
        cls, response_id: object, headers: Iterable[tuple[str, str]], model: object = None
    ) -> UpstreamIds | None:
        """The ids worth keeping from a provider's answer (None when there are none):
        allow-listed headers, first value of each, invalid values dropped; the model its
        answer names, if it is a model name."""
        kept: dict[str, str] = {}
        for name, value in headers:
            lower = name.lower()
            if lower in REQUEST_ID_HEADERS and lower not in kept and upstream_id(value):
                kept[lower] = value
        ids = cls(upstream_id(response_id), tuple(sorted(kept.items())), upstream_model(model))
        found = ids.response_id is not None or ids.request_ids or ids.model is not None
        return ids if found else None

    def field(self) -> dict[str, object]:
        return {
            "response_id": self.response_id,
            "request_ids": [{"header": n, "value": v} for n, v in self.request_ids],
            "model": self.model,
        }
