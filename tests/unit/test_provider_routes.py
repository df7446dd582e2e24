"""A hosted backend's declared provider (what policies judge) must be where LiteLLM sends
its traffic: `provider: azure` with `provider_model: openai/gpt-4o` went to OpenAI while
a policy allowing only Azure passed it. Checked at config load, without LiteLLM; the
tables are compared with the installed LiteLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config
from gateway.upstream.litellm_runtime import load_litellm


def hosted(**fields: Any) -> str:
    backend = {
        "id": "h",
        "kind": "hosted",
        "api_key_env": "K",
        "region": "westeurope",
        "owner": "microsoft",
        **fields,
    }
    return yaml.safe_dump({"backends": [backend]})


def model(provider_model: str) -> list[dict[str, str]]:
    return [{"name": "m", "provider_model": provider_model}]


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    (issue,) = info.value.issues
    assert issue.line == 2 and issue.path == "backends[0]"
    return issue.message


@pytest.mark.parametrize(
    ("provider", "provider_model", "base_url"),
    [
        ("azure", "azure/gpt-4o-mini-eu", None),
        ("azure", "azure_ai/Meta-Llama-3.1-8B-Instruct", None),  # deploy/gateway.example.yaml
        ("azure", "azure/gpt-4o", "https://acme-eu.openai.azure.com"),
        ("google", "gemini/gemini-2.0-flash", None),
        ("gemini", "gemini/gemini-2.0-flash", None),
        ("google", "vertex_ai/claude-3-5-haiku", None),  # Anthropic's model, on Google's host
        ("openai", "openai/gpt-4o-mini", "https://api.openai.com/v1"),
        ("openai", "gpt-4o", None),  # LiteLLM routes an unprefixed gpt-... to OpenAI
        ("anthropic", "anthropic/claude-3-5-haiku-latest", None),
        ("anthropic", "claude-sonnet-4-5", None),
        ("mistral", "mistral/mistral-small-latest", None),
        ("groq", "groq/llama-3.1-8b-instant", None),  # a prefix in no table: its own name
        ("aws", "bedrock/anthropic.claude-3-haiku", None),
        # OpenAI's wire format at a URL the table does not know: taken as declared.
        ("acme-proxy", "openai/gpt-4o", "https://llm-proxy.internal.example/v1"),
        ("openrouter", "openai/gpt-4o", "https://openrouter.ai/api/v1"),
        ("acme-vllm", "hosted_vllm/llama", "http://10.0.0.5:8000/v1"),
    ],
)
def test_a_provider_and_its_routes_load(
    provider: str, provider_model: str, base_url: str | None
) -> None:
    extra = {} if base_url is None else {"base_url": base_url}
    parse_config(hosted(provider=provider, models=model(provider_model), **extra), env={})


def test_a_model_string_of_another_provider_is_refused_naming_both() -> None:
    message = refused(hosted(provider="azure", models=model("openai/gpt-4o")))
    assert "'openai/gpt-4o' is sent by LiteLLM to openai" in message
    assert "declares provider 'azure'" in message


@pytest.mark.parametrize(
    ("provider", "provider_model", "sent_to"),
    [
        ("openai", "azure/gpt-4o", "azure"),
        ("azure", "gpt-4o", "openai"),  # unprefixed: LiteLLM's default route
        ("azure", "claude-3-5-haiku-latest", "anthropic"),
        ("anthropic", "vertex_ai/claude-3-5-haiku", "vertex_ai"),  # Google hosts it
        ("anthropic", "bedrock/anthropic.claude-3-haiku", "bedrock"),
        ("mistral", "groq/mixtral-8x7b", "groq"),
    ],
)
def test_every_route_to_another_provider_is_refused(
    provider: str, provider_model: str, sent_to: str
) -> None:
    message = refused(hosted(provider=provider, models=model(provider_model)))
    assert f"to {sent_to} (" in message and f"declares provider {provider!r}" in message


def test_without_provider_the_owner_is_what_is_checked() -> None:
    # facts_of judges a hosted backend without `provider` by its owner.
    parse_config(hosted(owner="microsoft", models=model("azure/gpt-4o")), env={})
    message = refused(hosted(owner="acme", models=model("openai/gpt-4o")))
    assert "declares provider 'acme'" in message


def test_a_provider_written_empty_is_refused() -> None:
    # `provider:` with its value commented out read as no provider: the owner judged.
    text = hosted(owner="openai", models=model("openai/gpt-4o"))
    text = text.replace("owner: openai", "owner: openai\n  provider:")
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0].provider" and "written with no value" in issue.message


def test_one_stray_model_among_several_is_refused() -> None:
    models = [*model("azure/gpt-4o"), {"name": "n", "provider_model": "openai/gpt-4o"}]
    assert "'openai/gpt-4o'" in refused(hosted(provider="azure", models=models))


@pytest.mark.parametrize(
    ("provider", "base_url", "host_of"),
    [
        ("azure", "https://api.openai.com/v1", "openai"),
        ("azure", "https://API.OpenAI.com./v1", "openai"),
        ("openai", "https://acme.openai.azure.com", "azure"),
        ("acme-proxy", "https://bedrock-runtime.eu-west-1.amazonaws.com", "aws"),
    ],
)
def test_a_base_url_at_another_providers_host_is_refused(
    provider: str, base_url: str, host_of: str
) -> None:
    text = hosted(provider=provider, base_url=base_url, models=model("openai/gpt-4o"))
    message = refused(text)
    assert f"is {host_of}'s API" in message and f"declares provider {provider!r}" in message


@pytest.mark.parametrize(
    ("provider_model", "expected"),
    [
        ("mistral-small", "no LiteLLM provider prefix"),  # LiteLLM's lists decide: refused
        ("meta-llama/Llama-3.1-8B", "no LiteLLM provider prefix"),  # not a LiteLLM prefix
        ("OpenAI/gpt-4o", "no LiteLLM provider prefix"),
        ("hosted_vllm/llama", "give the backend a base_url"),
    ],
)
def test_a_model_string_whose_route_is_unclear_is_refused(
    provider_model: str, expected: str
) -> None:
    assert expected in refused(hosted(provider="acme", models=model(provider_model)))


def test_the_provider_list_is_the_installed_litellms() -> None:
    from gateway.config.provider_routes import LITELLM_PROVIDERS

    litellm = load_litellm()  # offline, quiet: what the gateway itself imports
    installed = {str(getattr(p, "value", p)) for p in litellm.provider_list}
    assert set(LITELLM_PROVIDERS) == installed


@pytest.mark.parametrize(
    "name",
    ["gpt-4o", "gpt-4o-mini", "o1", "o3-mini", "text-embedding-3-small", "davinci-002"],
)
def test_unprefixed_names_route_as_litellm_routes_them(name: str) -> None:
    from gateway.config.provider_routes import _BARE, route_of

    litellm = load_litellm()
    routed = litellm.get_llm_provider(name)[1]
    owner, _ = route_of(name)
    assert owner == "openai" and routed in ("openai", "text-completion-openai")
    assert any(pattern.match(name) for pattern, _ in _BARE)


def test_unprefixed_claude_routes_to_anthropic() -> None:
    from gateway.config.provider_routes import route_of

    litellm = load_litellm()
    assert litellm.get_llm_provider("claude-sonnet-4-5")[1] == "anthropic"
    assert route_of("claude-sonnet-4-5")[0] == "anthropic"


@pytest.mark.parametrize(
    "fields",
    [
        {"provider": "OpenAI"},
        {"owner": "OpenAI"},  # no provider: the owner is checked
        {"provider": "Azure", "provider_model": "azure/gpt-4o"},
        {"provider": "acme-Proxy", "base_url": "https://llm-proxy.internal.example/v1"},
    ],
)
def test_a_provider_name_in_another_case_is_the_same_provider(fields: dict[str, str]) -> None:
    """Policies match provider names in any case (`providers.deny: [openai]` matches
    `provider: OpenAI`): so does this check, or a config that loaded before would be refused."""
    provider_model = fields.pop("provider_model", "openai/gpt-4o")
    parse_config(hosted(models=model(provider_model), **fields), env={})


def test_a_provider_name_in_another_case_is_still_checked() -> None:
    message = refused(hosted(provider="Azure", models=model("openai/gpt-4o")))
    assert "declares provider 'Azure'" in message
    message = refused(
        hosted(provider="AZURE", base_url="https://api.openai.com/v1", models=model("openai/x"))
    )
    assert "api.openai.com" in message


@pytest.mark.parametrize("provider", ["acme-proxy", "openai"])
def test_a_route_litellm_sends_over_aiohttp_itself_is_refused(provider: str) -> None:
    # LiteLLM sends `aiohttp_openai/` through aiohttp's ClientSession, not httpx: nothing
    # the gateway installs bounds what it reads (tests/integration/test_hosted_answer_bound.py).
    message = refused(
        hosted(
            provider=provider,
            base_url="https://llm-proxy.internal.example/v1",
            models=model("aiohttp_openai/gpt-4o"),
        )
    )
    assert "over aiohttp directly" in message and "limits.max_response_bytes" in message
    assert "use openai/gpt-4o at the same base_url" in message


@pytest.mark.parametrize(
    ("base_url", "host_of"),
    [
        # Hosts LiteLLM itself knows as one provider's OpenAI-compatible API
        # (`litellm.openai_compatible_endpoints`): `openai/...` there was judged as the
        # declared `openai` while the prompts went to Alibaba Cloud, Sber, Nebius, ...
        ("https://dashscope.aliyuncs.com/compatible-mode/v1", "dashscope"),
        ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "dashscope"),
        ("https://gigachat.devices.sberbank.ru/api/v1", "gigachat"),
        ("https://api.studio.nebius.ai/v1", "nebius"),
        ("https://API.Moonshot.ai./v1", "moonshot"),
        ("https://integrate.api.nvidia.com/v1", "nvidia_nim"),
        # Hosts LiteLLM gives as a provider's default api_base (`get_llm_provider`), not
        # in that list: `openai/...` at Cerebras, Novita, Z.ai, Bedrock Mantle loaded.
        ("https://api.cerebras.ai/v1", "cerebras"),
        ("https://api.novita.ai/v3/openai", "novita"),
        ("https://api.z.ai/api/paas/v4", "zai"),
        ("https://ark.cn-beijing.volces.com/api/v3", "volcengine"),
        ("https://api.venice.ai/api/v1", "veniceai"),
        # AWS's other endpoint domains (dual-stack `api.aws`, China's), its Region declared
        ("https://bedrock-mantle.us-east-1.api.aws/v1", "aws"),
        ("https://runtime.sagemaker.cn-north-1.amazonaws.com.cn", "aws"),
    ],
)
def test_a_base_url_at_a_host_litellm_knows_as_another_provider_is_refused(
    base_url: str, host_of: str
) -> None:
    region = next((r for r in ("us-east-1", "cn-north-1") if r in base_url), "westeurope")
    text = hosted(
        provider="openai", region=region, base_url=base_url, models=model("openai/qwen-max")
    )
    message = refused(text)
    assert f"is {host_of}'s API" in message and "declares provider 'openai'" in message


@pytest.mark.parametrize(
    ("provider", "provider_model", "base_url"),
    [
        ("dashscope", "openai/qwen-max", "https://dashscope-intl.aliyuncs.com/compatible-mode/v1"),
        ("dashscope", "dashscope/qwen-max", "https://dashscope.aliyuncs.com/compatible-mode/v1"),
        ("nvidia_nim", "nvidia_nim/meta/llama3-8b", "https://integrate.api.nvidia.com/v1"),
        # LiteLLM's other prefixes for Alibaba's hosts, at their own default host
        ("qwencloud", "qwencloud/qwen-max", "https://dashscope-intl.aliyuncs.com/api/v1"),
        ("dashscope", "qwen_ai_platform/qwen-max", "https://dashscope.aliyuncs.com/api/v1"),
        ("aws", "bedrock_mantle/openai.gpt-oss-120b", "https://bedrock-mantle.us-east-1.api.aws"),
    ],
)
def test_a_host_litellm_knows_loads_declared_as_its_own_provider(
    provider: str, provider_model: str, base_url: str
) -> None:
    region = "us-east-1" if "us-east-1" in base_url else "westeurope"
    text = hosted(provider=provider, region=region, base_url=base_url, models=model(provider_model))
    (backend,) = parse_config(text, env={}).backends
    assert backend.provider == provider


def test_every_host_litellm_knows_is_in_the_tables() -> None:
    """Each host of the installed LiteLLM's `openai_compatible_endpoints` belongs to one
    provider here, the one LiteLLM routes an unprefixed name at it to (where it names one)."""
    from urllib.parse import urlsplit

    from gateway.config.provider_routes import _host_owner, _same

    litellm = load_litellm()
    for endpoint in litellm.openai_compatible_endpoints:
        url = endpoint if "://" in endpoint else f"https://{endpoint}"
        owner = _host_owner(url)
        assert owner is not None, urlsplit(url).hostname
        routed = litellm.get_llm_provider("some-model", api_base=url)[1]
        if routed is not None:
            assert _same(owner.names[0], routed), (url, routed, owner)


def test_every_default_host_of_a_litellm_provider_is_in_the_tables() -> None:
    """Each provider's default API host the installed LiteLLM gives (`get_llm_provider`'s
    api_base, its JSON-configured OpenAI-like providers too) belongs to that provider
    here. `github/` goes to Azure's models host, judged as Azure's; loopback defaults
    (a local server) are no provider's."""
    from urllib.parse import urlsplit

    from gateway.config.provider_routes import _host_owner, _same

    litellm = load_litellm()
    configured = json.loads(
        (Path(str(litellm.__file__)).parent / "llms/openai_like/providers.json").read_text()
    )
    bases = [(name, name, entry.get("base_url")) for name, entry in configured.items()]
    for prefix in (getattr(p, "value", p) for p in litellm.provider_list):
        if prefix == "github_copilot":  # its routing starts a device login (network, files)
            continue
        try:
            routed, api_base = litellm.get_llm_provider(f"{prefix}/some-model")[1::2]
        except Exception:  # noqa: BLE001 - a provider that needs more than a name to route
            continue
        bases.append((prefix, routed, api_base))
    missing = []
    for prefix, routed, api_base in bases:
        host = urlsplit(str(api_base or "")).hostname
        if host is None or host in ("localhost", "127.0.0.1") or prefix == "github":
            continue
        owner = _host_owner(str(api_base))
        if owner is None or not _same(owner.names[0], routed):
            missing.append((prefix, host, owner and owner.names[0]))
    assert not missing
