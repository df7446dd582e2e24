"""A Bedrock cross-Region inference profile is judged where Bedrock may process it.

`provider_model: bedrock/eu.anthropic...` (or `global.`, `us.`, an inference profile's
ARN) is sent by LiteLLM to the profile as it is, and Bedrock serves it in any Region of
the profile's geography (any commercial Region for `global.`). A backend declared
`region: eu-central-1` with such a model loaded, and `residency: {allow: [de]}` admitted
it: the policy judged Frankfurt while the prompts could go to Paris, Stockholm or, with
`global.`, anywhere. Now the backend must declare the geography's jurisdiction code,
which the policy judges as the whole area; `apac.` and `global.` have none and do not load.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config
from gateway.config.facts import backend_facts
from gateway.policy import parse_policies

GERMANY_ONLY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: [de]}
  retention: {max_days: any}
  fallback: {mode: when_private_unavailable, to: [{provider: "*"}]}
"""


def bedrock(region: str, provider_model: str) -> str:
    backend: dict[str, Any] = {
        "id": "bedrock",
        "kind": "hosted",
        "provider": "aws",
        "owner": "aws",
        "api_key_env": "K",
        "region": region,
        "models": [{"name": "m", "provider_model": provider_model}],
    }
    return yaml.safe_dump({"backends": [backend]})


def refused(region: str, provider_model: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(bedrock(region, provider_model), env={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0]"
    return issue.message


@pytest.mark.parametrize(
    ("region", "provider_model", "declare"),
    [
        ("eu-central-1", "bedrock/eu.anthropic.claude-3-7-sonnet-20250219-v1:0", "eu"),
        ("eu-central-1", "bedrock/converse/eu.amazon.nova-pro-v1:0", "eu"),
        ("de", "bedrock/EU.anthropic.claude-3-7-sonnet-20250219-v1:0", "eu"),
        ("us-east-1", "bedrock/us.meta.llama3-3-70b-instruct-v1:0", "us"),
        ("us-gov-west-1", "bedrock/us-gov.anthropic.claude-3-5-sonnet-20240620-v1:0", "us"),
        ("ap-northeast-1", "bedrock/jp.anthropic.claude-sonnet-4-5-20250929-v1:0", "jp"),
        # a system-defined profile's ARN, plain and percent-encoded
        (
            "eu-central-1",
            "bedrock/arn:aws:bedrock:eu-central-1:123456789012:inference-profile/"
            "eu.anthropic.claude-3-7-sonnet-20250219-v1:0",
            "eu",
        ),
        (
            "eu-central-1",
            "bedrock/arn%3Aaws%3Abedrock%3Aeu-central-1%3A123456789012%3Ainference-profile"
            "%2Feu.anthropic.claude-3-7-sonnet-20250219-v1%3A0",
            "eu",
        ),
    ],
)
def test_a_geography_profile_declared_as_one_region_does_not_load(
    region: str, provider_model: str, declare: str
) -> None:
    message = refused(region, provider_model)
    assert "cross-Region inference profile" in message
    assert f"declare region: {declare}" in message


@pytest.mark.parametrize(
    "provider_model",
    [
        "bedrock/global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "bedrock/converse/global.amazon.nova-2-lite-v1:0",
        "bedrock/apac.anthropic.claude-3-5-sonnet-20240620-v1:0",
    ],
)
@pytest.mark.parametrize("region", ["eu-central-1", "eu", "us", "global", "apac"])
def test_a_profile_no_jurisdiction_code_covers_does_not_load(
    region: str, provider_model: str
) -> None:
    message = refused(region, provider_model)
    assert "no jurisdiction code covers" in message


@pytest.mark.parametrize(
    ("region", "provider_model"),
    [
        ("eu-central-1", "bedrock/anthropic.claude-3-haiku-20240307-v1:0"),  # in-Region
        ("eu-central-1", "bedrock/converse/amazon.nova-pro-v1:0"),
        ("eu", "bedrock/eu.anthropic.claude-3-7-sonnet-20250219-v1:0"),
        ("EU", "bedrock/converse/eu.amazon.nova-pro-v1:0"),
        ("us", "bedrock/us.meta.llama3-3-70b-instruct-v1:0"),
        ("us", "bedrock/us-gov.anthropic.claude-3-5-sonnet-20240620-v1:0"),
        # an application inference profile does not say what it wraps: not judged here
        (
            "eu-central-1",
            "bedrock/arn:aws:bedrock:eu-central-1:123456789012:application-inference-profile/"
            "a1b2c3",
        ),
    ],
)
def test_in_region_models_and_profiles_declared_as_their_area_load(
    region: str, provider_model: str
) -> None:
    parse_config(bedrock(region, provider_model), env={})


def test_a_profile_declared_as_its_area_is_judged_as_the_whole_area() -> None:
    """What the declaration buys: `allow: [de]` no longer admits an EU-wide profile."""
    config = parse_config(bedrock("eu", "bedrock/eu.anthropic.claude-3-7-v1:0"), env={})
    decision = parse_policies([("p.yaml", GERMANY_ONLY)], backend_facts(config)).decide(
        "t", "m", None
    )
    assert decision.hosted == ()
    assert decision.refusal is not None
