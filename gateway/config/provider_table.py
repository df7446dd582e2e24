"""Which names, LiteLLM prefixes and API hosts belong to one hosted provider.

One entry is one company, whatever the operator calls it: `google` is also `gemini`,
`vertex_ai` and `vertex_ai_beta`. gateway/config/provider_routes.py checks a backend's
routes and hosts against it; gateway/config/facts.py gives a policy every name of a
hosted backend's provider (`provider_names`), which its provider globs match.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["PROVIDERS", "Provider", "provider_names", "provider_of"]


class Provider(NamedTuple):
    names: tuple[str, ...]  # what `provider:` may say for it (its prefixes also count)
    prefixes: tuple[str, ...]  # LiteLLM prefixes that send to it
    domains: tuple[str, ...]  # its API hosts are these or under them


# The API hosts the locked LiteLLM knows as one provider's (its
# `openai_compatible_endpoints`, the default api_base `get_llm_provider` gives a prefix,
# its JSON-configured OpenAI-like providers) and the table below does not cover:
# `provider: openai` with `openai/qwen-max` at `https://dashscope.aliyuncs.com/...`
# loaded, judged as OpenAI while its prompts went to Alibaba Cloud. A line is the
# provider's name, `+` its other LiteLLM prefixes, then its hosts.
# tests/unit/test_provider_routes.py compares them with the installed LiteLLM.
_OWN_HOST_LIST = """
    abliteration api.abliteration.ai
    ai21+ai21_chat api.ai21.com
    aihubmix aihubmix.com
    aiml api.aimlapi.com
    anyscale api.endpoints.anyscale.com
    apertis api.stima.tech
    assemblyai llm-gateway.assemblyai.com
    baseten inference.baseten.co
    cerebras api.cerebras.ai
    charity_engine api.charityengine.services
    chutes llm.chutes.ai
    clarifai api.clarifai.com
    cognition api.cognition.ai
    coralbricks inference.coralbricks.ai
    cortecs api.cortecs.ai
    crusoe api.inference.crusoecloud.com
    darkbloom api.darkbloom.dev
    dashscope+qwencloud+qwen_ai_platform dashscope.aliyuncs.com dashscope-intl.aliyuncs.com
    datarobot app.datarobot.com
    edenai api.edenai.run
    empiriolabs api.empiriolabs.ai
    empower app.empower.dev
    featherless_ai api.featherless.ai
    friendliai api.friendli.ai
    galadriel api.galadriel.ai api.galadriel.com
    gigachat gigachat.devices.sberbank.ru
    gmi api.gmi-serving.com
    gradient_ai inference.do-ai.run
    helicone ai-gateway.helicone.ai
    hyperbolic api.hyperbolic.xyz
    inception api.inceptionlabs.ai
    inferenceapis api.inferenceapis.com
    jina_ai api.jina.ai
    lambda_ai api.lambda.ai
    libertai api.libertai.io
    llamagate api.llamagate.dev
    manus api.manus.im
    modelscope api-inference.modelscope.cn
    moonshot api.moonshot.ai
    morph api.morphllm.com
    nadir api.getnadir.com
    nano-gpt nano-gpt.com
    nebius api.studio.nebius.ai
    neosantara api.neosantara.xyz
    novita api.novita.ai
    nscale inference.api.nscale.com
    nvidia_nim integrate.api.nvidia.com
    ollama ollama.com
    parasail api.parasail.io
    pinstripes pinstripes.io
    poe api.poe.com
    prism api.prisminference.com
    publicai api.publicai.co
    reka api.reka.ai
    sail api.sailresearch.com
    sambanova api.sambanova.ai
    sarvam api.sarvam.ai
    scaleway api.scaleway.ai
    scx-ai api.scx.ai
    soniox api.soniox.com
    synthetic api.synthetic.new
    tencent tokenhub-intl.tencentcloudmaas.com
    tensormesh serverless.tensormesh.ai
    v0 api.v0.dev
    veniceai api.venice.ai
    vercel_ai_gateway ai-gateway.vercel.sh
    volcengine ark.cn-beijing.volces.com
    wandb api.inference.wandb.ai
    xiaomi_mimo api.xiaomimimo.com
    zai api.z.ai
"""
_OWN_HOSTS: Final = tuple(
    (names.split("+"), hosts)
    for names, *hosts in (line.split() for line in _OWN_HOST_LIST.strip().splitlines())
)

# Providers that own more than one prefix, or whose API hosts are known. A prefix in no
# entry belongs to the provider of the same name (`groq/` to `provider: groq`).
PROVIDERS: Final = (
    Provider(("openai",), ("openai", "text-completion-openai", "chatgpt"), ("openai.com",)),
    Provider(
        ("azure", "microsoft"),
        ("azure", "azure_ai", "azure_text", "azure_speech"),
        ("azure.com", "azure.us", "azure.cn", "azure-api.net", "windows.net"),
    ),
    Provider(("anthropic",), ("anthropic", "anthropic_text"), ("anthropic.com",)),
    Provider(("google",), ("gemini", "vertex_ai", "vertex_ai_beta"), ("googleapis.com",)),
    Provider(
        ("aws", "amazon"),
        ("bedrock", "bedrock_mantle", "sagemaker", "sagemaker_chat", "sagemaker_nova"),
        ("amazonaws.com", "amazonaws.com.cn", "api.aws"),  # China's, dual-stack (Mantle's)
    ),
    Provider(("mistral",), ("mistral", "codestral", "text-completion-codestral"), ("mistral.ai",)),
    Provider(("cohere",), ("cohere", "cohere_chat"), ("cohere.ai", "cohere.com")),
    Provider(("meta",), ("meta", "meta_llama"), ("llama.com", "api.meta.ai")),
    Provider(("together",), ("together_ai",), ("together.ai", "together.xyz")),
    Provider(("fireworks",), ("fireworks_ai",), ("fireworks.ai",)),
    Provider(("groq",), ("groq",), ("groq.com",)),
    Provider(("deepseek",), ("deepseek",), ("deepseek.com",)),
    Provider(("xai",), ("xai",), ("x.ai",)),
    Provider(("perplexity",), ("perplexity",), ("perplexity.ai",)),
    Provider(("openrouter",), ("openrouter",), ("openrouter.ai",)),
    Provider(("deepinfra",), ("deepinfra",), ("deepinfra.com",)),
    *(Provider((names[0],), tuple(names), tuple(hosts)) for names, hosts in _OWN_HOSTS),
)


def provider_of(name: str) -> Provider | None:
    name = name.lower()  # policies match provider names in any case (gateway/policy/rules.py)
    return next((p for p in PROVIDERS if name in p.names or name in p.prefixes), None)


def provider_names(declared: str) -> tuple[str, ...]:
    """Every name a hosted backend's declared provider goes by: `declared` as written,
    then the names and LiteLLM prefixes of its `PROVIDERS` entry (`gemini` is also
    `google`, `vertex_ai`, `vertex_ai_beta`); just `declared` when no entry knows it.
    A policy's provider globs match any of them (gateway/policy/rules.py): one company,
    whichever name the operator wrote, so `providers.deny: [google]` holds for
    `provider: gemini`."""
    entry = provider_of(declared)
    if entry is None:
        return (declared,)
    others = (n for n in (*entry.names, *entry.prefixes) if n != declared.lower())
    return (declared, *dict.fromkeys(others))
