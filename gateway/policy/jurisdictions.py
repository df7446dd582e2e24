"""Jurisdiction codes (`eu`, `de`, `us`, ...) and the cloud regions that lie in them.

A residency entry that is a code below stands for the code itself (an operator may
declare `region: de`) plus every AWS, Google Cloud and Azure region physically in that
country. Any other entry is a region name or glob matched against the region the
operator declared for a backend. Matching ignores case.

The table lists regions by name on purpose instead of prefixes such as `eu-*` or
`europe-*`: those prefixes cover London (`eu-west-2`, `europe-west2`) and Zurich
(`eu-central-2`, `europe-west6`), which are not in the EU; and short prefixes collide
with country codes (AWS `sa-east-1` is in Brazil, not Saudi Arabia; `af-south-1` is in
South Africa). Regions a cloud adds later match only once they are added here or named
in a policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from types import MappingProxyType

__all__ = ["COUNTRIES", "GROUPS", "expand", "is_jurisdiction", "overlap", "region_matches"]

# ISO 3166-1 alpha-2 code (`uk` for the United Kingdom, as clouds write it; `gb` too) → regions,
# AWS first, then Google Cloud, then Azure.
# fmt: off
_COUNTRIES: dict[str, tuple[str, ...]] = {
    # EU member states with cloud regions.
    "at": ("austriaeast",),
    "be": ("europe-west1", "belgiumcentral"),
    "de": ("eu-central-1", "europe-west3", "europe-west10", "germanywestcentral",
           "germanynorth"),
    "es": ("eu-south-2", "europe-southwest1", "spaincentral"),
    "fi": ("europe-north1",),
    "fr": ("eu-west-3", "europe-west9", "francecentral", "francesouth"),
    "ie": ("eu-west-1", "northeurope"),
    "it": ("eu-south-1", "europe-west8", "europe-west12", "italynorth"),
    "nl": ("europe-west4", "westeurope"),
    "pl": ("europe-central2", "polandcentral"),
    "se": ("eu-north-1", "europe-north2", "swedencentral", "swedensouth"),
    # EU member states without a region at these clouds (yet): the code itself only.
    "bg": (), "cy": (), "cz": (), "dk": (), "ee": (), "gr": (), "hr": (), "hu": (), "lt": (),
    "lu": (), "lv": (), "mt": (), "pt": (), "ro": (), "si": (), "sk": (), "is": (), "li": (),
    # In the EEA but not the EU; in Europe but in neither.
    "no": ("norwayeast", "norwaywest"),
    "ch": ("eu-central-2", "europe-west6", "switzerlandnorth", "switzerlandwest"),
    "uk": ("eu-west-2", "europe-west2", "uksouth", "ukwest"),
    # The Americas.
    "us": ("us-east-1", "us-east-2", "us-west-1", "us-west-2", "us-gov-east-1",
           "us-gov-west-1",
           "us-central1", "us-east1", "us-east4", "us-east5", "us-south1", "us-west1",
           "us-west2", "us-west3", "us-west4",
           "eastus", "eastus2", "centralus", "northcentralus", "southcentralus",
           "westcentralus", "westus", "westus2", "westus3"),
    "ca": ("ca-central-1", "ca-west-1", "northamerica-northeast1", "northamerica-northeast2",
           "canadacentral", "canadaeast"),
    "br": ("sa-east-1", "southamerica-east1", "brazilsouth"),
    "mx": ("mx-central-1", "northamerica-south1", "mexicocentral"),
    # Asia-Pacific, the Middle East, Africa.
    "jp": ("ap-northeast-1", "ap-northeast-3", "asia-northeast1", "asia-northeast2",
           "japaneast", "japanwest"),
    "kr": ("ap-northeast-2", "asia-northeast3", "koreacentral", "koreasouth"),
    "in": ("ap-south-1", "ap-south-2", "asia-south1", "asia-south2", "centralindia",
           "southindia", "westindia"),
    "sg": ("ap-southeast-1", "asia-southeast1", "southeastasia"),
    "au": ("ap-southeast-2", "ap-southeast-4", "australia-southeast1", "australia-southeast2",
           "australiaeast", "australiasoutheast", "australiacentral", "australiacentral2"),
    "hk": ("ap-east-1", "asia-east2", "eastasia"),
    "tw": ("asia-east1",),
    "id": ("ap-southeast-3", "asia-southeast2", "indonesiacentral"),
    "il": ("il-central-1", "me-west1", "israelcentral"),
    "ae": ("me-central-1", "uaenorth", "uaecentral"),
    "za": ("af-south-1", "africa-south1", "southafricanorth", "southafricawest"),
}

_EU_MEMBERS = ("at", "be", "bg", "cy", "cz", "de", "dk", "ee", "es", "fi", "fr", "gr", "hr",
               "hu", "ie", "it", "lt", "lu", "lv", "mt", "nl", "pl", "pt", "ro", "se", "si", "sk")
# fmt: on

# Read-only views: the tables are constants, shared by every compiled policy set.
COUNTRIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    # ISO writes GB; clouds and people write UK: each code covers the other.
    {**_COUNTRIES, "gb": ("uk", *_COUNTRIES["uk"]), "uk": ("gb", *_COUNTRIES["uk"])}
)

# Groups of countries: each stands for its own code plus every member's expansion. The
# EEA is the EU plus three: a backend declared `region: eu` is in it too (`deny: [eea]`
# must hold for it).
GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"eu": _EU_MEMBERS, "eea": ("eu", *_EU_MEMBERS, "is", "li", "no")}
)


def is_jurisdiction(code: str) -> bool:
    """Whether a residency entry is a built-in code rather than a region name."""
    code = code.lower()
    return code in COUNTRIES or code in GROUPS


def expand(entry: str) -> tuple[str, ...]:
    """The region names or globs (lower case) a residency entry stands for."""
    entry = entry.lower()
    if entry in GROUPS:
        patterns: list[str] = [entry]
        for member in GROUPS[entry]:
            patterns += [member, *COUNTRIES.get(member, ())]
        return tuple(dict.fromkeys(patterns))
    if entry in COUNTRIES:
        return (entry, *COUNTRIES[entry])
    return (entry,)


def region_matches(region: str, patterns: tuple[str, ...]) -> str | None:
    """The first pattern (from `expand`) that covers `region`, or None."""
    region = region.lower()
    for pattern in patterns:
        if region == pattern or fnmatchcase(region, pattern):
            return pattern
    return None


def overlap(region: str, patterns: tuple[str, ...]) -> str | None:
    """The first place a backend declared in `region` may be that `patterns` (from
    `expand`) cover, or None. A region name is one place; a code is anywhere in it
    (`region: eu` may be Germany, `region: de` may be `eu-central-1`), so a deny holds
    for it when it covers any part: the declaration does not show the backend is outside.
    An allow instead must cover the region itself (`region_matches`)."""
    for place in expand(region):
        if region_matches(place, patterns) is not None:
            return place
    return None
