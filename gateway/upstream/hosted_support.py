"""Request fields a hosted provider's LiteLLM adapter would drop unsaid: refused instead.

The gateway calls LiteLLM with `drop_params=True` (gateway/upstream/hosted.py), so a
field the provider's adapter does not take is left out of the call without a word:
LiteLLM 1.108.7's `get_optional_params` drops every field missing from
`get_supported_openai_params(model, custom_llm_provider)`. A client that asked Anthropic
for `n: 2` got one choice, one that asked for `seed`, `logprobs` or `logit_bias` got an
answer made without them, and nothing said so. Such a field is refused (400 naming the
field, and the provider in the operator's message; nothing sent), unless it is advisory
(`ADVISORY`: it changes who is billed or tracked, not what the answer is) or holds the
API's default, which asks for nothing (`n: 1`, `logprobs: false`, a penalty of 0, ...).

Support depends on the model as well as the route (`openai/o1` takes no `top_p`,
`openai/gpt-5` no `stop`, `bedrock/meta.llama3-...` no `tools`), so what each
`provider_model` supports is LiteLLM's own answer, asked once per model and kept
(`SupportTable`). It cannot be asked when the config loads: LiteLLM is imported before
traffic or by the first hosted request, never on the private path.

On Bedrock it depends on the request too: a model LiteLLM sends to bedrock-runtime's
native Chat Completions (`bedrock/chat_completions/...`, GPT 5.6 and newer, Grok) goes to
Converse instead when the request holds `stop`, a `json_object` `response_format`, tools
on some models, ... (LiteLLM's `bedrock_route_for_request`), and its fields are then
mapped by Converse's list, which lacks `seed`, `logprobs` and the penalties. For such a
model the route is LiteLLM's answer for each request (a dict lookup and a few `get`s) and
the table is kept per model and route: before, `seed` with `stop` was dropped unsaid.
Grok and GPT 5.6 and newer on Bedrock list `stop` but both routes drop it
(`bedrock_rejects_stop_sequences`: AWS refuses it for them): refused as not taken.

Text completions and embeddings lost fields the same way. LiteLLM sends a text completion
to the provider's `/completions` only on OpenAI-style text routes (`openai/<a model not in
its chat catalog>`, `text-completion-openai/`, `azure_text/`, `text-completion-codestral/`
and the OpenAI-compatible servers it lists); on any other it asks the provider's chat
adapter, which drops as for a chat (`seed` and `n` to Anthropic were left out): such a
request is judged by the chat table. A chat carries neither several prompts (LiteLLM asked
one chat of them all, one user message, and its one choice was 502 after the provider had
been sent them, the breaker charged) nor a text completion's own `echo`, `suffix` and
`best_of` (LiteLLM hands them to the adapter as the provider's own fields, top-level keys
of Anthropic's Messages body, which a provider ignoring them answered without): each is
refused unless at its default (`_refuse_text_only`). An embeddings request's `dimensions`
was dropped for a model LiteLLM does not think takes it (`openai/<not text-embedding-3>`,
Mistral): it is refused there, by LiteLLM's own mapping (`get_optional_params_embeddings`,
asked once per model: a pure function). `encoding_format` is not refused: an adapter that
drops it (Gemini, Vertex AI) answers floats, which gateway/upstream/openai_wire.py writes
in base64 when that was asked (the OpenAI SDKs' default: a refusal would fail them all),
and `user` is advisory.

Not covered (docs/security.md): a value LiteLLM's adapter drops though the field is
supported (`temperature` other than 1 on `openai/gpt-5`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import partial
from types import ModuleType
from typing import Any, Final

from gateway.upstream.hosted_errors import HostedError
from gateway.upstream.hosted_fields import RefusedField
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_request import forwarded_fields

__all__ = ["ADVISORY", "SupportTable", "dropped_fields", "not_valid"]

# Fields whose loss leaves the answer as asked: end-user and cache identifiers, the
# provider's billing tier. Dropped as LiteLLM drops them (docs/api.md says so).
ADVISORY: Final = frozenset({"user", "safety_identifier", "prompt_cache_key", "service_tier"})
# Fields LiteLLM reads itself, never checked against a provider's list.
_OWN: Final = frozenset({"messages", "stream", "stream_options"})
# The provider is named only in the operator's message (`not_valid`): which hosted provider
# a request was headed for is a routing internal (gateway/upstream/hosted_errors.py).
_WHY: Final = (
    "this model's provider does not take it (LiteLLM would leave it out and answer without it)"
)
# A text completion's fields a chat has not: refused where LiteLLM asks a chat adapter
# (see the module's notes), unless at their defaults.
_TEXT_ONLY: Final = ("best_of", "echo", "suffix")
_NOT_A_CHAT: Final = "LiteLLM asks this model's provider as a chat, which has no such field"
_ONE_PROMPT: Final = (
    "a single prompt for this model's provider (LiteLLM asks it as one chat of them all)"
)
# A field at its API default asks for nothing: losing it changes nothing.
_DEFAULTS: Final[dict[str, Any]] = {
    "best_of": 1,
    "echo": False,
    "n": 1,
    "logprobs": False,
    "top_logprobs": 0,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "parallel_tool_calls": True,
    "logit_bias": {},
}


def dropped_fields(
    litellm: ModuleType, provider_model: str, api_base: str | None, route: str | None = None
) -> frozenset[str]:
    """The chat fields LiteLLM's adapter for `provider_model` does not take, of those the
    gateway forwards (gateway/upstream/openai_request.py), as LiteLLM says; empty when
    LiteLLM cannot name the provider (its call fails the same way, unsent). `route`
    "converse": a request `bedrock_router` sends to Converse, as `get_optional_params` maps it."""
    try:
        model, provider, _, _ = litellm.get_llm_provider(provider_model, api_base=api_base)
        ask = litellm.get_supported_openai_params
        if route == "converse":
            supported = litellm.AmazonConverseConfig().get_supported_openai_params(model=model)
        else:
            supported = ask(model=model, custom_llm_provider=provider)
        if supported is None:  # LiteLLM falls back to OpenAI's list (`get_optional_params`)
            supported = ask(model=model, custom_llm_provider="openai")
        supported = set(supported or ())
        if provider == "bedrock" and _bedrock_utils().bedrock_rejects_stop_sequences(model):
            supported.discard("stop")  # listed, but both routes' mappings drop it
    except Exception:  # noqa: BLE001 - an unknown model: the call itself is refused unsent
        return frozenset()
    return frozenset(forwarded_fields("chat") - _OWN - supported)


def _bedrock_utils() -> ModuleType:
    """LiteLLM's Bedrock helpers (imported with LiteLLM: a lookup)."""
    return importlib.import_module("litellm.llms.bedrock.common_utils")


class SupportTable:
    """What each `provider_model` of one hosted backend would lose, asked of LiteLLM once."""

    def __init__(self, provider: str, api_base: str | None) -> None:
        self._provider = provider
        self._api_base = api_base
        self._dropped: dict[tuple[str, str | None], frozenset[str]] = {}
        # provider_model -> LiteLLM's route for a request's params, where it varies by them
        self._routed: dict[str, Callable[[Mapping[str, Any]], str] | None] = {}
        # provider_model -> whether LiteLLM sends a text completion to it as a chat
        self._chatted: dict[str, bool] = {}
        # provider_model -> whether LiteLLM leaves an embeddings request's `dimensions` out
        self._undimensioned: dict[str, bool] = {}

    def check(
        self, litellm: ModuleType, endpoint: str, params: Mapping[str, Any], provider_model: str
    ) -> None:
        """Raise `HostedError` (`not_valid`: 400, nothing sent) for the first of a
        request's `params` the provider's adapter would drop, unless it is advisory or at
        its default: a chat's, a text completion's LiteLLM sends as a chat, an embeddings
        request's `dimensions`."""
        try:
            if endpoint == "completions" and self._as_chat(litellm, provider_model):
                _refuse_text_only(params)
                self._refuse_dropped(litellm, params, provider_model)
            elif endpoint == "chat":
                self._refuse_dropped(litellm, params, provider_model)
            elif endpoint == "embeddings" and "dimensions" in params:
                if self._undimensioned.get(provider_model) is None:
                    undimensioned = drops_dimensions(litellm, provider_model, self._api_base)
                    self._undimensioned[provider_model] = undimensioned
                if self._undimensioned[provider_model]:
                    raise RefusedField("dimensions", _WHY)
        except (RefusedField, InvalidField) as exc:
            raise not_valid(self._provider, exc) from None

    def _as_chat(self, litellm: ModuleType, provider_model: str) -> bool:
        if provider_model not in self._chatted:
            self._chatted[provider_model] = completes_as_chat(
                litellm, provider_model, self._api_base
            )
        return self._chatted[provider_model]

    def _refuse_dropped(
        self, litellm: ModuleType, params: Mapping[str, Any], provider_model: str
    ) -> None:
        route = self._route(litellm, params, provider_model)
        dropped = self._dropped.get((provider_model, route))
        if dropped is None:
            dropped = dropped_fields(litellm, provider_model, self._api_base, route) - ADVISORY
            self._dropped[provider_model, route] = dropped
        for name in sorted(dropped.intersection(params)):
            if _at_default(name, params[name]):
                continue
            raise RefusedField(name, _WHY)

    def _route(
        self, litellm: ModuleType, params: Mapping[str, Any], provider_model: str
    ) -> str | None:
        """LiteLLM's Bedrock route for this request where it varies by request (a model
        on bedrock-runtime's native Chat Completions), else None."""
        if provider_model not in self._routed:
            self._routed[provider_model] = bedrock_router(litellm, provider_model, self._api_base)
        router = self._routed[provider_model]
        return None if router is None else str(router(params))


def bedrock_router(
    litellm: ModuleType, provider_model: str, api_base: str | None
) -> Callable[[Mapping[str, Any]], str] | None:
    """LiteLLM's route for a request's params, when `provider_model` is a Bedrock model
    whose requests go to bedrock-runtime's native Chat Completions or to Converse by what
    they hold (`get_optional_params` then maps them by Converse's list), else None."""
    try:
        model, provider, _, _ = litellm.get_llm_provider(provider_model, api_base=api_base)
        if provider != "bedrock":
            return None
        config = litellm.utils.ProviderConfigManager.get_provider_chat_config(
            model=model, provider=litellm.LlmProviders(provider)
        )
        if not isinstance(config, litellm.AmazonBedrockRuntimeChatCompletionsConfig):
            return None
        bedrock = _bedrock_utils()
    except Exception:  # noqa: BLE001 - as in `dropped_fields`: the call is refused unsent
        return None
    return partial(bedrock.bedrock_route_for_request, model, additional_drop_params=None)


# LiteLLM 1.108.7's text-completion routes (`text_completion` in its main.py, with the
# OpenAI-compatible servers of `openai_text_completion_compatible_providers`).
_TEXT_ROUTES: Final = frozenset(
    {"text-completion-openai", "text-completion-codestral", "azure_text"}
)


def completes_as_chat(litellm: ModuleType, provider_model: str, api_base: str | None) -> bool:
    """Whether LiteLLM sends a text completion for `provider_model` to the provider's chat
    adapter (its fields then mapped as a chat's), not to an OpenAI-style `/completions`."""
    try:
        model, provider, _, _ = litellm.get_llm_provider(provider_model, api_base=api_base)
        if provider == "openai":
            return model in litellm.open_ai_chat_completion_models
        text = _TEXT_ROUTES.union(litellm.openai_text_completion_compatible_providers)
    except Exception:  # noqa: BLE001 - an unknown model: the call itself is refused unsent
        return False
    return provider not in text


def drops_dimensions(litellm: ModuleType, provider_model: str, api_base: str | None) -> bool:
    """Whether LiteLLM's embeddings mapping for `provider_model` leaves `dimensions` out
    (`get_optional_params_embeddings`, pure: asked with and without it)."""
    try:
        model, provider, _, _ = litellm.get_llm_provider(provider_model, api_base=api_base)
        mapping = partial(
            litellm.utils.get_optional_params_embeddings,
            model=model,
            custom_llm_provider=provider,
            drop_params=True,
        )
        return bool(mapping() == mapping(dimensions=256))
    except Exception:  # noqa: BLE001 - as in `dropped_fields`: the call fails the same way
        return False


def _refuse_text_only(params: Mapping[str, Any]) -> None:
    """A text completion LiteLLM asks as a chat: `InvalidField` for several prompts,
    `RefusedField` for a field of `_TEXT_ONLY` not at its default."""
    prompt = params.get("prompt")
    if isinstance(prompt, list) and sum(isinstance(p, str) for p in prompt) > 1:
        raise InvalidField("prompt", _ONE_PROMPT)
    for name in _TEXT_ONLY:
        if name in params and not _at_default(name, params[name]):
            raise RefusedField(name, _NOT_A_CHAT)


def _at_default(name: str, value: Any) -> bool:
    """Whether `value` is the API's default for `name` (JSON's `false` is not 0)."""
    if name not in _DEFAULTS:
        return False
    default = _DEFAULTS[name]
    return isinstance(value, bool) == isinstance(default, bool) and value == default


def not_valid(provider: str, exc: InvalidField | RefusedField) -> HostedError:
    """The 400 (`upstream_bad_request`, nothing sent) for a request `provider` must not get."""
    public = f"the request is not valid for this model's provider (not sent): {exc}"
    private = f"the request is not valid for {provider} (not sent): {exc}"
    return HostedError("status", private, status=400, param=exc.param, public=public)
