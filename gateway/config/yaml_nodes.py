"""gateway.yaml's composed YAML nodes as plain data (`to_python`): the line of each value
recorded by its YAML path, `${VAR}` filled in, and what the file may not hold (explicit
tags, keys that are not plain names, duplicate keys, numbers not in plain decimal digits,
escaped ASCII) listed as `ConfigIssue`s; at most `MAX_VALUES` values, an alias counted at
every use (`TooLarge`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gateway.config.env_refs import interpolate, names_a_variable
from gateway.config.issues import ConfigIssue, Path_, render_path
from gateway.plain_yaml import (
    NUMBER_PROBLEM,
    escaped_ascii,
    explicit_tag,
    plain_scalar,
    tag_problem,
    unplain_number,
)

__all__ = ["MAX_VALUES", "TooLarge", "to_python"]

# A config has hundreds of values; a few nested YAML aliases expand to billions (the
# admin API validates a candidate config sent by a client: gateway/admin/app.py).
MAX_VALUES = 100_000
_TAG = tag_problem("gateway.yaml")


class TooLarge(Exception):
    """The config expands to more than `MAX_VALUES` values."""


def to_python(
    node: yaml.Node,
    path: Path_,
    lines: dict[Path_, int],
    issues: list[ConfigIssue],
    env: Mapping[str, str],
    interpolated: set[Path_],
) -> Any:
    lines[path] = node.start_mark.line + 1
    if len(lines) > MAX_VALUES:  # each value has its own path: aliases count every use
        raise TooLarge
    if explicit_tag(node):  # `!!str 0`, `!!set`, `!custom 3` (which PyYAML fails on)
        issues.append(ConfigIssue(render_path(path), lines[path], _TAG, path))
        return None
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or explicit_tag(key_node):  # `!x a:`
                issues.append(
                    ConfigIssue(render_path(path), line, "keys must be plain names", path)
                )
                continue
            key = key_node.value
            if (escaped := escaped_ascii(key_node)) is not None:  # `"regi\x6fn":` is `region:`
                issues.append(ConfigIssue(render_path((*path, key)), line, escaped, (*path, key)))
            if key in result:
                issues.append(ConfigIssue(render_path((*path, key)), line, "duplicate key", path))
            result[key] = to_python(value_node, (*path, key), lines, issues, env, interpolated)
            lines[(*path, key)] = key_node.start_mark.line + 1  # a key's line, not its value's
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            to_python(item, (*path, i), lines, issues, env, interpolated)
            for i, item in enumerate(node.value)
        ]
    assert isinstance(node, yaml.ScalarNode)
    if unplain_number(node):  # `010` (8 in YAML 1.1), `0x1e`, `1_000`, `1:30`
        issues.append(ConfigIssue(render_path(path), lines[path], NUMBER_PROBLEM, path))
        return None
    if (escaped := escaped_ascii(node)) is not None:  # `region: "\x75s"` is `us`
        issues.append(ConfigIssue(render_path(path), lines[path], escaped, path))
    value = plain_scalar(node)
    if isinstance(value, str) and names_a_variable(value):
        value = interpolate(value, path, lines[path], issues, env)
        interpolated.add(path)
    return value
