"""An OpenAI backend at a data-residency host (`eu.api.openai.com`) must declare that area
(gateway/config/openai_regions.py): policies judge the declared `region`, OpenAI processes
the requests in the area the host names."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config


def openai(region: str, base_url: str) -> str:
    backend: dict[str, Any] = {
        "id": "openai",
        "kind": "hosted",
        "provider": "openai",
        "owner": "openai",
        "api_key_env": "K",
        "region": region,
        "base_url": base_url,
        "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
    }
    return yaml.safe_dump({"backends": [backend]})


@pytest.mark.parametrize(
    ("region", "base_url"),
    [
        ("us", "https://eu.api.openai.com/v1"),  # Europe, judged as the US
        ("de", "https://eu.api.openai.com/v1"),  # anywhere in the EU, judged as Germany
        ("eu-central-1", "https://EU.API.OPENAI.COM./v1"),
        ("eu", "https://jp.api.openai.com/v1"),
    ],
)
def test_a_data_residency_host_of_another_area_than_declared_does_not_load(
    region: str, base_url: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(openai(region, base_url), env={})
    area = base_url.split("//")[1].split(".")[0].lower()
    assert f"data-residency endpoint for {area!r}" in str(info.value)
    assert f"declares region {region!r}" in str(info.value)


@pytest.mark.parametrize(
    ("region", "base_url"),
    [
        ("eu", "https://eu.api.openai.com/v1"),
        ("EU", "https://eu.api.openai.com/v1"),
        ("us", "https://api.openai.com/v1"),  # names no area: taken as declared
    ],
)
def test_a_data_residency_host_declared_as_its_area_loads(region: str, base_url: str) -> None:
    config = parse_config(openai(region, base_url), env={})
    assert config.backends[0].region == region
