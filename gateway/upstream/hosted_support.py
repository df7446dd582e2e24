"""Chat fields a hosted provider's LiteLLM adapter would drop unsaid: refused instead.

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

Not covered (docs/security.md): a value LiteLLM's adapter drops though the field is
supported (`temperature` other than 1 on `openai/gpt-5`), text completions and embeddings.
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
# A field at its API default asks for nothing: losing it changes nothing.
_DEFAULTS: Final[dict[str, Any]] = {
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

    def check(
        self, litellm: ModuleType, endpoint: str, params: Mapping[str, Any], provider_model: str
    ) -> None:
        """Raise `HostedError` (`not_valid`: 400, nothing sent) for the first of a chat
        request's `params` the provider's adapter would drop, unless it is advisory or at
        its default."""
        if endpoint != "chat":
            return
        try:
            self._refuse_dropped(litellm, params, provider_model)
        except RefusedField as exc:
            raise not_valid(self._provider, exc) from None

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
