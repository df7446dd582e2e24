"""Whether a hosted backend's declared `provider` is where LiteLLM sends its traffic.

A policy judges a hosted backend by its declared `provider` (or, without one, its
`owner`): `providers.allow: [azure]`. What decides where a prompt goes is something else:
gateway/upstream/hosted.py hands LiteLLM the model's `provider_model` and the backend's
`base_url` (as `api_base`). `provider: azure` with `provider_model: openai/gpt-4o` and no
`base_url` sends to OpenAI while the policy judges Azure. `check_route` refuses that,
without importing LiteLLM (the config path never does):

- a `provider_model` names its LiteLLM provider by its prefix (`azure/...`): the prefix
  must be one LiteLLM knows (`LITELLM_PROVIDERS`, its `provider_list`; any other prefix
  is part of a model name LiteLLM would route by its model lists) and belong to the
  declared provider: the prefix itself, or one of the prefixes its entry in
  gateway/config/provider_table.py lists
  (`azure` owns `azure/`, `azure_ai/` and `azure_text/`; `google` owns `gemini/` and
  `vertex_ai/`);
- a name without a prefix goes where LiteLLM's model lists say; only the families in
  `_BARE` are taken (`gpt-...` to OpenAI, `claude-...` to Anthropic), any other needs
  its prefix;
- the OpenAI-compatible prefixes (`_AT_BASE_URL`: `openai/`, `hosted_vllm/`,
  `openai_like/`, ...) name a wire format: with a `base_url` the traffic goes there, and
  the prefix says nothing about who runs it; without one `openai/` goes to OpenAI and the
  others are refused (no host of their own);
- a prefix LiteLLM sends over aiohttp itself (`_UNBOUNDED`: `aiohttp_openai/`), not
  through httpx, is refused: what the gateway reads of an answer is bounded in httpx
  (gateway/upstream/hosted_bound.py), and such an answer would be read whole, however
  large, its redirects followed (`openai/` at the same `base_url` speaks the same wire
  format);
- a `base_url` whose host is under a domain that table lists (`api.openai.com`,
  `*.openai.azure.com`, `*.amazonaws.com`, ...), or is an API host LiteLLM itself knows
  as one provider's (its `_OWN_HOSTS`: `dashscope.aliyuncs.com`, `api.studio.nebius.ai`,
  ...), must belong to the declared provider. Any other host (an internal proxy, a
  provider neither table knows) is taken as declared.

- Azure has no default URL, and its hosts are a handful of documented forms: a backend
  judged as Azure (declared `azure`/`microsoft`, or an Azure route) must have its
  `base_url` at one of them, over https (gateway/config/azure_endpoints.py), unless it
  says `unsafe_unchecked_azure_host: true` (an API Management gateway, a custom domain).
  Without `base_url`, gateway/upstream/provider_environment.py checks `AZURE_API_BASE`
  and the like the same way at start.

Not checked: where a proxy at `base_url` forwards to, and a provider URL LiteLLM reads
from the environment (refused at start by gateway/upstream/provider_environment.py, or
for Azure checked there as above).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from gateway.config.azure_endpoints import (
    AZURE_PREFIXES,
    azure_endpoint_problem,
    is_azure_endpoint_host,
)
from gateway.config.provider_table import PROVIDERS as _PROVIDERS
from gateway.config.provider_table import Provider
from gateway.config.provider_table import provider_of as _provider_of

if TYPE_CHECKING:
    from gateway.config.backend_trust import BackendTLSSettings

__all__ = ["LITELLM_PROVIDERS", "check_private", "check_route", "is_azure", "route_of"]

# `litellm.provider_list` of the locked LiteLLM (1.108.7); tests/unit/test_provider_routes.py
# compares it with the installed one.
_LITELLM_PROVIDER_LIST = """
    a2a a2a_agent ai21 ai21_chat aiml aiohttp_openai amazon_nova anthropic anthropic_text
    apertis assemblyai auto_router aws_polly aws_textract azure azure_ai azure_speech
    azure_text baseten bedrock bedrock_mantle bespoke black_forest_labs bytez cerebras
    charity_engine chatgpt chutes clarifai cloudflare codestral cognition cohere cohere_chat
    cometapi compactifai coralbricks cortecs cursor custom custom_openai darkbloom dashscope
    databricks databricks_agent datarobot deepgram deepinfra deepseek docker_model_runner
    dotprompt edenai elevenlabs empower fal_ai featherless_ai fireworks_ai friendliai
    galadriel gdc gemini gigachat github github_copilot gradient_ai groq helicone heroku
    hosted_vllm huggingface humanloop hyperbolic inception inferenceapis infinity jina_ai
    lambda_ai langflow langfuse langgraph laya lemonade libertai litellm_agent litellm_proxy
    llamafile lm_studio manus maritalk meta meta_llama microsoft_365_copilot milvus minimax
    mistral modelscope mongodb moonshot morph nadir nano-gpt nebius neosantara nlp_cloud
    novita nscale nvidia_nim nvidia_riva oci ollama ollama_chat oobabooga openai openai_like
    openrouter ovhcloud parasail perplexity petals pg_vector pinstripes poe predibase prism
    publicai qwen_ai_platform qwencloud ragflow recraft reducto reka replicate runwayml
    s3_vectors sagemaker sagemaker_chat sagemaker_nova sail sambanova sap scaledown scaleway
    scx-ai snowflake soniox stability strands_decider synthetic tencent tensormesh
    text-completion-codestral text-completion-inception text-completion-openai together_ai
    topaz transcribe triton typesafe v0 valkey vercel_ai_gateway vertex_ai vertex_ai_beta
    vllm volcengine voyage wandb watsonx watsonx_text xai xiaomi_mimo xinference zai
"""
LITELLM_PROVIDERS: Final = frozenset(_LITELLM_PROVIDER_LIST.split())


# Prefixes that name OpenAI's wire format at the `base_url` given, not a provider.
_AT_BASE_URL: Final = frozenset(
    {
        "openai",
        "text-completion-openai",
        "openai_like",
        "custom_openai",
        "aiohttp_openai",
        "hosted_vllm",
        "vllm",
        "litellm_proxy",
        "llamafile",
        "lm_studio",
        "oobabooga",
        "xinference",
    }
)
# Prefixes LiteLLM 1.108.7 sends over aiohttp's `ClientSession` itself (its
# `BaseLLMAIOHTTPHandler`), not through httpx: refused, with the prefix to use instead.
_UNBOUNDED: Final = {"aiohttp_openai": "openai"}
# Unprefixed model names LiteLLM's model lists send to one provider (its prefix).
_BARE: Final = (
    (re.compile(r"(?:gpt-|chatgpt-|o[1-9]|text-embedding-|davinci|babbage)"), "openai"),
    (re.compile(r"claude-"), "anthropic"),
)


def _same(declared: str, owner: str) -> bool:
    """Whether `declared` names the provider `owner` (a name or prefix) stands for, in
    any case, as policies compare provider names."""
    entry = _provider_of(owner)
    return declared.lower() == owner if entry is None else _provider_of(declared) is entry


def route_of(provider_model: str) -> tuple[str | None, str]:
    """(the LiteLLM prefix `provider_model` routes by, or None when it has none LiteLLM
    knows, and what the route is called in an error)."""
    prefix, slash, _ = provider_model.partition("/")
    if slash and prefix in LITELLM_PROVIDERS:
        return prefix, f"{prefix}/"
    for pattern, owner in _BARE:
        if pattern.match(provider_model):
            return owner, f"LiteLLM's route for an unprefixed {provider_model!r}"
    return None, ""


def _host_owner(base_url: str) -> Provider | None:
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    for entry in _PROVIDERS:
        if any(host == d or host.endswith(f".{d}") for d in entry.domains):
            return entry
    return None


def is_azure(declared: str, provider_models: Iterable[str]) -> bool:
    """Whether a hosted backend is judged as, or routed to, Azure."""
    azure = _provider_of("azure")
    routes = {route_of(model)[0] for model in provider_models}
    return _provider_of(declared) is azure or not routes.isdisjoint(AZURE_PREFIXES)


def check_route(
    declared: str,
    provider_models: Iterable[str],
    base_url: str | None,
    *,
    unchecked_azure_host: bool = False,
) -> None:
    """Raise ValueError naming both when a hosted backend's traffic would go to another
    provider than `declared` (its `provider`, else its `owner`), or when an Azure
    backend's `base_url` is no Azure endpoint (and `unchecked_azure_host` is False)."""
    provider_models = list(provider_models)
    for model in provider_models:
        prefix, route = route_of(model)
        if prefix is None:
            raise ValueError(
                f"provider_model {model!r} has no LiteLLM provider prefix owngate knows "
                "(LiteLLM would pick a provider from its model lists): write it as "
                f"<provider>/<model>, e.g. {declared}/{model}"
            )
        if prefix in _UNBOUNDED:
            raise ValueError(
                f"provider_model {model!r} ({route}) is sent by LiteLLM over aiohttp "
                "directly, where the gateway cannot bound what it reads of the answer "
                "(limits.max_response_bytes) nor refuse a redirect: use "
                f"{_UNBOUNDED[prefix]}/{model.partition('/')[2]} at the same base_url"
            )
        if prefix in _AT_BASE_URL and base_url is not None:
            continue  # OpenAI's wire format at base_url: the host is checked below
        if prefix in _AT_BASE_URL and prefix not in ("openai", "text-completion-openai"):
            raise ValueError(
                f"provider_model {model!r} ({route}) has no host of its own: give the "
                "backend a base_url"
            )
        if not _same(declared, prefix):
            raise ValueError(
                f"provider_model {model!r} is sent by LiteLLM to {prefix} ({route}), but "
                f"the backend declares provider {declared!r}, which policies judge: "
                f"declare provider: {prefix}, or use a {declared} model string"
            )
    if base_url is not None:
        entry = _host_owner(base_url)
        if entry is not None and _provider_of(declared) is not entry:
            host = urlsplit(base_url).hostname
            raise ValueError(
                f"base_url host {host!r} is {entry.names[0]}'s API, but the backend "
                f"declares provider {declared!r}, which policies judge"
            )
        if is_azure(declared, provider_models):
            _check_azure_base_url(base_url, unchecked_host=unchecked_azure_host)


def _check_azure_base_url(base_url: str, *, unchecked_host: bool) -> None:
    """An Azure backend's `base_url` is https at an Azure endpoint host, or with
    `unchecked_host` (the operator's word, named unsafe: docs/security.md) https at any."""
    problem = azure_endpoint_problem(base_url, any_host=unchecked_host)
    if problem is not None:
        hatch = (
            "even with unsafe_unchecked_azure_host"
            if unchecked_host
            else "an API Management gateway or a custom domain needs "
            "unsafe_unchecked_azure_host: true"
        )
        raise ValueError(
            f"base_url of an Azure backend: {problem}; Azure traffic goes to Azure's "
            f"endpoints over https ({hatch})"
        )


# AWS's model APIs (Bedrock's, SageMaker's runtime), including their VPC endpoints
# (`vpce-x.bedrock-runtime.<region>.vpce.amazonaws.com`): not every amazonaws.com host.
_AWS_MODEL_API: Final = re.compile(r"(?:^|\.)(?:bedrock[a-z-]*|runtime(?:-fips)?\.sagemaker)\.")


def check_private(
    kind: str,
    base_url: str,
    provider: str | None,
    provider_models: Iterable[str | None],
    tls: BackendTLSSettings | None = None,
) -> None:
    """Raise ValueError when a private backend names a provider: a `provider` or a
    `provider_model` (policies judge a private backend by its owner and the names it
    serves, so either was ignored, unseen in a review: `provider: azure` passed
    `providers.deny: [azure]`), or a `base_url` at a hosted provider's model API:
    policies treat a private backend as the operator's own server, and send it what may
    never leave them. A server of the operator's own in a cloud (an EC2 or Azure VM, a
    load balancer: `*.compute.amazonaws.com`, `*.cloudapp.azure.com`) is no such host.
    Its `tls.server_name`, the name its TLS checks, is judged the same:
    `https://10.1.2.3` named `acme.openai.azure.com` is that resource's private endpoint."""
    for key, written in (("provider", [provider]), ("provider_model", provider_models)):
        if any(value is not None for value in written):
            raise ValueError(
                f"{key} applies to hosted backends only: policies judge a private backend "
                f"(kind: {kind}) by its owner and the model names it serves; remove it"
            )
    named = [("base_url host", base_url)]
    if tls is not None and tls.server_name is not None:
        named.append(("tls.server_name", f"https://{tls.server_name}"))
    for what, url in named:
        _check_private_host(kind, what, url)


def _check_private_host(kind: str, what: str, url: str) -> None:
    entry = _host_owner(url)
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if entry is None or (
        (entry.names[0] == "azure" and not is_azure_endpoint_host(host))
        or (entry.names[0] == "aws" and not _AWS_MODEL_API.search(host))
    ):
        return
    raise ValueError(
        f"{what} {host!r} is {entry.names[0]}'s hosted model API, but the backend is "
        f"a private one (kind: {kind}), which policies treat as the operator's own server "
        "(sent what may never leave it): declare it kind: hosted with provider: "
        f"{entry.names[0]} and the provider_model of each model"
    )
