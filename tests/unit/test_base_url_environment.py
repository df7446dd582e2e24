"""`check_base_url_environment`: a provider URL variable never redirects a hosted backend
without `base_url`, whatever the spelling of its provider model."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from gateway.upstream.litellm_runtime import check_base_url_environment


@pytest.mark.parametrize(
    ("provider_model", "variable"),
    [
        # Unprefixed names LiteLLM resolves to a provider of their own (its model lists):
        # that provider's variable redirects them as much as OpenAI's would.
        ("claude-sonnet-4-5", "ANTHROPIC_API_BASE"),
        ("claude-sonnet-4-5", "ANTHROPIC_BASE_URL"),
        ("claude-sonnet-4-5", "ANTHROPIC_API_BASE_URL"),
        ("gpt-4o", "OPENAI_BASE_URL"),
        ("openai/gpt-4o", "OPENAI_API_BASE"),
        ("anthropic/claude-3-haiku-20240307", "ANTHROPIC_API_BASE"),
        # Providers whose variable LiteLLM names shorter than their prefix.
        ("fireworks_ai/accounts/fireworks/models/llama", "FIREWORKS_API_BASE"),
        ("vertex_ai/gemini-2.0-flash", "VERTEXAI_API_BASE"),
        ("vertex_ai/gemini-2.0-flash", "VERTEX_API_BASE"),
        ("huggingface/meta-llama/Llama-3-8B", "HF_API_BASE"),
    ],
)
def test_a_provider_url_variable_is_refused(provider_model: str, variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        check_base_url_environment("b", [provider_model], {variable: "https://elsewhere"})


def test_azure_is_told_its_url_by_its_variable() -> None:
    """At an Azure endpoint only: tests/unit/test_azure_endpoints.py has the rest."""
    environ = {"AZURE_API_BASE": "https://acme-eu.openai.azure.com"}
    check_base_url_environment("b", ["azure/gpt-eu"], environ)


def test_another_providers_variable_leaves_a_prefixed_model_alone() -> None:
    check_base_url_environment("b", ["openai/gpt-4o"], {"ANTHROPIC_API_BASE": "https://x"})


# Reviewed: variables under a provider's directory that are no destination of its own.
_NOT_A_DESTINATION = {
    ("openrouter", "OR_SITE_URL"),  # sent as the HTTP-Referer header value
}
_READ = re.compile(
    r"""(?:get_secret_str|get_secret|os\.environ\.get|os\.getenv)\(\s*["']([A-Z0-9_]+)["']"""
    r"""|os\.environ\[\s*["']([A-Z0-9_]+)["']"""
)
_URL_NAME = re.compile(r"(?:^|_)(?:API_BASE|BASE_URL|URL|ENDPOINT|HOST)(?:_|$)")


def _litellm_url_variables() -> list[tuple[str, str]]:
    """(provider directory, variable) for each URL variable the installed LiteLLM reads
    under `llms/<provider>/`, from its source (LiteLLM is not imported)."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    llms = Path(spec.origin).parent / "llms"
    found = set()
    for directory in llms.iterdir():
        if not directory.is_dir() or directory.name.startswith(("azure", "_")):
            continue  # Azure: no default URL, told by AZURE_API_BASE (allowed)
        for source in directory.rglob("*.py"):
            for match in _READ.finditer(source.read_text(encoding="utf-8", errors="replace")):
                name = match.group(1) or match.group(2)
                if _URL_NAME.search(name) and (directory.name, name) not in _NOT_A_DESTINATION:
                    found.add((directory.name, name))
    return sorted(found)


def test_every_url_variable_litellm_reads_for_a_provider_is_refused() -> None:
    """Enumerated from the pinned LiteLLM's source: a new variable in an upgrade fails
    here until provider_environment.py knows it (or it is reviewed above)."""
    variables = _litellm_url_variables()
    assert len(variables) > 80  # the scan found LiteLLM's providers
    missed = []
    for provider, variable in variables:
        try:
            check_base_url_environment("b", [f"{provider}/m"], {variable: "https://x.test"})
        except ValueError:
            continue
        missed.append(f"{provider}: {variable}")
    assert missed == []


@pytest.mark.parametrize(
    ("provider_model", "variable"),
    [
        # boto3 reads these for any client LiteLLM builds; LiteLLM its own runtime one.
        ("bedrock/anthropic.claude-3-haiku", "AWS_BEDROCK_RUNTIME_ENDPOINT"),
        ("bedrock/anthropic.claude-3-haiku", "AWS_ENDPOINT_URL"),
        ("bedrock/anthropic.claude-3-haiku", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME"),
        ("bedrock/converse/amazon.nova-pro", "ANTHROPIC_AWS_BASE_URL"),
        ("sagemaker/endpoint", "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"),
        # watsonx's names (litellm/main.py too), for either of its prefixes.
        ("watsonx/ibm/granite-13b", "WATSONX_URL"),
        ("watsonx/ibm/granite-13b", "WATSONX_API_BASE"),
        ("watsonx_text/ibm/granite-13b", "WX_URL"),
        ("watsonx/ibm/granite-13b", "WML_URL"),
        ("databricks/dbrx", "DATABRICKS_HOST"),
        ("mistral/mistral-large", "MISTRAL_AZURE_API_BASE"),
        # An unprefixed name may resolve to Bedrock (`anthropic.claude-...`) or watsonx.
        ("anthropic.claude-3-haiku-20240307-v1:0", "AWS_BEDROCK_RUNTIME_ENDPOINT"),
        ("gpt-4o", "WATSONX_URL"),
    ],
)
def test_provider_specific_url_variables_are_refused(provider_model: str, variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        check_base_url_environment("b", [provider_model], {variable: "https://elsewhere"})


def test_a_token_url_is_refused_even_with_base_url() -> None:
    """The key goes to the token URL whatever `base_url` says."""
    environ = {"WATSONX_IAM_URL": "https://iam.elsewhere"}
    with pytest.raises(ValueError, match="WATSONX_IAM_URL"):
        check_base_url_environment("b", ["watsonx/ibm/granite"], environ, has_base_url=True)
    # A URL variable the config's base_url overrides is harmless then.
    environ = {"AWS_BEDROCK_RUNTIME_ENDPOINT": "https://elsewhere"}
    check_base_url_environment("b", ["bedrock/anthropic.claude"], environ, has_base_url=True)


def test_switches_named_like_endpoints_are_not_destinations() -> None:
    environ = {"AWS_USE_FIPS_ENDPOINT": "true", "AWS_USE_DUALSTACK_ENDPOINT": "false"}
    check_base_url_environment("b", ["bedrock/anthropic.claude"], environ)
