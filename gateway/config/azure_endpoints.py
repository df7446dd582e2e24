"""Where Azure traffic may go: the host forms of Azure's inference endpoints.

A hosted backend that policies judge as Azure (`provider: azure` or `microsoft`, or a
LiteLLM `azure/`, `azure_ai/`, `azure_text/`, `azure_speech/` route) has no default URL:
LiteLLM sends it to the backend's `base_url`, else to the URL in `AZURE_API_BASE`
(`azure/`, `azure_text/`, and `azure_ai/` Claude models) or `AZURE_AI_API_BASE`
(`azure_ai/`), and the OpenAI SDK under it to `AZURE_OPENAI_ENDPOINT`. Whatever names
it, the URL must be `https` at one of Azure's documented endpoint hosts, or a region
`eu` declared for the backend would hold for a prompt sent anywhere:

- `<resource>.openai.azure.com` (Azure OpenAI), `<resource>.cognitiveservices.azure.com`
  (Azure AI services, the same resources' other name), `<resource>.services.ai.azure.com`
  (Azure AI Foundry; LiteLLM's `azure_ai/` route reads this suffix), and the first two in
  Azure Government (`.azure.us`) and Azure operated by 21Vianet (`.azure.cn`);
- `<endpoint>.<region>.models.ai.azure.com` and
  `<endpoint>.<region>.inference.ai.azure.com` (serverless, models-as-a-service).

`models.inference.ai.azure.com` is GitHub Models' endpoint (LiteLLM's `github/`
default), not an Azure resource: it and every host under it are refused
(`x.models.inference.ai.azure.com` is no `<endpoint>.<region>` of Azure's). A URL
with userinfo (`https://x@host`), or characters a URL parser may read another way
(a backslash, a space, non-ASCII) is refused before its host is read.

Each resource name is one DNS label (`[a-z0-9-]`, in any case). The check says the
traffic goes to Azure; it does not say to which region: that is the operator's
declaration, as for every other provider. A private endpoint (Private Link) keeps the
resource's public host name (its DNS resolves privately), so it passes unchanged; an API
Management gateway or a custom domain in front of Azure does not, and needs the
backend's `unsafe_unchecked_azure_host: true` (docs/security.md): then its `base_url`
may be https at any host, or http at a loopback address (a self-hosted gateway beside
owngate), never with userinfo. The variables are never let through that way: a host the
check does not vouch for must be written in the config, where a review sees it.

`AZURE_AUTHORITY_HOST` names where Azure AD credentials go (LiteLLM's OIDC path posts the
client assertion to `<it>/<tenant>/oauth2/v2.0/token`; azure-identity reads it too),
whatever `base_url` says: when set it must be one of Microsoft's login hosts
(`AZURE_AUTHORITY_HOSTS`), over https or as a bare host name (azure-identity's form).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

__all__ = [
    "AZURE_AUTHORITY_HOSTS",
    "AZURE_AUTHORITY_VARIABLE",
    "AZURE_FORMS",
    "AZURE_PREFIXES",
    "AZURE_URL_VARIABLES",
    "azure_authority_problem",
    "azure_endpoint_problem",
]

# LiteLLM routes that send to Azure (gateway/config/provider_routes.py's Azure entry).
AZURE_PREFIXES: Final = frozenset({"azure", "azure_ai", "azure_text", "azure_speech"})
# Variables LiteLLM (1.108.7) and the OpenAI SDK read an Azure backend's URL from when it
# has no `base_url` (tests/unit/test_azure_endpoints.py re-reads LiteLLM's azure source).
AZURE_URL_VARIABLES: Final = ("AZURE_API_BASE", "AZURE_AI_API_BASE", "AZURE_OPENAI_ENDPOINT")

_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_RESOURCE_SUFFIXES: Final = (
    "openai.azure.com",
    "cognitiveservices.azure.com",
    "services.ai.azure.com",
    "openai.azure.us",
    "cognitiveservices.azure.us",
    "openai.azure.cn",
    "cognitiveservices.azure.cn",
)
_SERVERLESS_SUFFIXES: Final = ("models.ai.azure.com", "inference.ai.azure.com")
_GITHUB_MODELS: Final = "models.inference.ai.azure.com"
# Where Azure AD (Entra ID) tokens come from: the public cloud, Azure Government, Azure
# operated by 21Vianet (its older and newer names); azure-identity's known authorities.
AZURE_AUTHORITY_VARIABLE: Final = "AZURE_AUTHORITY_HOST"
AZURE_AUTHORITY_HOSTS: Final = (
    "login.microsoftonline.com",
    "login.microsoftonline.us",
    "login.chinacloudapi.cn",
    "login.partner.microsoftonline.cn",
)


def _forms(suffixes: tuple[str, ...], labels: int) -> str:
    names = "|".join(re.escape(suffix) for suffix in suffixes)
    return rf"(?:{_LABEL}\.){{{labels}}}(?:{names})"


_AZURE_HOST: Final = re.compile(
    rf"{_forms(_RESOURCE_SUFFIXES, 1)}|{_forms(_SERVERLESS_SUFFIXES, 2)}", re.IGNORECASE
)
AZURE_FORMS: Final = (
    "<resource>.openai.azure.com, <resource>.cognitiveservices.azure.com, "
    "<resource>.services.ai.azure.com (or .azure.us / .azure.cn for the first two), "
    "<endpoint>.<region>.models.ai.azure.com, <endpoint>.<region>.inference.ai.azure.com"
)


def is_azure_endpoint_host(host: str) -> bool:
    """Whether `host` has one of Azure's inference endpoint forms (`AZURE_FORMS`), or is
    under one of their domains at any depth (a resource's Private Link name,
    `<resource>.privatelink.openai.azure.com`)."""
    host = host.rstrip(".").lower()
    suffixes = (*_RESOURCE_SUFFIXES, *_SERVERLESS_SUFFIXES)
    return _AZURE_HOST.fullmatch(host) is not None or host.endswith(
        tuple(f".{suffix}" for suffix in suffixes)
    )


def azure_endpoint_problem(url: str, *, any_host: bool = False) -> str | None:
    """Why `url` is no Azure inference endpoint (a sentence naming its host, never the
    whole URL, which may carry a secret), or None when it is one. `any_host`: any host
    will do (`unsafe_unchecked_azure_host`), over https, or http to a loopback address
    (a gateway on the same machine: the bytes never leave it)."""
    if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
        return "it is not a plain ASCII URL (no spaces, backslashes or control characters)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        return "it is not a URL"
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme.lower() != "https" and not (any_host and _is_loopback(host)):
        return f"host {host!r} is not reached over https"
    if "@" in parts.netloc:
        return f"host {host!r} comes after userinfo (user@), which is refused"
    if not any_host and (
        not _AZURE_HOST.fullmatch(host) or host.lower().endswith(f".{_GITHUB_MODELS}")
    ):
        return f"host {host!r} is not an Azure endpoint ({AZURE_FORMS})"
    return None


def azure_authority_problem(value: str) -> str | None:
    """Why `value` (of `AZURE_AUTHORITY_HOST`) is no Microsoft login host (a sentence
    naming its host), or None when it is one: `https://<host>` (a path after it stays at
    that host) or the bare `<host>`."""
    if not value.isascii() or not value.isprintable() or " " in value or "\\" in value:
        return "it is not a plain ASCII URL (no spaces, backslashes or control characters)"
    try:
        parts = urlsplit(value if "://" in value else f"https://{value}")
        port = parts.port
    except ValueError:
        return "it is not a URL"
    host = (parts.hostname or "").rstrip(".").lower()
    if parts.scheme.lower() != "https":
        return f"host {host!r} is not reached over https"
    if "@" in parts.netloc or port not in (None, 443):
        return f"host {host!r} comes with userinfo or a port, which is refused"
    if host not in AZURE_AUTHORITY_HOSTS:
        return f"host {host!r} is not a Microsoft login host ({', '.join(AZURE_AUTHORITY_HOSTS)})"
    return None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
