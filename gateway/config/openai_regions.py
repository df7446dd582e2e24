"""Whether OpenAI's data-residency endpoint a backend's `base_url` names is its declared region.

OpenAI serves a data-residency project at a host that names its area
(`https://eu.api.openai.com/v1`: requests processed and stored in the EU), not at
`api.openai.com`. A policy judges the backend by its declared `region`: a backend at
`eu.api.openai.com` declared `region: us` passed `residency: {allow: [us]}` while its
prompts went to Europe, and one declared `de` passed `allow: [de]` while OpenAI may
process them anywhere in the EU. So the area such a host names must be the declared
`region` or inside it, read as a jurisdiction code (`eu` is inside `eu` only, as a
Bedrock `eu.` profile is: gateway/config/bedrock_profiles.py). `api.openai.com` names no
area and is taken as declared (docs/configuration.md).
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from gateway.policy.jurisdictions import expand, is_jurisdiction, region_matches

__all__ = ["check_openai_region"]

# `<area>.api.openai.com`: a data-residency endpoint naming its area.
_AREA_HOST: Final = re.compile(r"([a-z0-9-]+)\.api\.openai\.com")


def check_openai_region(region: str, base_url: str | None) -> None:
    """Raise ValueError when `base_url` is an OpenAI data-residency host whose area is not
    the declared `region` (nor inside it)."""
    if base_url is None:
        return
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    match = _AREA_HOST.fullmatch(host)
    if match is None:
        return
    area = match.group(1)
    inside = area == region.lower() or (
        is_jurisdiction(region) and region_matches(area, expand(region)) is not None
    )
    if not inside:
        raise ValueError(
            f"base_url host {host!r} is OpenAI's data-residency endpoint for {area[:40]!r}, "
            f"where OpenAI processes its requests, but the backend declares region "
            f"{region!r}, which policies judge: declare region: {area[:40]}"
        )
