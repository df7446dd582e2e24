"""`check_base_url_environment`: a provider URL variable never redirects a hosted backend
without `base_url`, whatever the spelling of its provider model."""

from __future__ import annotations

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
    check_base_url_environment("b", ["azure/gpt-eu"], {"AZURE_API_BASE": "https://eu"})


def test_another_providers_variable_leaves_a_prefixed_model_alone() -> None:
    check_base_url_environment("b", ["openai/gpt-4o"], {"ANTHROPIC_API_BASE": "https://x"})
