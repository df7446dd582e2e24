"""A backend's `base_url` carries no userinfo (`user@`, `user:password@` before the host).

`https://api.openai.com@evil.example/v1` reads in a review as OpenAI's API and goes to
`evil.example` (the host is what follows the `@`): a hosted backend declared `openai`
there loaded and was judged as OpenAI. For a private backend the gateway's own client
drops the userinfo unsent, so credentials written there were silently not used. Refused
at load, naming the host and never the userinfo (it may hold a password)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config


def refused(backend: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump({"backends": [backend]}), env={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0].base_url"
    return issue.message


def hosted(base_url: str) -> dict[str, Any]:
    return {
        "id": "h",
        "kind": "hosted",
        "api_key_env": "K",
        "region": "us",
        "owner": "openai",
        "base_url": base_url,
        "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
    }


def private(base_url: str) -> dict[str, Any]:
    return {
        "id": "p",
        "kind": "vllm",
        "region": "eu-central-1",
        "owner": "acme",
        "base_url": base_url,
        "models": [{"name": "m"}],
    }


@pytest.mark.parametrize(
    "base_url",
    [
        "https://api.openai.com@evil.example/v1",
        "https://api.openai.com:443@evil.example/v1",
        "https://u:s3cret@evil.example/v1",
        "https://@evil.example/v1",
    ],
)
def test_a_hosted_base_url_with_userinfo_is_refused_naming_the_host_only(base_url: str) -> None:
    message = refused(hosted(base_url))
    assert "userinfo" in message and "'evil.example'" in message
    assert "s3cret" not in message and "api.openai.com" not in message


def test_a_private_base_url_with_credentials_is_refused_unquoted() -> None:
    message = refused(private("http://admin:s3cret@10.0.0.11:8000"))
    assert "userinfo" in message and "'10.0.0.11'" in message and "s3cret" not in message


@pytest.mark.parametrize(
    "backend",
    [hosted("https://api.openai.com/v1"), private("http://10.0.0.11:8000/v1")],
    ids=["hosted", "private"],
)
def test_a_base_url_without_userinfo_still_loads(backend: dict[str, Any]) -> None:
    config = parse_config(yaml.safe_dump({"backends": [backend]}), env={})
    assert config.backends[0].base_url == backend["base_url"]
