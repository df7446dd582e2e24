"""Environment variables through which LiteLLM would send a hosted backend elsewhere.

Where a hosted backend has no `base_url`, LiteLLM (and the OpenAI SDK under it) takes the
provider's URL from the environment (`OPENAI_BASE_URL`, `ANTHROPIC_API_BASE`,
`AWS_BEDROCK_RUNTIME_ENDPOINT`, `WATSONX_URL`, `DATABRICKS_HOST`, ...) and sends the
prompt and the backend's key there; a few providers also fetch a token from a URL a
variable may name (`WATSONX_IAM_URL`, `GIGACHAT_AUTH_URL`, GitHub Copilot's), with the
key, whatever `base_url` says. `check_base_url_environment` refuses such a backend while
one of those variables is set: where hosted traffic and keys go is the config's to say.

Which variables (LiteLLM 1.108.7, from `get_secret*`/`os.environ` reads under its
`llms/<provider>/` and `main.py`; tests/unit/test_base_url_environment.py enumerates
them from the installed source and fails on one this module would miss):

- a name that starts with one of the provider's names and has a URL part
  (`_API_BASE`, `_BASE_URL`, `_URL`, `_ENDPOINT`, `_HOST`, as a whole `_`-separated
  part): `WATSONX_URL`, `DATABRICKS_HOST`, `MISTRAL_AZURE_API_BASE`, `DASHSCOPE_API_BASE_IMAGE`;
- a provider's names are its prefix (`fireworks_ai/` → `FIREWORKS_AI`), that without
  `_` and without `_AI`, and the other names LiteLLM reads for it (`_ALIASES`: Bedrock's
  `AWS_...` and `ANTHROPIC_AWS_...`, watsonx's `WX_URL`, `WML_URL`, Hugging Face's `HF_`);
- a model without a provider prefix (`gpt-4o`, `claude-sonnet-4-5`) may resolve to any
  provider (LiteLLM's model lists): every provider URL variable counts for it
  (`<ANY>_API_BASE`, `_BASE_URL`, `_API_BASE_URL`, and every alias family's).

Azure (`azure/`, `azure_ai/`, ...) has no default URL: `AZURE_API_BASE` is how it is
told (deploy/gateway.example.yaml relies on it) and stays allowed, but not to anywhere:
without `base_url`, each of `AZURE_API_BASE`, `AZURE_AI_API_BASE` and
`AZURE_OPENAI_ENDPOINT` that is set must be https at an Azure endpoint host
(gateway/config/azure_endpoints.py, which checks a `base_url` the same way), or the
backend is refused, naming the variable and the host. `AZURE_AUTHORITY_HOST`, where
LiteLLM's Azure AD (OIDC) path posts a credential whatever `base_url` says, must be a
Microsoft login host when set, for an Azure backend or one without a provider prefix,
with or without `base_url`. `OR_SITE_URL` (OpenRouter) is a
header value, not a destination, and does not start with the provider's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from gateway.config.azure_endpoints import (
    AZURE_AUTHORITY_VARIABLE,
    AZURE_PREFIXES,
    AZURE_URL_VARIABLES,
    azure_authority_problem,
    azure_endpoint_problem,
)

__all__ = ["check_base_url_environment"]

# `<PROVIDER>_API_BASE`, `<PROVIDER>_BASE_URL`, `<PROVIDER>_API_BASE_URL`: the generic names
# (`litellm/main.py`, `get_llm_provider_logic.py`), any provider's (an unprefixed model).
_BASE_URL_SUFFIX: Final = re.compile(r"_(?:API_BASE|BASE_URL|API_BASE_URL)$")
# A URL part anywhere in a name that starts with the provider's name.
_URL_PART: Final = re.compile(r"(?:^|_)(?:API_BASE|BASE_URL|URL|ENDPOINT|HOST)(?:_|$)")
# Providers without a default URL: their variable is how LiteLLM is told where to go
# (`AZURE_API_BASE`), not an override.
_NO_DEFAULT_URL: Final = ("AZURE",)
# Names LiteLLM reads a provider family's URL (or token URL) under besides its prefix:
# family (a prefix starts with it) -> the names.
_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    # bedrock/: AWS_BEDROCK_RUNTIME_ENDPOINT (llms/bedrock/base_aws_llm.py), boto3's
    # AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_BEDROCK_RUNTIME, the Claude platform's
    # ANTHROPIC_AWS_BASE_URL / _API_BASE, AgentCore's AGENTCORE_GATEWAY_URL.
    "BEDROCK": ("AWS", "ANTHROPIC_AWS", "AGENTCORE"),
    "SAGEMAKER": ("AWS",),  # boto3's AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME
    # watsonx/, watsonx_text/: WATSONX_URL, WX_URL, WML_URL (main.py, common_utils.py);
    # WATSONX_IAM_URL gets the API key; its vLLM route reads HOSTED_VLLM_API_BASE.
    "WATSONX": ("WATSONX", "WX", "WML", "HOSTED_VLLM"),
    "HUGGINGFACE": ("HF",),
    "DASHSCOPE": ("QWENCLOUD", "QWEN_AI_PLATFORM"),
    "VOLCENGINE": ("ARK",),
    "BLACK_FOREST_LABS": ("BFL",),
    "FASTCRW": ("CRW",),
    "CHATGPT": ("OPENAI_CHATGPT",),
}
_ALIAS_NAMES: Final = frozenset(name for names in _ALIASES.values() for name in names)
# Token URLs a provider sends its key to even with `base_url` set.
_TOKEN_URLS: Final = re.compile(
    r"WATSONX_IAM_URL|GIGACHAT_AUTH_URL|GITHUB_COPILOT_(?:ACCESS_TOKEN|API_KEY|DEVICE_CODE)_URL"
)
# Switches, not destinations (`AWS_USE_FIPS_ENDPOINT=true`).
_FLAGS: Final = frozenset({"", "0", "1", "true", "false", "yes", "no", "on", "off"})


def _provider_names(prefix: str) -> set[str]:
    """The names LiteLLM may read a variable of `prefix`'s provider under."""
    names = {prefix, prefix.replace("_", ""), prefix.removesuffix("_AI")}
    for family, aliases in _ALIASES.items():
        if prefix.startswith(family):
            names.update(aliases)
    return names


def _starts_with_one_of(name: str, providers: Iterable[str]) -> bool:
    return any(name.startswith(f"{provider}_") for provider in providers)


def check_base_url_environment(
    backend_id: str,
    provider_models: Iterable[str],
    environ: Mapping[str, str],
    *,
    has_base_url: bool = False,
) -> None:
    """Raise ValueError when a variable set in `environ` would send hosted backend
    `backend_id` (its LiteLLM `provider_models`) or its key elsewhere than the config
    says: a provider URL variable when it has no `base_url` (`has_base_url` False), a
    token URL variable in any case."""
    provider_models = list(provider_models)
    _check_azure_authority(backend_id, provider_models, environ)
    if not has_base_url:
        _check_azure_environment(backend_id, provider_models, environ)
    providers: set[str] = set()
    unprefixed = False  # LiteLLM infers the provider from its model lists (`claude-...`)
    for model in provider_models:
        prefix = model.split("/", 1)[0].upper().replace("-", "_") if "/" in model else ""
        unprefixed = unprefixed or not prefix
        if prefix and not prefix.startswith(_NO_DEFAULT_URL):
            providers.update(_provider_names(prefix))
        if "OPENAI" in prefix:  # OpenAI-style: OpenAI's names too
            providers.add("OPENAI")
    found = []
    for name, value in environ.items():
        upper = name.upper()
        if value.strip().lower() in _FLAGS or upper.startswith(_NO_DEFAULT_URL):
            continue
        if not _URL_PART.search(upper):
            continue
        token_url = _TOKEN_URLS.fullmatch(upper) is not None
        if has_base_url and not token_url:
            continue
        if _starts_with_one_of(upper, providers) or (
            unprefixed
            and (
                _BASE_URL_SUFFIX.search(upper) is not None
                or token_url
                or _starts_with_one_of(upper, _ALIAS_NAMES)
            )
        ):
            found.append(name)
    found.sort()
    if found:
        raise ValueError(
            f"backend {backend_id!r}: environment variable {', '.join(found)} would redirect "
            "this hosted backend or its key (LiteLLM reads it instead of the config): set "
            "base_url in the config, or unset the variable"
        )


def _check_azure_environment(
    backend_id: str, provider_models: Iterable[str], environ: Mapping[str, str]
) -> None:
    """Raise ValueError when an Azure backend without `base_url` would be sent by an
    Azure URL variable to a host that is no Azure endpoint."""
    if all(model.partition("/")[0] not in AZURE_PREFIXES for model in provider_models):
        return
    problems = []
    for name, value in sorted(environ.items()):
        if name.upper() not in AZURE_URL_VARIABLES or value == "":  # "": LiteLLM skips it
            continue
        problem = azure_endpoint_problem(value)
        if problem is not None:
            problems.append(f"{name}: {problem}")
    if problems:
        raise ValueError(
            f"backend {backend_id!r}: environment variable {'; '.join(problems)}: LiteLLM "
            "would send this Azure backend's prompts and key there; Azure traffic goes to "
            "Azure's endpoints over https (set base_url in the config, or fix the variable)"
        )


def _check_azure_authority(
    backend_id: str, provider_models: Iterable[str], environ: Mapping[str, str]
) -> None:
    """Raise ValueError when `AZURE_AUTHORITY_HOST` is set to anything but a Microsoft
    login host for a backend that may be Azure (an `azure*/` model, or one without a
    provider prefix): LiteLLM's Azure AD path would post its credential there."""
    if all(
        "/" in model and model.partition("/")[0] not in AZURE_PREFIXES for model in provider_models
    ):
        return
    for name, value in sorted(environ.items()):
        if name.upper() != AZURE_AUTHORITY_VARIABLE or value == "":  # "": the default
            continue
        problem = azure_authority_problem(value)
        if problem is not None:
            raise ValueError(
                f"backend {backend_id!r}: environment variable {name}: {problem}: LiteLLM "
                "would send this Azure backend's credential there to get a token (unset "
                "the variable, or name a Microsoft login host)"
            )
