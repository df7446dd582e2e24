"""Whether a hosted provider's whole answer is complete: a finish reason of its own
(`unfinished`), and one choice for each the client asked for (`short_of`).

LiteLLM 1.108.7 writes `"stop"` into a whole answer's choice whose provider gave no finish
reason or `null` (`convert_to_model_response_object` on OpenAI's wire; its `Choices`
default for every adapter) and keeps no trace of it: relayed, that answer tells the
client, and the completion record committing to it, that an answer the provider left
unfinished was complete. A stream is guarded already (gateway/upstream/hosted_stream.py).
The provider's own bytes are read by the gateway's bounded read
(gateway/upstream/hosted_bound.py keeps the last whole 2xx answer on the call's
`Outbound`); `unfinished` reads the finish reason there, in the wire formats it knows:

- OpenAI's (OpenAI, Azure, Mistral, every OpenAI-compatible server): each of `choices`
  has a `finish_reason` (or the legacy `finish_details` LiteLLM also reads) that ends it
  (finish_reasons.py `OPENAI_FINISHED`: not null, nor `error`, `abort`, `network_error`
  or another LiteLLM relays as `"stop"`), Mistral's `model_length` relabeled `length`;
- Anthropic's Messages (`"type": "message"`): a `stop_reason` that ends the turn, not
  null, nor `pause_turn` or another LiteLLM would relay as `"stop"` (anthropic_stops.py,
  whose `relabel` also gives `model_context_window_exceeded` its `length`).
- Gemini's and Vertex AI's (`candidates`): each a `finishReason` that ends the answer
  (`GEMINI_FINISHED`: not null, nor `MALFORMED_FUNCTION_CALL` and the others LiteLLM
  relays as `"stop"`);
- Bedrock Converse's (`output`, `stopReason`): a `stopReason` that ends it;
- Cohere's chat (v1 and v2, judged by the route, `COHERE_ROUTES`): a `finish_reason` that
  ends it (`COHERE_FINISHED`: not `ERROR`, `TIMEOUT`, `USER_CANCEL`, none or one
  unknown), relayed by what it means (`relabel`: LiteLLM read none, every answer `"stop"`).

- a Responses API answer (`"object": "response"`, a chat LiteLLM bridged to that API):
  a `status` that ends it (`responses_unfinished`: `completed`, or `incomplete` for
  `max_output_tokens` or `content_filter`; not `failed`, `cancelled`, `in_progress`,
  `queued`, nor incomplete for no reason, which LiteLLM relayed as `stop` or `length`).

An answer in another format, one that is not a JSON object, or none read (no
`limits.max_response_bytes`) is not judged: LiteLLM's `"stop"` may still stand in for
nothing there (docs/security.md).
Costs one more parse of a whole hosted answer (bounded by `max_response_bytes`).

LiteLLM relays the choices the provider sent, as many as it sent, and renumbers a chat's
by their place (`convert_to_model_response_object`): a provider that answered `n: 2`
with one choice, or two both numbered 0, was relayed as a 200 the client could not tell
from a full answer, and the completion record committed to it. `short_of` says why an
answer is not one choice for each asked (`n` for each prompt of a text completion), each
index from 0 once, or one embedding for each input: in the body the client would get,
and, where it was read and has OpenAI's shape, in the provider's own. Such an answer is
the provider's failure as well (`Unfinished`, 502 as the last attempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.json_loads import json_object
from gateway.upstream.anthropic_stops import relabeled, unfinished_stop
from gateway.upstream.finish_reasons import (
    COHERE_FINISHED,
    COHERE_ROUTES,
    CONVERSE_FINISHED,
    GEMINI_FINISHED,
    NO_REASON,
    OPENAI_FINISHED,
    not_finished,
    responses_unfinished,
)
from gateway.upstream.hosted_errors import HostedError

__all__ = ["Unfinished", "relabel", "short_of", "unfinished"]


class Unfinished(HostedError):
    """A whole answer its provider did not finish (`why`: by default, it gave no finish
    reason) or that holds fewer or other choices than asked: the provider's failure
    (`protocol`: another backend may serve, the breaker is charged), 502 `upstream_error`
    when it was the last attempt (gateway/api/hosted_failures.py). `why` is the gateway's
    words and counts only, never the answer's content."""

    def __init__(self, provider: str, why: str = NO_REASON) -> None:
        super().__init__(
            "protocol", f"{provider}'s answer {why}", public=f"the provider's answer {why}"
        )


def unfinished(answer: bytes | None, route: str = "") -> str | None:
    """Why `answer` (a provider's whole 2xx body, from a `provider_model` whose prefix is
    `route`) is, in a format named above, one whose provider did not finish it: a choice
    of OpenAI's wire without a reason that ends it, an Anthropic answer whose
    `stop_reason` ends no turn (gateway/upstream/anthropic_stops.py); None when it
    finished or is not judged."""
    doc = json_object(answer)
    if doc is None:
        return None
    if route in COHERE_ROUTES:  # Cohere's chat, v1 or v2: one `finish_reason`
        return not_finished([doc.get("finish_reason")], COHERE_FINISHED)
    choices = doc.get("choices")
    choices = choices if isinstance(choices, list) else []
    if doc.get("object") == "response":  # the Responses API's, under LiteLLM's bridge
        why = responses_unfinished(doc)
        if why is not None or not choices:
            return why
        # choices too: judged as well, lest `"object": "response", "status": "completed"`
        # next to a choice with no finish reason pass it as LiteLLM's "stop"
    if choices:  # OpenAI's wire (finish_reasons.py)
        return not_finished([_openai_reason(c) for c in choices], OPENAI_FINISHED)
    if doc.get("type") == "message" and "content" in doc:
        return unfinished_stop(doc.get("stop_reason"))
    candidates = doc.get("candidates")
    if isinstance(candidates, list) and candidates:  # Gemini's, Vertex AI's
        reasons = [c.get("finishReason") if isinstance(c, dict) else None for c in candidates]
        return not_finished(reasons, GEMINI_FINISHED)
    if isinstance(doc.get("output"), dict) and "stopReason" in doc:  # Bedrock's Converse
        return not_finished([doc["stopReason"]], CONVERSE_FINISHED)
    return None


def _openai_reason(choice: object) -> object:
    """A choice's finish reason on OpenAI's wire: `finish_reason`, else the legacy
    `finish_details` LiteLLM also reads (a string, or an object naming it as `type`)."""
    if not isinstance(choice, dict):
        return None
    reason = choice.get("finish_reason")
    if reason is None:
        reason = choice.get("finish_details")
        if isinstance(reason, dict):
            reason = reason.get("type")
    return reason


def relabel(result: Any, answer: bytes | None, route: str = "") -> None:
    """Give `result` (LiteLLM's whole answer) the finish reasons its provider's raw
    `answer` says where LiteLLM's say otherwise: Anthropic's and Converse's
    (anthropic_stops.py `relabeled`), Cohere's (on its `route`s), and each choice's on
    OpenAI's wire (Mistral's `model_length`, LiteLLM's `"stop"`, is `length`). LiteLLM
    keeps a provider's choices in their order."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, list):
        return
    reason = _cohere_relabeled(answer) if route in COHERE_ROUTES else relabeled(answer)
    if reason is not None and len(choices) == 1:
        choices[0].finish_reason = reason
    for place, relayed in _openai_relabeled(answer):
        if place < len(choices):
            choices[place].finish_reason = relayed


def _cohere_relabeled(answer: bytes | None) -> str | None:
    """The finish reason a whole Cohere chat answer is relayed with (`COHERE_FINISHED`),
    where LiteLLM gave `"stop"` whatever it was; None for one that ends nothing."""
    doc = json_object(answer)
    reason = doc.get("finish_reason") if doc is not None else None
    return COHERE_FINISHED.get(reason) if isinstance(reason, str) else None


def _openai_relabeled(answer: bytes | None) -> list[tuple[int, str]]:
    """The place and relayed reason of each choice of an OpenAI-wire `answer` whose
    reason is relayed by another name (`OPENAI_FINISHED`), which LiteLLM may not give."""
    renamed = [r for r, relayed in OPENAI_FINISHED.items() if r != relayed]
    if not answer or not any(f'"{r}"'.encode() in answer for r in renamed):
        return []  # most answers: no second parse
    doc = json_object(answer)
    choices = doc.get("choices") if doc is not None else None
    if not isinstance(choices, list):
        return []
    reasons = [(place, _openai_reason(c)) for place, c in enumerate(choices)]
    return [
        (place, OPENAI_FINISHED[r]) for place, r in reasons if isinstance(r, str) and r in renamed
    ]


def short_of(
    endpoint: str, params: Mapping[str, Any], body: bytes, answer: bytes | None
) -> str | None:
    """Why `body` (the OpenAI JSON the client would get) or `answer` (the provider's own,
    when read and of OpenAI's shape) is not one item for each the client asked for, each
    numbered from 0 once; None when it is."""
    key = "data" if endpoint == "embeddings" else "choices"
    asked = _asked(endpoint, params)
    for doc, own in ((body, False), (answer, True)):
        found = _indices(doc, key, required=not own)
        if found is None or sorted(found) == list(range(asked)):
            continue
        noun = "embedding(s)" if endpoint == "embeddings" else "choice(s)"
        if len(found) != asked:
            return f"held {len(found)} {noun} where {asked} were asked (incomplete)"
        return f"numbered its {noun} other than 0 to {asked - 1}, each once (incomplete)"
    return None


def _asked(endpoint: str, params: Mapping[str, Any]) -> int:
    """How many choices (or embeddings) `params` ask for: `n` (else 1) for each prompt."""
    if endpoint == "embeddings":
        return _inputs(params.get("input"))
    n = params.get("n")
    each = n if isinstance(n, int) and not isinstance(n, bool) else 1
    return each * (_inputs(params.get("prompt")) if endpoint == "completions" else 1)


def _inputs(value: Any) -> int:
    """The prompts (or inputs) in `value`: a string or one token array is one, a list of
    strings or of token arrays one each."""
    if isinstance(value, list) and value and not all(isinstance(v, int) for v in value):
        return len(value)
    return 1


def _indices(doc: bytes | None, key: str, *, required: bool) -> list[int] | None:
    """The `index` of each item of `doc`'s `key` list (`_index`); None when `doc` has no
    such list and need not have one (`required` false: the provider's own answer)."""
    parsed = json_object(doc)
    items = parsed.get(key) if parsed is not None else None
    if not isinstance(items, list):
        return [] if required else None
    return [_index(item, place, required) for place, item in enumerate(items)]


def _index(item: Any, place: int, required: bool) -> int:
    """`item`'s integer `index`; where it has none, -1, or its place when the index is
    not `required` (LiteLLM numbers a provider's unnumbered choices by their place)."""
    index = item.get("index", None if required else place) if isinstance(item, dict) else None
    return index if type(index) is int else -1
