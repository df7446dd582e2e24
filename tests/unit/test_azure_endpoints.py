"""An Azure backend goes to Azure: Azure has no default URL, so LiteLLM takes it from the
backend's `base_url` or from `AZURE_API_BASE` / `AZURE_AI_API_BASE`, and either could
send a backend whose declared facts say `westeurope` anywhere. Both must be https at one
of Azure's endpoint host forms (gateway/config/azure_endpoints.py); a `base_url` at
another host needs `unsafe_unchecked_azure_host: true`, in the config."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config
from gateway.config.azure_endpoints import (
    AZURE_AUTHORITY_VARIABLE,
    AZURE_URL_VARIABLES,
    azure_authority_problem,
    azure_endpoint_problem,
)
from gateway.upstream.litellm_runtime import check_base_url_environment

AZURE_HOSTS = [
    "https://acme-eu.openai.azure.com",
    "https://acme-eu.openai.azure.com/",
    "https://ACME-EU.OpenAI.Azure.com./openai",
    "https://acme-eu.cognitiveservices.azure.com",
    "https://acme-eu.services.ai.azure.com/models",
    "https://Meta-Llama-3-1-8B-xyz.westeurope.models.ai.azure.com",
    "https://mistral-large-abc.swedencentral.inference.ai.azure.com/v1",
    "https://acme-gov.openai.azure.us",
    "https://acme-cn.cognitiveservices.azure.cn",
    "https://acme-eu.openai.azure.com:443",
]
NOT_AZURE = {
    "https://eu": "host 'eu' is not an Azure endpoint",
    "https://llm.attacker.example": "host 'llm.attacker.example' is not an Azure endpoint",
    "https://acme.openai.azure.com.attacker.example": "not an Azure endpoint",
    "https://openai.azure.com": "not an Azure endpoint",  # no resource
    "https://a.b.openai.azure.com": "not an Azure endpoint",  # a resource is one label
    "https://acme.azure-api.net": "not an Azure endpoint",  # API Management: a proxy
    "https://models.inference.ai.azure.com": "not an Azure endpoint",  # GitHub Models
    # under GitHub Models' host: region `models` of the serverless form, and no Azure one
    "https://x.models.inference.ai.azure.com": "not an Azure endpoint",
    "https://X.Models.Inference.AI.Azure.com./v1": "not an Azure endpoint",
    "https://westeurope.models.ai.azure.com": "not an Azure endpoint",  # no endpoint
    "https://acme_eu.openai.azure.com": "not an Azure endpoint",
    "http://acme-eu.openai.azure.com": "host 'acme-eu.openai.azure.com' is not reached over https",
    "http://127.0.0.1:8080": "is not reached over https",
    "https://user:pw@acme-eu.openai.azure.com": "userinfo",
    "https://attacker.example\\@acme-eu.openai.azure.com": "not a plain ASCII URL",
    "https://acme-eu.openai.azure.com\n": "not a plain ASCII URL",
    " https://acme-eu.openai.azure.com": "not a plain ASCII URL",
    "acme-eu.openai.azure.com": "not reached over https",
    "https://acme-eu.openai.azure.com:99999": "not a URL",
}


@pytest.mark.parametrize("url", AZURE_HOSTS)
def test_azures_endpoint_forms_are_azure(url: str) -> None:
    assert azure_endpoint_problem(url) is None


@pytest.mark.parametrize(("url", "problem"), NOT_AZURE.items(), ids=list(NOT_AZURE))
def test_anything_else_is_not(url: str, problem: str) -> None:
    found = azure_endpoint_problem(url)
    assert found is not None and problem in found
    assert "pw" not in found  # the host is named, never the whole URL


@pytest.mark.parametrize("variable", AZURE_URL_VARIABLES)
@pytest.mark.parametrize(
    "provider_model", ["azure/gpt-eu", "azure_ai/Llama-3.1-8B", "azure_text/d"]
)
def test_an_azure_url_variable_at_another_host_is_refused(
    variable: str, provider_model: str
) -> None:
    environ = {variable: "https://llm.attacker.example/v1"}
    with pytest.raises(ValueError, match=variable) as refused:
        check_base_url_environment("azure-eu", [provider_model], environ)
    message = str(refused.value)
    assert variable in message and "'llm.attacker.example'" in message
    assert "'azure-eu'" in message and "/v1" not in message
    # the config's base_url decides where LiteLLM sends: the variable is not read then
    check_base_url_environment("azure-eu", [provider_model], environ, has_base_url=True)


def test_an_azure_url_variable_over_http_is_refused() -> None:
    environ = {"AZURE_API_BASE": "http://acme-eu.openai.azure.com"}
    with pytest.raises(ValueError, match=re.escape("AZURE_API_BASE: host 'acme-eu.openai.azure")):
        check_base_url_environment("b", ["azure/gpt-eu"], environ)


def test_azure_url_variables_at_azure_hosts_load() -> None:
    environ = {
        "AZURE_API_BASE": "https://acme-eu.openai.azure.com",
        "AZURE_AI_API_BASE": "https://acme-eu.services.ai.azure.com",
        "AZURE_OPENAI_ENDPOINT": "https://acme-eu.cognitiveservices.azure.com/",
        "AZURE_API_VERSION": "2024-10-21",  # not a URL
    }
    check_base_url_environment("b", ["azure/gpt-eu", "azure_ai/Llama"], environ)
    # a backend of another provider leaves Azure's variables alone
    check_base_url_environment("b", ["openai/gpt-4o"], {"AZURE_API_BASE": "https://x"})


def test_litellm_reads_the_azure_ai_variable_when_given_no_base_url() -> None:
    """The variables are live: LiteLLM sends `azure_ai/` to AZURE_AI_API_BASE. Asked in a
    child process: LiteLLM loaded and called in the test process left a later in-process
    hosted stream failing in its adapter (AttributeError) in the same run."""
    script = (
        "from gateway.upstream.litellm_runtime import load_litellm\n"
        "print(load_litellm().get_llm_provider('azure_ai/Llama', api_key='k')[3])\n"
    )
    environ = {**os.environ, "AZURE_AI_API_BASE": "https://llm.attacker.example"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=environ,
    )
    assert done.stdout.splitlines()[-1] == "https://llm.attacker.example"


_READ = re.compile(
    r"""(?:get_secret_str|get_secret|os\.environ\.get|os\.getenv)\(\s*["'](AZURE_[A-Z0-9_]+)["']"""
)
_URL_NAME = re.compile(r"(?:^|_)(?:API_BASE|BASE_URL|URL|ENDPOINT|HOST)(?:_|$)")
# Reviewed: Azure URL variables that are no destination of what the gateway sends.
_NOT_CHECKED = {
    "AZURE_SPEECH_API_BASE",  # audio transcription: the gateway never calls it
}


def test_every_azure_url_variable_litellm_reads_is_checked() -> None:
    """Read from the pinned LiteLLM's azure/ and azure_ai/ source: a new variable in an
    upgrade fails here until azure_endpoints.py checks it (or it is reviewed above)."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    llms = Path(spec.origin).parent / "llms"
    found: set[str] = set()
    for directory in ("azure", "azure_ai"):
        for source in (llms / directory).rglob("*.py"):
            text = source.read_text(encoding="utf-8", errors="replace")
            found.update(name for name in _READ.findall(text) if _URL_NAME.search(name))
    assert {"AZURE_API_BASE", "AZURE_AI_API_BASE"} <= found
    assert found - _NOT_CHECKED <= {*AZURE_URL_VARIABLES, AZURE_AUTHORITY_VARIABLE}


AUTHORITIES = [
    "https://login.microsoftonline.com",
    "https://login.microsoftonline.com/",
    "https://LOGIN.microsoftonline.us",
    "https://login.chinacloudapi.cn:443",
    "https://login.partner.microsoftonline.cn",
    "login.microsoftonline.com",  # azure-identity's bare host form
]
NOT_AUTHORITIES = {
    "https://login.attacker.example": "not a Microsoft login host",
    "https://login.microsoftonline.com.attacker.example": "not a Microsoft login host",
    "https://attacker.example/login.microsoftonline.com": "not a Microsoft login host",
    "http://login.microsoftonline.com": "not reached over https",
    "https://user@login.microsoftonline.com": "userinfo",
    "https://login.microsoftonline.com:8443": "a port",
    "https://attacker.example\\@login.microsoftonline.com": "not a plain ASCII URL",
    "https://login.microsoftonline.com:99999": "not a URL",
}


@pytest.mark.parametrize("value", AUTHORITIES)
def test_microsoft_login_hosts_are_authorities(value: str) -> None:
    assert azure_authority_problem(value) is None
    environ = {"AZURE_AUTHORITY_HOST": value}
    check_base_url_environment("b", ["azure/gpt-eu"], environ, has_base_url=True)


@pytest.mark.parametrize(("value", "problem"), NOT_AUTHORITIES.items(), ids=list(NOT_AUTHORITIES))
@pytest.mark.parametrize("provider_model", ["azure/gpt-eu", "azure_ai/Llama", "gpt-4o"])
@pytest.mark.parametrize("has_base_url", [False, True])
def test_an_authority_host_elsewhere_is_refused(
    value: str, problem: str, provider_model: str, has_base_url: bool
) -> None:
    """LiteLLM's OIDC path posts the credential to it whatever `base_url` says."""
    environ = {"AZURE_AUTHORITY_HOST": value}
    with pytest.raises(ValueError, match="AZURE_AUTHORITY_HOST") as refused:
        check_base_url_environment("b", [provider_model], environ, has_base_url=has_base_url)
    assert problem in str(refused.value)


def test_an_authority_host_leaves_other_providers_alone() -> None:
    environ = {"AZURE_AUTHORITY_HOST": "https://login.attacker.example", "AZURE_API_BASE": ""}
    check_base_url_environment("b", ["openai/gpt-4o"], environ)
    check_base_url_environment("b", ["azure/gpt-eu"], {"AZURE_AUTHORITY_HOST": ""})


def test_litellm_posts_the_oidc_assertion_to_the_authority_host() -> None:
    """The variable is live in the pinned LiteLLM: re-read from its source."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "llms" / "azure" / "common_utils.py").read_text()
    assert 'os.getenv("AZURE_AUTHORITY_HOST"' in source
    assert "{azure_authority_host}/{azure_tenant_id}/oauth2/v2.0/token" in source


def hosted(**fields: Any) -> str:
    backend = {
        "id": "azure-eu",
        "kind": "hosted",
        "api_key_env": "K",
        "region": "westeurope",
        "owner": "microsoft",
        "provider": "azure",
        "models": [{"name": "m", "provider_model": "azure/gpt-eu"}],
        **fields,
    }
    return yaml.safe_dump({"backends": [backend]})


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    (issue,) = info.value.issues
    # userinfo is refused for every base_url, where it is written (test_base_url_userinfo.py)
    assert issue.path in ("backends[0]", "backends[0].base_url")
    return issue.message


@pytest.mark.parametrize(
    "fields",
    [
        {},  # no base_url: the variables, checked at start
        {"base_url": "https://acme-eu.openai.azure.com"},
        {"base_url": "https://mistral-abc.westeurope.models.ai.azure.com/v1"},
        {
            "base_url": "https://acme-eu.openai.azure.com/openai/v1",
            "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
        },  # Azure's v1 API in OpenAI's wire format
    ],
)
def test_an_azure_backend_at_an_azure_endpoint_loads(fields: dict[str, Any]) -> None:
    parse_config(hosted(**fields), env={})


@pytest.mark.parametrize(
    ("fields", "host"),
    [
        ({"base_url": "https://llm.attacker.example/v1"}, "llm.attacker.example"),
        ({"base_url": "http://acme-eu.openai.azure.com"}, "acme-eu.openai.azure.com"),
        ({"base_url": "http://127.0.0.1:8080"}, "127.0.0.1"),
        # judged as Azure by the route alone, declared by its owner
        (
            {"provider": None, "owner": "microsoft", "base_url": "https://10.0.0.5"},
            "10.0.0.5",
        ),
        # judged as Azure by its declaration, in OpenAI's wire format
        (
            {
                "base_url": "https://llm.attacker.example/v1",
                "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
            },
            "llm.attacker.example",
        ),
        (
            {
                "provider": "microsoft",
                "base_url": "https://llm.attacker.example",
                "models": [{"name": "m", "provider_model": "azure_ai/Llama"}],
            },
            "llm.attacker.example",
        ),
    ],
)
def test_an_azure_backends_base_url_elsewhere_is_refused(fields: dict[str, Any], host: str) -> None:
    if fields.get("provider", "") is None:
        fields = {k: v for k, v in fields.items() if k != "provider"}
    message = refused(hosted(**fields))
    assert "base_url of an Azure backend" in message and f"host {host!r}" in message
    assert "unsafe_unchecked_azure_host" in message


@pytest.mark.parametrize(
    "base_url",
    ["https://apim-eu.azure-api.net/openai", "https://llm.acme.example", "http://127.0.0.1:9"],
)
def test_the_unsafe_switch_lets_a_gateway_in_front_of_azure_through(base_url: str) -> None:
    parse_config(hosted(base_url=base_url, unsafe_unchecked_azure_host=True), env={})


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"base_url": "http://apim.acme.example"}, "not reached over https"),
        ({"base_url": "https://u:p@apim.acme.example"}, "userinfo"),
        # another provider's API is still no Azure backend
        ({"base_url": "https://api.openai.com/v1"}, "is openai's API"),
        ({}, "applies to a hosted Azure backend with base_url"),
        (
            {
                "provider": "acme-proxy",
                "base_url": "https://llm.acme.example",
                "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
            },
            "applies to a hosted Azure backend with base_url",
        ),
    ],
)
def test_the_unsafe_switch_still_checks_the_rest(fields: dict[str, Any], problem: str) -> None:
    assert problem in refused(hosted(unsafe_unchecked_azure_host=True, **fields))


def test_the_unsafe_switch_is_refused_on_a_private_backend() -> None:
    backend = {
        "id": "b",
        "kind": "vllm",
        "base_url": "http://10.0.0.5:8000",
        "models": [{"name": "m"}],
        "region": "eu",
        "owner": "acme",
        "unsafe_unchecked_azure_host": True,
    }
    message = refused(yaml.safe_dump({"backends": [backend]}))
    assert "hosted backends only" in message
