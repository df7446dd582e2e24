"""A SageMaker backend's Region is pinned even with a `base_url`
(gateway/upstream/provider_regions.py): LiteLLM 1.108.7 builds SageMaker's URL from the
Region alone (`runtime.sagemaker.<region>.amazonaws.com`) and never reads `api_base`, so
such a backend went to the Region the environment named (`AWS_REGION_NAME=us-east-1` for
a backend declared `region: eu`), not to its `base_url`."""

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


def test_a_bedrock_backend_with_a_base_url_still_goes_to_that_url() -> None:
    pins = pinned_regions(
        "b",
        "eu",
        ["bedrock/anthropic.claude-x"],
        {"AWS_REGION_NAME": "us-east-1"},
        base_url="https://bedrock-runtime.eu-central-1.amazonaws.com",
    )
    assert pins == {}
