"""Whether the Google Cloud location a Vertex AI backend's `base_url` names is its declared region.

A policy judges a hosted backend by its declared `region`. LiteLLM sends a `vertex_ai/`
model to `base_url` when one is given: the host names a location
(`europe-west4-aiplatform.googleapis.com`, the multi-region `aiplatform.eu.rep.googleapis.com`)
and so may the path (`.../locations/europe-west4/...`). A backend declared
`region: europe-west4` with `base_url: https://us-central1-aiplatform.googleapis.com` loaded,
and `residency: {allow: [de]}`-style policies judged Europe while the prompts went to Iowa.
So every location the URL names must be the declared region (or in the area of a
declared code: `region: eu` takes `europe-west4`); the `global` location (Google may
serve it in any region) has no code and is refused. Where the URL names no location (the
global host `aiplatform.googleapis.com` with none in the path, or no `base_url`), LiteLLM
would take it from `VERTEXAI_LOCATION`: each call names it instead
(gateway/upstream/provider_regions.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import unquote, urlsplit

from gateway.policy.jurisdictions import expand, is_jurisdiction, region_matches

__all__ = ["VERTEX_PREFIXES", "check_vertex_regions", "named_locations"]

VERTEX_PREFIXES: Final = ("vertex_ai/", "vertex_ai_beta/")
_REGIONAL_HOST: Final = re.compile(r"([a-z0-9-]+)-aiplatform\.googleapis\.com")
_MULTI_REGION_HOST: Final = re.compile(r"aiplatform\.([a-z0-9-]+)\.rep\.googleapis\.com")
_PATH_LOCATION: Final = re.compile(r"/locations/([^/:]+)")


def check_vertex_regions(region: str, provider_models: Iterable[str], base_url: str | None) -> None:
    """Raise ValueError when a Vertex AI backend's `base_url` names a Google Cloud location
    (in its host or path) that is not the declared `region` (nor in its area)."""
    if base_url is None or not any(m.startswith(VERTEX_PREFIXES) for m in provider_models):
        return
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    for location in named_locations(base_url):
        if location == "global":
            raise ValueError(
                f"base_url {host!r} names the Vertex AI location 'global', which Google may "
                "serve in any region, and no jurisdiction code covers that for policies to "
                "judge: use a regional endpoint"
            )
        if not _within(location, region):
            raise ValueError(
                f"base_url names the Vertex AI location {location!r}, but the backend "
                f"declares region {region!r}, which policies judge"
            )


def named_locations(base_url: str) -> list[str]:
    """The Google Cloud locations `base_url` names: its path's (`/locations/<x>`), then
    its host's (`<x>-aiplatform.googleapis.com`, `aiplatform.<x>.rep.googleapis.com`)."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower().rstrip(".")
    named = [m.lower() for m in _PATH_LOCATION.findall(unquote(parts.path))]
    named += [
        m.group(1)
        for m in (_REGIONAL_HOST.fullmatch(host), _MULTI_REGION_HOST.fullmatch(host))
        if m
    ]
    return named


def _within(location: str, declared: str) -> bool:
    """Whether `location` is the declared region, or in the area a declared code names."""
    if location == declared.lower():
        return True
    return is_jurisdiction(declared) and region_matches(location, expand(declared)) is not None
