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
(`us.` and `us-gov.`: `us`; `eu.`: `eu`; `jp.`, `au.`, `ca.`, `in.`: the country), which a
policy judges as the whole area (an allow must cover all of it, a deny of any part
excludes it: docs/policies.md). `apac.` (Regions from India to Japan, Australia and the
UAE) and `global.` have no code: they are refused. An application inference profile's
ARN (`application-inference-profile/<id>`) does not say what it wraps: not checked
(docs/security.md). A model id whose first part is neither a known model provider's
namespace (`anthropic.`) nor a known geography is refused, naming it: a geography Bedrock
adds later must not pass as an in-Region model.

The Region a Bedrock request is sent to is also written in the config itself, and must be
the declared one (or in the area of a declared code: `region: eu` takes `eu-central-1`):
without `base_url`, an ARN's Region (`arn:aws:bedrock:us-east-1:...`, read as LiteLLM
reads it on each AWS route), which LiteLLM takes over `AWS_REGION_NAME` (it sent a
backend declared `eu-central-1` to `bedrock-runtime.us-east-1.amazonaws.com`); with one,
the Region in an AWS host name (`bedrock-runtime.us-east-1.amazonaws.com`). Without
either, LiteLLM would take the Region from the environment: each call names it instead
(gateway/upstream/provider_regions.py), the one a `base_url` host names too (`host_region`):
the URL says where a call goes, the Region it is signed for is the call's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import unquote, urlsplit

from gateway.policy.jurisdictions import expand, is_jurisdiction, region_matches

__all__ = [
    "AWS_PREFIXES",
    "AWS_REGION",
    "REGION_ONLY_PREFIXES",
    "arn_region",
    "check_bedrock_profiles",
    "check_bedrock_regions",
    "host_region",
]

_BEDROCK_PREFIXES: Final = ("bedrock/",)
# LiteLLM's AWS routes: each reads the Region from a Bedrock ARN in the model string
# (`BaseAWSLLM._get_aws_region_name`; bedrock_mantle's endpoint is
# `bedrock-mantle.<region>.api.aws`).
AWS_PREFIXES: Final = (
    "bedrock/",
    "bedrock_mantle/",
    "sagemaker/",
    "sagemaker_chat/",
    "sagemaker_nova/",
)
# AWS routes whose URL LiteLLM builds from the Region whatever `base_url` says
# (`runtime.sagemaker.<region>.amazonaws.com`): their ARN's Region is where they go.
REGION_ONLY_PREFIXES: Final = ("sagemaker/", "sagemaker_chat/", "sagemaker_nova/")
# An AWS Region name (LiteLLM's `_VALID_AWS_REGION_PATTERN` takes these and more).
AWS_REGION: Final = re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}")  # ASCII: `\d` is any digit
# AWS's endpoint domains: IPv4 (`.amazonaws.com`, China's `.amazonaws.com.cn`) and
# dual-stack (`bedrock-runtime.<region>.api.aws`).
_AWS_DOMAINS: Final = ("amazonaws.com", "amazonaws.com.cn", "api.aws")
# What LiteLLM 1.108.7 takes for a Bedrock ARN and its Region (litellm_core_utils/
# aws_partition.py `_BEDROCK_ARN_PATTERN`, base_aws_llm.py `_VALID_AWS_REGION_PATTERN`):
# such an ARN anywhere in the model string, and the model's 4th `:`-separated part.
_LITELLM_ARN: Final = re.compile(r"arn:aws(?:-[a-z0-9-]+)?:bedrock")
_LITELLM_REGION: Final = re.compile(r"[a-z0-9-]+")
# A system-defined profile's geography (the id's first dot-separated part) and the
# jurisdiction code to declare for it; None: no code covers it.
_GEOGRAPHIES: Final[dict[str, str | None]] = {
    "us": "us",
    "us-gov": "us",
    "eu": "eu",
    "jp": "jp",
    "au": "au",
    "ca": "ca",
    "in": "in",
    "apac": None,
    "global": None,
}
# The model providers' namespaces of Bedrock's model ids (`anthropic.claude-...`), as in
# LiteLLM 1.108.7's model map and its Bedrock routes. A first part that is neither one of
# these nor a geography above is refused: a geography Bedrock adds later (`me.`, ...)
# would otherwise pass as an in-Region model while Bedrock serves it across Regions.
_PROVIDERS: Final = frozenset(
    (
        "ai21", "amazon", "anthropic", "cohere", "deepseek", "google", "meta", "minimax",
        "mistral", "moonshot", "moonshotai", "nvidia", "openai", "qwen", "stability",
        "twelvelabs", "writer", "xai", "zai",
    )
)  # fmt: skip


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
                "use a geography profile (us., eu., jp., au., ca., in.) or the in-Region model id"
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
    if "." not in last:
        return None  # no namespace: an ARN's own id (provisioned, application profile)
    first = last.split(".", 1)[0].lower()
    if first in _GEOGRAPHIES:
        return first
    if first not in _PROVIDERS:
        raise ValueError(
            f"provider_model {provider_model!r} starts with {first[:40]!r}, neither a "
            "Bedrock model provider nor a cross-Region inference profile geography the "
            "gateway knows, so where Bedrock processes it cannot be judged"
        )
    return None


def check_bedrock_regions(
    region: str, provider_models: Iterable[str], base_url: str | None
) -> None:
    """Raise ValueError when the AWS Region a Bedrock backend's config names (its
    `base_url` host's, else an ARN's; a SageMaker model's ARN's whatever its `base_url`,
    which LiteLLM does not read) is not the declared `region` (nor in its area)."""
    host = _aws_host(base_url) if base_url is not None else None
    for named in (p for p in (host or "").split(".") if AWS_REGION.fullmatch(p)):
        if not _within(named, region):
            raise ValueError(
                f"base_url host {host!r} is in AWS Region {named!r}, but the backend "
                f"declares region {region!r}, which policies judge"
            )
    for model in provider_models:
        if not model.startswith(AWS_PREFIXES):
            continue
        if base_url is not None and not model.startswith(REGION_ONLY_PREFIXES):
            continue  # sent to the base_url (a host not AWS's: taken as declared)
        for named in _arn_regions(model):
            if not _within(named, region):
                raise ValueError(
                    f"provider_model {model!r} is an ARN in AWS Region {named!r}, where "
                    f"LiteLLM sends it, but the backend declares region {region!r}, which "
                    "policies judge"
                )


def host_region(base_url: str) -> str | None:
    """The AWS Region an AWS host name in `base_url` names (`bedrock-runtime.eu-west-1.
    amazonaws.com`: `eu-west-1`; `check_bedrock_regions` checked every one it names is
    within the declared region), or None."""
    host = _aws_host(base_url)
    named = [p for p in host.split(".") if AWS_REGION.fullmatch(p)] if host else []
    return named[0] if named else None


def _aws_host(base_url: str) -> str | None:
    """`base_url`'s host name, lowercase, when it is in one of AWS's domains; else None."""
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    return host if any(host == d or host.endswith(f".{d}") for d in _AWS_DOMAINS) else None


def _arn_regions(model: str) -> list[str]:
    """The Region LiteLLM reads from a Bedrock model string that holds an ARN, as written
    and percent-decoded: its 4th `:`-separated part wherever the ARN stands in it
    (`bedrock/x:y:z:us-east-1:arn:aws:bedrock` is sent to us-east-1 too)."""
    found = []
    for spelling in dict.fromkeys((model, unquote(model))):
        parts = spelling.split(":")
        arn = _LITELLM_ARN.search(spelling) is not None and len(parts) > 3
        if arn and _LITELLM_REGION.fullmatch(parts[3]):
            found.append(parts[3])
    return found


def arn_region(model: str) -> str | None:
    """The Region LiteLLM itself reads from a Bedrock model string holding an ARN (as
    written), or None."""
    parts = model.split(":")
    if _LITELLM_ARN.search(model) is None or len(parts) < 4:
        return None
    return parts[3] if _LITELLM_REGION.fullmatch(parts[3]) else None


def _within(aws_region: str, declared: str) -> bool:
    """Whether `aws_region` is the declared region, or in the area a declared code names."""
    if aws_region == declared.lower():
        return True
    return is_jurisdiction(declared) and region_matches(aws_region, expand(declared)) is not None
