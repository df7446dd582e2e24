"""docs/provenance.md's record field lists ("Records (schema v1)") are the closed schema
the record builders write and `parse_record` accepts: no field missing, none extra."""

from __future__ import annotations

import re

import pytest

from gateway.provenance.formats.schema import RECORD_SCHEMAS
from tests.helpers.paths import REPO_ROOT

COMMON = {"v", "type", "request_id", "time"}


def section() -> str:
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    return text.split("## Records (schema v1)", 1)[1].split("\n### What the client saw", 1)[0]


def table_after(heading: str) -> set[str]:
    """The top-level field names in the first table after `heading` (a nested field such
    as `backend.peer` is its parent's)."""
    rest = section().split(heading, 1)[1]
    table = re.search(r"\| field \| type \| meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", rest)
    assert table, f"no field table after {heading!r}"
    names = re.findall(r"^\| `([a-z_.]+)` \|", table.group(1), re.MULTILINE)
    return {name.split(".")[0] for name in names}


def test_the_common_fields_are_listed() -> None:
    assert table_after("Common fields:") == COMMON


@pytest.mark.parametrize(
    ("kind", "heading"),
    [("dispatch", "**dispatch**"), ("completion", "**completion**"), ("admin", "**admin**")],
)
def test_a_record_types_table_lists_its_fields(kind: str, heading: str) -> None:
    assert table_after(heading) | COMMON == set(RECORD_SCHEMAS[kind])


def test_the_refusal_paragraph_names_its_fields() -> None:
    paragraph = section().split("**refusal**", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert named | COMMON == set(RECORD_SCHEMAS["refusal"])


def test_every_record_type_is_named() -> None:
    common = section().split("Common fields:", 1)[1].split("\n\n", 2)[1]
    row = next(line for line in common.splitlines() if line.startswith("| `type` |"))
    assert set(re.findall(r'`"([a-z]+)"`', row)) == set(RECORD_SCHEMAS)
    for field in RECORD_SCHEMAS["attestation"]:
        assert field in COMMON or f"`{field}`" in row, field
