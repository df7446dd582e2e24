"""A private backend is not at a hosted provider's model API.

Policies treat a private backend (`kind: vllm`, `llamacpp`, `sglang`, `openai`) as the
operator's own server: what may never leave it (`fallback: {mode: never}`, eu-health's
PHI) goes there. `kind: openai` with `base_url: https://api.openai.com/v1` loaded as
such, so a PHI request went to OpenAI. A `base_url` at a known provider's model API host
(the hosts gateway/config/provider_routes.py knows) is refused for a private backend;
a server of the operator's own in a cloud (an EC2 or Azure VM, a load balancer) is not
such a host and still loads."""

from __future__ import annotations

import pytest
import yaml

from gateway.config import ConfigError, parse_config


def private(kind: str, base_url: str) -> str:
    backend = {
        "id": "p",
        "kind": kind,
        "base_url": base_url,
        "region": "eu-central-1",
        "owner": "acme",
        "models": [{"name": "m"}],
    }
    return yaml.safe_dump({"backends": [backend]})


@pytest.mark.parametrize(
    ("kind", "base_url", "provider"),
    [
        ("openai", "https://api.openai.com/v1", "openai"),
        ("openai", "https://eu.api.openai.com/v1", "openai"),
        ("vllm", "https://API.Anthropic.com.", "anthropic"),
        ("openai", "https://acme-eu.openai.azure.com/openai/v1", "azure"),
        ("openai", "https://bedrock-runtime.eu-central-1.amazonaws.com", "aws"),
        ("openai", "https://europe-west4-aiplatform.googleapis.com/v1", "google"),
        ("sglang", "https://openrouter.ai/api/v1", "openrouter"),
        ("openai", "https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "dashscope"),
        ("llamacpp", "https://api.groq.com/openai/v1", "groq"),
        ("openai", "https://api.cerebras.ai/v1", "cerebras"),
        ("openai", "https://bedrock-mantle.eu-central-1.api.aws/v1", "aws"),
        ("openai", "https://bedrock-runtime.eu-central-1.api.aws", "aws"),
        ("vllm", "https://runtime.sagemaker.cn-north-1.amazonaws.com.cn", "aws"),
        # An Azure resource's Private Link name (its private IP in the VNet)
        ("openai", "https://acme-eu.privatelink.openai.azure.com/openai/v1", "azure"),
    ],
)
def test_a_private_backend_at_a_providers_model_api_does_not_load(
    kind: str, base_url: str, provider: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(private(kind, base_url), env={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0]"
    assert f"is {provider}'s hosted model API" in issue.message
    assert f"kind: {kind}" in issue.message and "kind: hosted" in issue.message


@pytest.mark.parametrize(
    ("server_name", "provider"),
    [
        ("api.openai.com", "openai"),
        ("acme-eu.openai.azure.com", "azure"),
        ("bedrock-runtime.eu-central-1.amazonaws.com", "aws"),
    ],
)
def test_a_private_backend_whose_tls_names_a_providers_model_api_does_not_load(
    server_name: str, provider: str
) -> None:
    """`base_url: https://10.1.2.3` with `tls.server_name: acme-eu.openai.azure.com` is an
    Azure OpenAI resource's private endpoint (Private Link gives it an address in the
    operator's network): the name checked is the provider's, so is where prompts go."""
    backend = yaml.safe_load(private("openai", "https://10.1.2.3/v1"))["backends"][0]
    backend["tls"] = {"server_name": server_name}
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump({"backends": [backend]}), env={})
    (issue,) = info.value.issues
    assert f"is {provider}'s hosted model API" in issue.message


@pytest.mark.parametrize(
    "base_url",
    [
        "http://10.0.0.11:8000",
        "http://ec2-3-120-1-1.eu-central-1.compute.amazonaws.com:8000",
        "https://internal-llm-123.eu-central-1.elb.amazonaws.com",
        "http://ec2-52-80-1-1.cn-north-1.compute.amazonaws.com.cn:8000",
        "https://gpu-vm.westeurope.cloudapp.azure.com",
        "https://llm.acme.example/v1",
    ],
)
def test_a_private_server_in_a_cloud_still_loads(base_url: str) -> None:
    (backend,) = parse_config(private("vllm", base_url), env={}).backends
    assert backend.is_private


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"provider": "azure"}, "provider"),
        ({"models": [{"name": "m", "provider_model": "openai/gpt-4o"}]}, "provider_model"),
    ],
)
def test_a_private_backend_names_no_provider(fields: dict[str, object], key: str) -> None:
    """Policies judge a private backend by its owner and the names it serves: a `provider:
    azure` written on one was ignored, so `providers.deny: [azure]` let it through while a
    review read it as Azure (and a `provider_model` was not what a `models` rule judged)."""
    backend = {**yaml.safe_load(private("vllm", "http://10.0.0.11:8000"))["backends"][0]}
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump({"backends": [{**backend, **fields}]}), env={})
    (issue,) = info.value.issues
    assert f"{key} applies to hosted backends only" in issue.message
