"""A Vertex AI backend's `base_url` names the Google Cloud location it is sent to.

`base_url: https://us-central1-aiplatform.googleapis.com` on a backend declared
`region: europe-west4` loaded: LiteLLM sends there, and a policy allowing only Europe
admitted it. Every location the URL names (host or `/locations/<loc>/` path) must now be
the declared region or within a declared code; `global` is refused.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config

MODEL = "vertex_ai/gemini-2.0-flash"
EU_PATH = "/v1/projects/p/locations/europe-west4/publishers/google/models/gemini-2.0-flash"
US_PATH = EU_PATH.replace("europe-west4", "us-central1")


def vertex(region: str, base_url: str, provider_model: str = MODEL) -> str:
    backend: dict[str, Any] = {
        "id": "vertex",
        "kind": "hosted",
        "provider": "google",
        "owner": "google",
        "api_key_env": "K",
        "region": region,
        "base_url": base_url,
        "models": [{"name": "m", "provider_model": provider_model}],
    }
    return yaml.safe_dump({"backends": [backend]})


@pytest.mark.parametrize(
    ("region", "base_url", "says"),
    [
        ("europe-west4", "https://us-central1-aiplatform.googleapis.com", "'us-central1'"),
        ("de", "https://US-CENTRAL1-AIPLATFORM.googleapis.com.", "'us-central1'"),
        ("eu", "https://aiplatform.us.rep.googleapis.com", "'us'"),
        (
            "europe-west4",
            "https://aiplatform.googleapis.com/v1/projects/p/locations/us-east4/x",
            "'us-east4'",
        ),
        (
            "europe-west4",
            f"https://europe-west4-aiplatform.googleapis.com{US_PATH}",
            "'us-central1'",
        ),
        ("eu", "https://aiplatform.googleapis.com/v1/projects/p/locations/global/x", "'global'"),
    ],
)
def test_a_vertex_base_url_in_another_location_than_declared_does_not_load(
    region: str, base_url: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(vertex(region, base_url), env={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0]"
    assert f"Vertex AI location {says}" in issue.message


@pytest.mark.parametrize(
    ("region", "base_url", "provider_model"),
    [
        ("europe-west4", "https://europe-west4-aiplatform.googleapis.com", MODEL),
        ("eu", f"https://europe-west4-aiplatform.googleapis.com{EU_PATH}", MODEL),
        ("eu", "https://aiplatform.eu.rep.googleapis.com", MODEL),
        ("de", "https://europe-west3-aiplatform.googleapis.com", "vertex_ai_beta/gemini-pro"),
        # not a Vertex route: the location rule does not apply
        ("europe-west4", "https://us-central1-aiplatform.googleapis.com", "gemini/gemini-pro"),
    ],
)
def test_a_vertex_base_url_within_the_declared_region_loads(
    region: str, base_url: str, provider_model: str
) -> None:
    parse_config(vertex(region, base_url, provider_model), env={})
