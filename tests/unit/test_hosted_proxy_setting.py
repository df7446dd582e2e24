"""A hosted backend's `proxy` (gateway/config/backends.py): the one way a hosted call goes
through a proxy (the environment's `HTTP_PROXY` and the like are never used), so its shape is
checked when the config loads (tests/integration/test_environment_egress.py: where calls
go with it, and `/admin/v1/status` showing it)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.schema import BackendSettings


def _hosted(**fields: Any) -> BackendSettings:
    return BackendSettings.model_validate(
        {
            "id": "openai",
            "kind": "hosted",
            "provider": "openai",
            "models": [{"name": "g", "provider_model": "openai/gpt-4o-mini"}],
            "region": "us",
            "owner": "openai",
            "api_key_env": "OPENAI_API_KEY",
            **fields,
        }
    )


def test_no_proxy_by_default() -> None:
    assert _hosted().proxy is None


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ("http://egress.internal:3128", "http://egress.internal:3128"),
        ("http://10.0.0.9:8080/", "http://10.0.0.9:8080"),
        ("http://[fd00::9]:3128", "http://[fd00::9]:3128"),
        ("HTTP://Egress.Internal:03128", "http://egress.internal:3128"),
        ("http://squid_1.internal:3128", "http://squid_1.internal:3128"),
    ],
)
def test_an_http_proxy_with_its_port_is_kept(written: str, kept: str) -> None:
    assert _hosted(proxy=written).proxy == kept


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("https://egress.internal:3128", "http:// URL"),
        ("socks5://egress.internal:1080", "http:// URL"),
        ("egress.internal:3128", "http:// URL"),
        ("http://egress.internal", "name its port"),
        ("http://egress.internal:99999", "invalid port"),
        ("http://user:secret@egress.internal:3128", "credentials"),
        ("http://egress.internal:3128/path", "without a path"),
        ("http://egress.internal:3128?x=1", "without a path"),
        ("http://egress.internal:3128\n", "plain ASCII"),
        # Taken before, and then every call of the backend failed to connect:
        ("http://egress.internal:0", "invalid port"),
        ("http://[fd00::9]x:3128", "host"),  # `x` was dropped from the host, kept in the URL
        ("http://%65gress.internal:3128", "host"),
        ("http://egress..internal:3128", "host"),
        ("http://[fd00::9%25eth0]:3128", "host"),  # a zone: not a plain IPv6 literal
    ],
)
def test_a_proxy_of_another_shape_is_refused_naming_why(written: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as caught:
        _hosted(proxy=written)
    assert "secret" not in str(caught.value).split("input_value")[0]


def test_a_private_backend_takes_no_proxy() -> None:
    with pytest.raises(ValidationError, match="hosted backends only"):
        BackendSettings.model_validate(
            {
                "id": "gpu",
                "kind": "vllm",
                "base_url": "http://10.0.0.12:8000",
                "models": [{"name": "m"}],
                "region": "eu",
                "owner": "acme",
                "proxy": "http://egress.internal:3128",
            }
        )
