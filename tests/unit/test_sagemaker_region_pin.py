"""An AWS backend's Region is pinned even with a `base_url`
(gateway/upstream/provider_regions.py). A SageMaker one's: LiteLLM 1.108.7 builds
SageMaker's URL from the Region alone (`runtime.sagemaker.<region>.amazonaws.com`) and
never reads `api_base`, so such a backend went to the Region the environment named
(`AWS_REGION_NAME=us-east-1` for a backend declared `region: eu`), not to its `base_url`.
A Bedrock one's: its calls go to the `base_url`, but are signed for the call's Region."""

from __future__ import annotations

import pytest

from gateway.upstream.provider_regions import pinned_regions

_BASE = "https://runtime.sagemaker.eu-central-1.amazonaws.com"


@pytest.mark.parametrize("model", ["sagemaker/ep", "sagemaker_chat/ep", "sagemaker_nova/ep"])
def test_a_sagemaker_backend_with_a_base_url_is_pinned_to_its_declared_region(model: str) -> None:
    pins = pinned_regions(
        "s", "eu-central-1", [model], {"AWS_REGION_NAME": "us-east-1"}, base_url=_BASE
    )
    assert pins == {model: {"aws_region_name": "eu-central-1"}}


def test_one_whose_environment_names_a_region_outside_the_declared_one_is_refused() -> None:
    with pytest.raises(ValueError, match="us-east-1"):
        pinned_regions(
            "s", "eu", ["sagemaker/ep"], {"AWS_REGION_NAME": "us-east-1"}, base_url=_BASE
        )


_ARN = "bedrock/arn:aws:bedrock:{}:123456789012:inference-profile/x"


@pytest.mark.parametrize(
    ("region", "model", "base_url", "signed_for"),
    [
        # an AWS host: its Region (checked within the declared one at config load)
        (
            "eu",
            "bedrock/anthropic.claude-x",
            _BASE.replace("runtime.sagemaker", "bedrock-runtime"),
            "eu-central-1",
        ),
        # another host (a proxy, an endpoint on loopback): the declared Region
        ("eu-west-1", "bedrock/anthropic.claude-x", "http://127.0.0.1:8000", "eu-west-1"),
        # an ARN within the declared area, which LiteLLM would have taken
        ("eu", _ARN.format("eu-central-1"), "http://127.0.0.1:8000", "eu-central-1"),
        # an ARN outside it (the config check reads a base_url's host alone): not taken
        ("eu-west-1", _ARN.format("us-east-1"), "http://127.0.0.1:8000", "eu-west-1"),
    ],
)
def test_a_bedrock_backend_with_a_base_url_is_signed_for_the_region_it_goes_to(
    region: str, model: str, base_url: str, signed_for: str
) -> None:
    """LiteLLM signs a Bedrock call (SigV4) for the call's `aws_region_name`, else the
    environment's Region, else `us-west-2`, whatever its `base_url`: unpinned, a backend
    declared `eu-west-1` signed for `us-east-1` here (tests/integration/
    test_hosted_aws_signing_region.py)."""
    pins = pinned_regions("b", region, [model], {"AWS_REGION_NAME": "us-east-1"}, base_url=base_url)
    assert pins == {model: {"aws_region_name": signed_for}}


def test_a_bedrock_backend_whose_region_cannot_be_named_so_is_refused() -> None:
    with pytest.raises(ValueError, match="us-east-1"):
        pinned_regions(
            "b",
            "eu",
            ["bedrock/anthropic.claude-x"],
            {"AWS_REGION_NAME": "us-east-1"},
            base_url="http://127.0.0.1:8000",
        )
