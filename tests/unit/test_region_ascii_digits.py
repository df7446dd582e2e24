"""A declared region with a non-ASCII digit (`eu-central-` and U+0661, an Arabic-Indic
one) is no AWS Region or Google Cloud location: the config load says so. Before, Python's
`\\d` took it, and the backend's calls were pinned to a Region no AWS endpoint has
(LiteLLM refused each call at run time instead of the config at load)."""

from __future__ import annotations

import pytest

from gateway.upstream.provider_regions import pinned_regions


@pytest.mark.parametrize(
    ("region", "model"),
    [("eu-central-\u0661", "bedrock/anthropic.claude"), ("europe-west\uff14", "vertex_ai/gemini")],
)
def test_a_region_with_a_non_ascii_digit_is_refused_at_load(region: str, model: str) -> None:
    with pytest.raises(ValueError, match="declared region"):
        pinned_regions("b", region, [model], {}, base_url=None)


@pytest.mark.parametrize(
    ("region", "model", "pin"),
    [
        ("eu-central-1", "bedrock/anthropic.claude", {"aws_region_name": "eu-central-1"}),
        ("europe-west4", "vertex_ai/gemini", {"vertex_location": "europe-west4"}),
    ],
)
def test_an_ascii_region_is_pinned(region: str, model: str, pin: dict[str, str]) -> None:
    assert pinned_regions("b", region, [model], {}, base_url=None) == {model: pin}
