"""The AWS Region or Google Cloud location a hosted call goes to, pinned to the declared `region`.

A policy judges a hosted backend by its declared `region`. Where the config names no
endpoint, LiteLLM 1.108.7 picks the Region itself, from the process environment:

- an AWS route (`bedrock/`, `bedrock_mantle/`, `sagemaker*/`) without `base_url` takes
  `aws_region_name` if the call names one, else a Bedrock ARN's Region, else
  `AWS_REGION_NAME`, `AWS_REGION`, boto3's Region (`AWS_DEFAULT_REGION`, the profile's
  config file), else `us-west-2` (`BaseAWSLLM._get_aws_region_name`). A backend declared
  `region: eu-central-1` with `AWS_REGION_NAME=us-east-1` set sent its prompts to
  `bedrock-runtime.us-east-1.amazonaws.com`;
- a Vertex AI route (`vertex_ai/`) takes `vertex_location` if the call names one, else
  `VERTEXAI_LOCATION` (`VERTEX_LOCATION` for some calls), else `us-central1`, and builds
  the URL from it, also under a `base_url` whose path names no location (LiteLLM grafts
  `/v1/projects/<p>/locations/<location>/...` onto it). A backend declared
  `region: europe-west4` without either sent its prompts to Iowa.

`pinned_regions` names the Region on every such call (`aws_region_name`,
`vertex_location`), so the environment cannot move it: the declared `region` when it is
one (`eu-central-1`, `europe-west4`); the one the config itself names (a Bedrock ARN's
Region, which gateway/config/bedrock_profiles.py checked is within the declared one; a
Vertex `base_url`'s location, checked by gateway/config/vertex_regions.py); else, for a
declared area (`region: eu`), the one the environment names (LiteLLM's own order; its
default where none is set) when it is within that area. A backend whose Region cannot be
pinned so (the environment names one outside the declared area, or none and LiteLLM's
default is outside it) is refused at start, naming both. A Bedrock backend with a
`base_url` goes to that URL's host (checked at config load), and is pinned all the same:
LiteLLM signs a call (SigV4) for the call's Region, not the URL's, so one declared
`region: eu-west-1` signed for `us-west-2` (or the environment's Region), which a real
regional endpoint refuses. Its pin is the Region an AWS host in its `base_url` names
(`bedrock-runtime.eu-west-1.amazonaws.com`, checked within the declared one), else as
above. A SageMaker one is pinned as above: LiteLLM builds its URL from the Region alone
(`runtime.sagemaker.<region>.amazonaws.com`), never reading `api_base`, so with a
`base_url` it went to the Region the environment named.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from gateway.config.bedrock_profiles import (
    AWS_PREFIXES,
    AWS_REGION,
    REGION_ONLY_PREFIXES,
    arn_region,
    host_region,
)
from gateway.config.vertex_regions import VERTEX_PREFIXES, named_locations
from gateway.policy.jurisdictions import expand, is_jurisdiction, region_matches

__all__ = ["pinned_regions"]

# Where LiteLLM (and boto3 under it) reads the Region, in its order.
_AWS_VARIABLES: Final = ("AWS_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION")
_AWS_DEFAULT: Final = "us-west-2"
_VERTEX_VARIABLES: Final = ("VERTEXAI_LOCATION", "VERTEX_LOCATION")
_VERTEX_DEFAULT: Final = "us-central1"
# A regional Google Cloud location (`europe-west4`, `us-central1`, `me-central2`).
_GCP_LOCATION: Final = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}")  # ASCII digits: `\d` is any digit


def pinned_regions(
    backend_id: str,
    region: str,
    provider_models: Iterable[str],
    environ: Mapping[str, str],
    *,
    base_url: str | None,
) -> dict[str, dict[str, str]]:
    """provider_model -> the LiteLLM arguments that pin its Region (none for a model
    whose destination the config names whole). Raise ValueError naming both when the
    Region it would go to cannot be made one within the declared `region`."""
    pins: dict[str, dict[str, str]] = {}
    for model in provider_models:
        if model.startswith(AWS_PREFIXES):
            named = _aws_named(model, region, base_url)
            pins[model] = {"aws_region_name": named or _aws_region(backend_id, region, environ)}
        elif model.startswith(VERTEX_PREFIXES):
            location = _vertex_location(backend_id, region, base_url, environ)
            listed = _vertex_listed_locations(model)
            if listed and location not in listed:
                raise ValueError(
                    f"backend {backend_id!r}: LiteLLM sends provider_model {model!r} only to "
                    f"the locations its model list names ({', '.join(listed)}), not to "
                    f"{location!r} (for the declared region {region!r} that policies judge): "
                    "declare one of those, or use another model"
                )
            pins[model] = {"vertex_location": location}
    return pins


def _aws_named(model: str, region: str, base_url: str | None) -> str | None:
    """The Region the config names for `model`'s calls, within the declared `region`, or
    None. Without a `base_url`, a Bedrock ARN's, which LiteLLM takes over all else (checked
    within it at config load, gateway/config/bedrock_profiles.py). With one, where a
    Bedrock call goes: its AWS host's Region (checked likewise), else an ARN's when it is
    within (with a `base_url` the config check reads a Bedrock model's host alone). A
    SageMaker call goes to the Region whatever its `base_url` says: an ARN's (checked
    within the declared one whatever the `base_url`), else the declared one."""
    named = arn_region(model)
    if base_url is None or model.startswith(REGION_ONLY_PREFIXES):
        return named
    host = host_region(base_url)
    if host is not None:
        return host
    return named if named is not None and _within(named, region) else None


def _aws_region(backend_id: str, region: str, environ: Mapping[str, str]) -> str:
    if AWS_REGION.fullmatch(region.lower()):
        return region.lower()
    variable, found = _first_set(environ, _AWS_VARIABLES)
    where = f"{variable} names {found[:40]!r}"
    if variable is None:
        found = _AWS_DEFAULT
        where = f"no AWS Region is set, and LiteLLM's default is {found!r}"
    if AWS_REGION.fullmatch(found) and _within(found, region):
        return found
    raise ValueError(
        f"backend {backend_id!r}: its config names no AWS Region for its calls and {where}, "
        f"which is not in the declared region {region!r} that policies judge: declare the "
        "AWS Region as region (region: eu-central-1), or set AWS_REGION_NAME to one in it"
    )


def _vertex_location(
    backend_id: str, region: str, base_url: str | None, environ: Mapping[str, str]
) -> str:
    named = named_locations(base_url) if base_url is not None else []
    if named:
        return named[0]  # within the declared region (gateway/config/vertex_regions.py)
    if _GCP_LOCATION.fullmatch(region.lower()):
        return region.lower()
    variable, found = _first_set(environ, _VERTEX_VARIABLES)
    where = f"{variable} names {found[:40]!r}"
    if variable is None:
        found = _VERTEX_DEFAULT
        where = f"no location is set, and LiteLLM's default is {found!r}"
    if found != "global" and _within(found, region):
        return found
    raise ValueError(
        f"backend {backend_id!r}: a Vertex AI backend whose config names no location, and "
        f"{where}, which is not in the declared region {region!r} that policies judge: "
        "declare the location as region (region: europe-west4), or set VERTEXAI_LOCATION "
        "to one in it"
    )


def _vertex_listed_locations(model: str) -> tuple[str, ...]:
    """The `supported_regions` LiteLLM's bundled model list gives a Vertex AI model (its
    `VertexBase.get_vertex_region` sends the call to the first of them, `global` for some,
    whatever `vertex_location` says, when that is not one of them); () when none."""
    entry = _litellm_model_list().get(f"vertex_ai/{model.partition('/')[2]}")
    listed = entry.get("supported_regions") if isinstance(entry, dict) else None
    return tuple(str(r) for r in listed) if isinstance(listed, list) else ()


@functools.cache
def _litellm_model_list() -> dict[str, object]:
    """LiteLLM's bundled model list, the one it uses offline (`LITELLM_LOCAL_MODEL_COST_MAP`,
    gateway/upstream/litellm_runtime.py), read without importing LiteLLM; {} without it."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    for folder in spec.submodule_search_locations:
        path = Path(folder, "model_prices_and_context_window_backup.json")
        if path.is_file():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            return loaded if isinstance(loaded, dict) else {}
    return {}


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str | None, str]:
    """The first of `names` set (not empty) in `environ`, and its value."""
    for name in names:
        value = environ.get(name, "")
        if value:
            return name, value.strip().lower()
    return None, ""


def _within(named: str, declared: str) -> bool:
    """Whether `named` is the declared region, or in the area a declared code names."""
    if named == declared.lower():
        return True
    return is_jurisdiction(declared) and region_matches(named, expand(declared)) is not None
