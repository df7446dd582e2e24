"""A Bedrock cross-Region inference profile is judged where Bedrock may process it.

`provider_model: bedrock/eu.anthropic...` (or `global.`, `us.`, an inference profile's
ARN) is sent by LiteLLM to the profile as it is, and Bedrock serves it in any Region of
the profile's geography (any commercial Region for `global.`). A backend declared
`region: eu-central-1` with such a model loaded, and `residency: {allow: [de]}` admitted
it: the policy judged Frankfurt while the prompts could go to Paris, Stockholm or, with
`global.`, anywhere. Now the backend must declare the geography's jurisdiction code,
which the policy judges as the whole area; `apac.` and `global.` have none and do not load.

The AWS Region the config itself names must be the declared one too: an ARN's Region
(`bedrock/arn:aws:bedrock:us-east-1:...`), which LiteLLM sends to over `AWS_REGION_NAME`
(a backend declared `eu-central-1` went to `bedrock-runtime.us-east-1.amazonaws.com`), and
a `base_url` host's (`bedrock-runtime.us-east-1.amazonaws.com`).
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


def bedrock(region: str, provider_model: str, base_url: str | None = None) -> str:
    backend: dict[str, Any] = {
        "id": "bedrock",
        "kind": "hosted",
        "provider": "aws",
        "owner": "aws",
        "api_key_env": "K",
        "region": region,
        "models": [{"name": "m", "provider_model": provider_model}],
    }
    if base_url is not None:
        backend["base_url"] = base_url
    return yaml.safe_dump({"backends": [backend]})


def refused(region: str, provider_model: str, base_url: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(bedrock(region, provider_model, base_url), env={})
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


US_ARN = "bedrock/arn:aws:bedrock:us-east-1:123456789012:foundation-model/anthropic.claude-v2"


@pytest.mark.parametrize(
    "provider_model",
    [
        US_ARN,
        US_ARN.replace("bedrock/", "bedrock/converse/"),
        "bedrock/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Afoundation-model%2Fx",
        "bedrock/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2",
        # LiteLLM finds an ARN anywhere in the string and reads the 4th `:` part as it is
        "bedrock/x:y:z:us-east-1:arn:aws:bedrock",
        "bedrock/arn:aws:bedrock-agent:us-east-1:123456789012:x",
        "bedrock/converse/arn:aws-us-gov:bedrock:us-east-1:123456789012:x",
        # LiteLLM's other AWS routes read an ARN's Region the same way
        "bedrock_mantle/arn:aws:bedrock:us-east-1:123456789012:foundation-model/x",
    ],
)
@pytest.mark.parametrize("region", ["eu-central-1", "eu", "de", "us-west-2"])
def test_an_arn_in_another_region_than_declared_does_not_load(
    region: str, provider_model: str
) -> None:
    message = refused(region, provider_model)
    assert "is an ARN in AWS Region 'us-east-1'" in message


@pytest.mark.parametrize(
    "provider_model",
    [
        "sagemaker/arn:aws:bedrock:us-east-1:123456789012:endpoint/x",
        "sagemaker_chat/arn:aws:bedrock:us-east-1:123456789012:endpoint/x",
        "sagemaker_nova/x:y:z:us-east-1:arn:aws:bedrock",
    ],
)
@pytest.mark.parametrize(
    "base_url", ["https://runtime.sagemaker.eu-west-1.amazonaws.com", "http://127.0.0.1:8000"]
)
def test_a_sagemaker_arn_in_another_region_does_not_load_whatever_its_base_url(
    provider_model: str, base_url: str
) -> None:
    """LiteLLM builds a SageMaker call's URL from its Region alone (never reading
    `api_base`), an ARN's when the model names one; the config check read a `base_url`'s
    host alone, so a backend declared eu-west-1 with a `base_url` loaded, and its calls
    were pinned to the ARN's us-east-1 (gateway/upstream/provider_regions.py)."""
    message = refused("eu-west-1", provider_model, base_url)
    assert "is an ARN in AWS Region 'us-east-1'" in message


@pytest.mark.parametrize(
    ("region", "base_url"),
    [
        ("eu-central-1", "https://bedrock-runtime.us-east-1.amazonaws.com"),
        ("de", "https://bedrock-runtime-fips.us-east-1.amazonaws.com/"),
        ("eu", "https://vpce-0a1b-c2d3.bedrock-runtime.us-east-1.vpce.amazonaws.com"),
        ("eu-central-1", "https://BEDROCK-RUNTIME.US-EAST-1.AMAZONAWS.COM."),
        ("eu-central-1", "https://bedrock-runtime.us-east-1.api.aws"),  # dual-stack
        ("eu-central-1", "https://bedrock-runtime.us-east-1.api.aws.:443/v1"),
        # every Region-shaped label counts, not only the first
        ("eu-central-1", "https://bedrock-runtime.eu-central-1.us-east-1.amazonaws.com"),
    ],
)
def test_a_base_url_in_another_aws_region_than_declared_does_not_load(
    region: str, base_url: str
) -> None:
    message = refused(region, "bedrock/anthropic.claude-3-haiku-20240307-v1:0", base_url)
    assert "is in AWS Region 'us-east-1'" in message


@pytest.mark.parametrize(
    ("region", "provider_model", "base_url"),
    [
        ("us-east-1", US_ARN, None),
        ("us", US_ARN, None),
        ("US-EAST-1", US_ARN, None),
        # with base_url the host says where: the ARN names the model there
        ("us-east-1", US_ARN, "https://bedrock-runtime.us-east-1.amazonaws.com"),
        ("eu-central-1", "bedrock/amazon.y", "https://bedrock-runtime.eu-central-1.amazonaws.com"),
        ("de", "bedrock/amazon.y", "https://bedrock-runtime.eu-central-1.amazonaws.com"),
        ("eu", "bedrock/eu.amazon.y", "https://bedrock-runtime.eu-west-3.amazonaws.com"),
        ("eu-central-1", "bedrock/amazon.y", "https://bedrock-runtime.eu-central-1.api.aws"),
    ],
)
def test_a_region_the_config_names_within_the_declared_one_loads(
    region: str, provider_model: str, base_url: str | None
) -> None:
    parse_config(bedrock(region, provider_model, base_url), env={})


@pytest.mark.parametrize(
    ("region", "provider_model"),
    [
        # India's geography profile (in LiteLLM's model map): Mumbai and Hyderabad
        ("ap-south-1", "bedrock/in.moonshotai.kimi-k3"),
        ("in", "bedrock/converse/global.anthropic.claude-sonnet-4-5-20250929-v1:0"),
    ],
)
def test_the_india_profile_and_global_are_not_taken_for_one_region(
    region: str, provider_model: str
) -> None:
    message = refused(region, provider_model)
    assert "cross-Region inference profile" in message


def test_the_india_profile_declared_as_india_loads() -> None:
    parse_config(bedrock("in", "bedrock/in.moonshotai.kimi-k3"), env={})


@pytest.mark.parametrize(
    "provider_model",
    [
        # a geography Bedrock may add later: served across Regions, not in eu-central-1
        "bedrock/me.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "bedrock/converse/sa.amazon.nova-pro-v1:0",
        "bedrock/arn:aws:bedrock:eu-central-1:123456789012:inference-profile/"
        "xx.anthropic.claude-3-7-sonnet-20250219-v1:0",
        "bedrock/ME%2Eanthropic.claude-3",
    ],
)
def test_an_unknown_first_part_of_a_bedrock_model_id_does_not_load(provider_model: str) -> None:
    message = refused("eu-central-1", provider_model)
    assert "neither a Bedrock model provider nor a cross-Region" in message
    first = provider_model.replace("%2E", ".").rsplit("/", 1)[-1].split(".")[0].lower()
    assert repr(first) in message


@pytest.mark.parametrize(
    "provider_model",
    [
        "bedrock/meta.llama3-3-70b-instruct-v1:0",
        "bedrock/converse/moonshotai.kimi-k2-thinking",
        "bedrock/MISTRAL.mistral-large-2402-v1:0",
        "bedrock/arn:aws:bedrock:eu-central-1:123456789012:provisioned-model/abc123",
    ],
)
def test_known_providers_and_ids_without_a_namespace_load(provider_model: str) -> None:
    parse_config(bedrock("eu-central-1", provider_model), env={})
