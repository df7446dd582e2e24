"""What a private backend may not be sent, judged before each private attempt's dispatch
record: its media URLs (gateway/api/attempt_media.py), and, for a `kind: openai`
backend, the fields a hosted provider would act on beyond answering.

A `kind: openai` backend may be a router in front of hosted providers (a LiteLLM proxy on
the organisation's provider account): it passes on what a hosted attempt refuses
(gateway/upstream/hosted_fields.py `refuse_provider_actions`): `web_search_options` (the
provider searches with text from the prompt), `audio` and an `audio` modality (spoken
output it may keep), `store: true` (a stored completion), and prompt caches the client
asks for (`cache_control` and `cachePoint` markers, which LiteLLM turns into Anthropic's
and Bedrock's caches and Gemini's `cachedContents`, with the client's `ttl`;
`prompt_cache_retention` past in memory). The policy admitted the backend for its
declared retention, not the client's; before, those reached such a backend as sent. So
its attempt is held to the hosted rule: not made (no record; the plan's next backend may
serve), and when nothing else serves, the client gets the 400 a hosted backend gives
(`upstream_bad_request` naming the field, nothing sent) with a refusal record (rule
`owngate/hosted_request`). The same holds on /v1/completions: a LiteLLM proxy's
`text_completion` makes the prompt a chat message and passes the body's other fields to
`completion()` as sent (LiteLLM 1.108.7, main.py), so `{"prompt": ..., "store": true}` was
a stored completion; before, only chat requests were judged. vLLM, llama.cpp and SGLang
backends act on none of them and get the request as sent. A top-level name of the rule
in another case (`"Store"`) is judged as `store`: a router in Go reads it so.

A LiteLLM proxy also reads the body's `metadata` as its own request metadata, and some of
its keys choose the deployment (LiteLLM 1.108.7): `tags` (tag-based routing: the
deployments tagged so, perhaps another region's, router_strategy/tag_based_routing.py),
`_routing_request_tags` (read before `tags`), `inherited_tags` (taken as the key's and
team's own tag policy), `deployment`, `model_group`, `model_info` and the routers'
recorded decisions; others turn its caching or guardrails (`enable_prompt_caching`,
`disable_global_guardrails`, `opted_out_global_guardrails`, `litellm_disabled_callbacks`),
run a guardrail the client names (`guardrails`: its service gets the prompt) or answer
from another cache (`redis_namespace`, `caching_groups`).
The policy admitted the backend, not whatever the router behind it picks from such keys:
they are refused for a `kind: openai` backend as the hosted rule's fields are (`metadata.
tags`; before, they reached it as sent), in a `metadata` of any case (`"Metadata"`: a
router in Go reads it as `metadata`), on every endpoint (its Router routes an embedding
by `tags` too). Other `metadata` keys pass, as the API has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.api.attempt_media import media_refusal
from gateway.api.labels import excerpt
from gateway.api.private_media import MediaRefs
from gateway.api.refusal import HOSTED_CHECKS_RULE, MEDIA_URLS_RULE
from gateway.errors import ErrorCode, GatewayError
from gateway.routing.registry import BackendState, Registry
from gateway.routing.router import Attempt
from gateway.upstream.hosted_fields import CACHE_MARKERS, RefusedField, refuse_provider_actions

# `metadata` keys a LiteLLM proxy routes, caches or skips guardrails by (see above).
ROUTER_METADATA: Final = (
    "tags",
    "_routing_request_tags",
    "inherited_tags",
    "deployment",
    "deployment_model_name",
    "model_group",
    "original_model_group",
    "model_info",
    "model_config",
    "previous_models",
    "routing_decision",
    "quality_router_decision",
    "adaptive_router_decision",
    "adaptive_router_chosen_model",
    "enable_prompt_caching",
    "disable_global_guardrails",
    "opted_out_global_guardrails",
    "litellm_disabled_callbacks",
    # a guardrail the client asks for (by name, or with its own `extra_body`): its service
    # gets the prompt (`CustomGuardrail.get_guardrail_from_metadata`), as a callback's does
    "guardrails",
    # an answer from another cache: another namespace's keys, another model group's
    # answers (caching/caching.py, `_add_namespace_to_cache_key`, `_get_caching_group`)
    "redis_namespace",
    "caching_groups",
)

__all__ = ["ROUTER_METADATA", "RouterFields", "private_refusal"]

_ROUTER: Final = "a router that may pass it to a hosted provider"
_METADATA: Final = "metadata"
_JUDGED: Final = frozenset({"chat", "completions"})
# The hosted rule's top-level fields, by their case-folded names (`_refuse_other_cases`).
_FOLDED: Final = {
    name.casefold(): name
    for name in (
        "web_search_options",
        "audio",
        "modalities",
        "store",
        "prompt_cache_retention",
        *CACHE_MARKERS,
    )
}
_LENGTHS: Final = frozenset(map(len, _FOLDED))


class RouterFields:
    """The hosted rule for one request, judged at most once: when a `kind: openai`
    attempt comes (most requests never reach one, and a chat body's walk for cache
    markers is linear in its size)."""

    __slots__ = ("_doc", "_judged", "_provider_actions", "_refused")

    def __init__(self, doc: Mapping[str, Any], endpoint: str) -> None:
        self._doc = doc
        # The hosted rule's fields are chat fields, and a text completion's too: LiteLLM's
        # `text_completion` passes the body's other fields on to `completion()` as sent.
        # The router's `metadata` keys are judged on every endpoint: its Router picks an
        # embedding's deployment by them too (`aembedding`, tag-based routing).
        self._provider_actions = endpoint in _JUDGED
        self._judged = False
        self._refused: GatewayError | None = None

    def refusal(self, backend: BackendState) -> GatewayError | None:
        """The 400 for sending the request to `backend`, or None: it may have it."""
        if backend.config.kind != "openai":
            return None
        if not self._judged:
            self._judged = True
            try:
                if self._provider_actions:
                    refuse_provider_actions(self._doc)
                    _refuse_other_cases(self._doc)
                _refuse_router_metadata(self._doc)
            except RefusedField as exc:
                self._refused = GatewayError(
                    ErrorCode.upstream_bad_request,
                    f"the request is not valid for this model's backend, {_ROUTER} "
                    f"(not sent): {exc}",
                    param=exc.param,
                )
        return self._refused


def _refuse_other_cases(doc: Mapping[str, Any]) -> None:
    """`RefusedField` naming a top-level field of the hosted rule written in another case
    (`"Store": true`, `"Web_Search_Options"`) whose value the rule refuses: a router in Go
    (encoding/json and its look-alikes) matches names without regard to case, folding
    U+017F and U+212A to `s` and `k`, and reads the last match."""
    for name, value in doc.items():
        if len(name) not in _LENGTHS:
            continue
        spelled = _FOLDED.get(name.casefold())
        if spelled is None or spelled == name:  # the exact spelling: judged already
            continue
        try:
            refuse_provider_actions({spelled: value})
        except RefusedField:
            raise RefusedField(excerpt(name), f"a router may read it as `{spelled}`") from None


def _refuse_router_metadata(doc: Mapping[str, Any]) -> None:
    """`RefusedField` naming the first non-null `metadata` key a LiteLLM proxy routes,
    caches or skips its guardrails by (`ROUTER_METADATA`), in a `metadata` of any case: a
    router in Go reads `"Metadata"` as `metadata` (and passes it on so spelled)."""
    for name, metadata in doc.items():
        if len(name) != len(_METADATA) or not isinstance(metadata, dict):
            continue  # (a `metadata` not an object or null is refused for all backends)
        if name != _METADATA and name.casefold() != _METADATA:
            continue
        for key in ROUTER_METADATA:
            if metadata.get(key) is not None:
                raise RefusedField(
                    f"metadata.{key}",
                    "a LiteLLM proxy routes, caches or skips its guardrails by it, past the "
                    "backend the policy admitted"
                    + ("" if name == _METADATA else " (a router may read the name as `metadata`)"),
                )


def private_refusal(
    media: MediaRefs | None, routers: RouterFields, registry: Registry, attempt: Attempt
) -> tuple[GatewayError, str, str] | None:
    """(the client's 400, the rule its refusal record names, why the attempt was not
    made) when `attempt`'s private backend may not be sent the request; None when it may,
    or when `attempt` is a hosted one (its own checks: gateway/api/hosted_relay.py)."""
    if not attempt.private:
        return None
    refused = None if media is None else media_refusal(media, registry, attempt)
    if refused is not None:
        return refused, MEDIA_URLS_RULE, "media URL"
    refused = routers.refusal(attempt.backend)
    if refused is not None:
        return refused, HOSTED_CHECKS_RULE, "a field a hosted provider would act on"
    return None
