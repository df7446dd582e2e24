"""docs/configuration.md names every setting gateway.yaml takes (the models under
gateway/config/), each in code: `name`, `section.name`, or `name:` in a YAML example (a
line or a flow mapping); the `state.*` tuning is in docs/state.md, which it links to.
The defaults its tables state are the code's."""

from __future__ import annotations

import re
import typing

from pydantic import BaseModel

from gateway.config.schema import GatewaySettings
from tests.helpers.paths import REPO_ROOT


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting's dotted path (`backends[].tls.ca_file`)."""
    found: list[str] = []
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        found.append(path)
        many = typing.get_origin(field.annotation) in (list, tuple) or "tuple[" in str(
            field.annotation
        )
        for inner in _models(field.annotation):
            found += settings(inner, path + ("[]." if many else "."))
    return found


def _named(text: str, path: str) -> bool:
    key = re.split(r"[.\[\]]+", path.rstrip("]"))[-1]
    in_code = re.search(rf"`[^`\n]*\b{re.escape(key)}\b[^`\n]*`", text)
    # a YAML example's `name:` line, or a member of a flow mapping (`{name: ...}`)
    in_yaml = re.search(rf"(?:^\s*(?:- )?|[{{,] *){re.escape(key)}:", text, re.MULTILINE)
    return bool(in_code or in_yaml)


def test_every_setting_is_named_in_the_docs() -> None:
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    state = (REPO_ROOT / "docs" / "state.md").read_text()
    missing = [
        path
        for path in settings(GatewaySettings)
        if not _named(state if path.startswith("state.") else text, path)
    ]
    assert not missing, f"docs/configuration.md names no {missing}"


def test_the_walk_reaches_nested_settings() -> None:
    paths = settings(GatewaySettings)
    assert "backends[].tls.pin_spki_sha256" in paths
    assert "provenance.witnesses[].timeout_s" in paths
    assert not _named("`other_setting`", "provenance.witness_retry_max_s")


_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _documented(cell: str) -> object | None:
    """A default cell as a value: `8 MiB`, `120`, `` `json` ``, `` `true` ``; None when
    the cell says something else (derived, none, a sentence)."""
    first = cell.split(",")[0].split(" (")[0].strip()
    if m := re.fullmatch(r"([\d.]+) ([KMG]iB)", first):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    if re.fullmatch(r"`?\d+(\.\d+)?`?", first):
        return float(first.strip("`"))
    if m := re.fullmatch(r"`([a-z0-9.]+)`", first):
        return {"true": True, "false": False}.get(m.group(1), m.group(1))
    return None


def _defaults(model: type[BaseModel], prefix: str = "") -> dict[str, bool | int | float | str]:
    found: dict[str, bool | int | float | str] = {}
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        if isinstance(field.default, (bool, int, float, str)):
            found[path] = field.default
        for inner in _models(field.annotation):
            if "tuple[" not in str(field.annotation):
                found |= _defaults(inner, path + ".")
    return found


def test_the_defaults_the_tables_state_are_the_code_defaults() -> None:
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    rows: dict[str, str] = {}
    section = ""
    for line in text.splitlines():
        if head := re.match(r"\| `([a-z_]+)\.\*` \| default \|", line):
            section = head.group(1) + "."  # a table of one section's keys
        elif not line.startswith("|"):
            section = ""
        elif cells := re.match(r"\| ((?:`[^`]+`(?:, )?)+) \| ([^|]+) \|", line):
            names = re.findall(r"`([^`]+)`", cells.group(1))
            if len(names) == 1:
                rows.setdefault(section + names[0], cells.group(2).strip())
    defaults = _defaults(GatewaySettings)
    checked, wrong = 0, []
    for path, cell in rows.items():
        stated = _documented(cell)
        if path not in defaults or stated is None:
            continue
        checked += 1
        code = defaults[path]
        same = stated == code if isinstance(stated, (str, bool)) else float(code) == stated
        if not same:
            wrong.append(f"{path}: docs {cell!r}, code {code!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 30, checked
