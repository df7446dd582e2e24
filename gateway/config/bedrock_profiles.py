"""Whether a Bedrock backend's declared `region` says where its requests are processed.

A policy judges a hosted backend by its declared `region` (`residency.allow: [de]`). A
Bedrock `provider_model` may name a cross-Region inference profile instead of a model:
`bedrock/eu.anthropic.claude-...`, `bedrock/converse/global.anthropic.claude-...`, or the
profile's ARN (`...:inference-profile/us.meta.llama...`). LiteLLM sends that id as it is
(`/model/eu.anthropic.../converse` at the region's endpoint), and Bedrock then processes
the request in any Region of the profile's geography, or, for `global.`, in any
commercial Region. A backend declared `region: eu-central-1` with such a model passed
`residency.allow: [de]` while its prompts could be served in Paris, Stockholm or, with
`global.`, Virginia.

So a profile's backend must declare its geography as the jurisdiction code that names it
(`us.` and `us-gov.`: `us`; `eu.`: `eu`; `jp.`, `au.`, `ca.`: the country), which a
policy judges as the whole area (an allow must cover all of it, a deny of any part
excludes it: docs/policies.md). `apac.` (Regions from India to Japan, Australia and the
UAE) and `global.` have no code: they are refused. An application inference profile's
ARN (`application-inference-profile/<id>`) does not say what it wraps: not checked
(docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final
from urllib.parse import unquote

__all__ = ["check_bedrock_profiles"]

_BEDROCK_PREFIXES: Final = ("bedrock/",)
# A system-defined profile's geography (the id's first dot-separated part) and the
# jurisdiction code to declare for it; None: no code covers it.
_GEOGRAPHIES: Final[dict[str, str | None]] = {
    "us": "us",
    "us-gov": "us",
    "eu": "eu",
    "jp": "jp",
    "au": "au",
    "ca": "ca",
    "apac": None,
    "global": None,
}


def check_bedrock_profiles(region: str, provider_models: Iterable[str]) -> None:
    """Raise ValueError when a `provider_model` names a Bedrock cross-Region inference
    profile whose geography the declared `region` does not name."""
    for model in provider_models:
        geography = _geography(model)
        if geography is None:
            continue
        code = _GEOGRAPHIES[geography]
        where = (
            "any commercial AWS Region"
            if geography == "global"
            else f"any Region of its geography ({geography})"
        )
        head = (
            f"provider_model {model!r} is a Bedrock cross-Region inference profile: "
            f"Bedrock may process its requests in {where}, not only in the declared region"
        )
        if code is None:
            raise ValueError(
                f"{head}, and no jurisdiction code covers that area for policies to judge: "
                "use a geography profile (us., eu., jp., au., ca.) or the in-Region model id"
            )
        if region.lower() != code:
            raise ValueError(
                f"{head} {region!r}: declare region: {code} (policies then judge the whole "
                "area), or use the in-Region model id"
            )


def _geography(provider_model: str) -> str | None:
    """The geography of the cross-Region profile `provider_model` names, or None."""
    if not provider_model.startswith(_BEDROCK_PREFIXES):
        return None
    # The model id is the last part (after route parts such as `converse/`, or an ARN's
    # `inference-profile/`); LiteLLM takes it percent-encoded too.
    last = unquote(provider_model).rsplit("/", 1)[-1]
    first = last.split(".", 1)[0].lower()
    return first if first in _GEOGRAPHIES and "." in last else None
