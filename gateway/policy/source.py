"""Policy files as YAML documents that remember where each value sits (line and column).

Follows `gateway.config.loader`: compose the YAML, convert it while recording the mark
of every key and item, validate with pydantic, then turn each validation error into a
`PolicyIssue` at the deepest part of its path that exists in the file. Unlike
gateway.yaml, policy files take no `${ENV}` interpolation: a policy means what it says.

For the same reason a policy file is read as plain data only: no aliases, no numeric
escape of a printable ASCII character in a quoted string (`"\\x2a"` for `*`), no explicit
tags (`!!str 0`, `!!python/...`, `!!set`, a custom `!tag`), and whole numbers only in
plain decimal digits (YAML 1.1, which PyYAML reads, takes `010` for 8, `0x1e` for 30,
`1_000` for 1000 and `1:30` for 90, where YAML 1.2 tools and reviewers read them
otherwise). A date or time (`version: 2025-06-01`) is kept as the text written. The
node checks are `gateway.plain_yaml`'s, which gateway.yaml's loader applies too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gateway.plain_yaml import (
    NUMBER_PROBLEM,
    escaped_ascii,
    explicit_tag,
    hidden_text,
    plain_scalar,
    tag_problem,
    unplain_number,
)
from gateway.policy.types import PolicyIssue

__all__ = [
    "Document",
    "YamlPath",
    "discover",
    "is_yaml_name",
    "read_documents",
    "render_path",
    "validate",
]

YamlPath = tuple[str | int, ...]
_ALIAS = "YAML aliases are not allowed in policy files; write the value out"
_TOO_DEEP = "not valid YAML: it nests too deep"
_KEY = "a key is a plain name, not a list or mapping (`? [a, b]`)"
_TAG = tag_problem("policy files")
_NUMBER = NUMBER_PROBLEM
# A document with one of these problems holds a value that is not what the file says:
# it is not validated further (its other errors would be about a stand-in value).
_UNREADABLE = frozenset({_ALIAS, _TAG, _NUMBER, _KEY})
Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Document:
    """One YAML document of a file, converted to plain data, with the marks of its paths."""

    file: str
    data: Any
    marks: Mapping[YamlPath, tuple[int, int]]

    def issue(self, path: YamlPath, message: str) -> PolicyIssue:
        """An issue at `path`, placed at the deepest part of it that the file has."""
        probe = path
        while probe and probe not in self.marks:
            probe = probe[:-1]
        line, column = self.marks.get(probe, (None, None))
        return PolicyIssue(self.file, line, column, render_path(path), message)


def discover(
    paths: Iterable[Path], *, skip_tests: bool = True
) -> tuple[list[Path], list[PolicyIssue]]:
    """Files named directly, plus `*.yaml`/`*.yml` (any case) under directories (minus `tests/`
    folders, which hold test cases, unless `skip_tests` is false, and hidden entries:
    a Kubernetes ConfigMap volume keeps a second copy of every file in `..<timestamp>/`)."""
    found: list[Path] = []
    issues: list[PolicyIssue] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            named, unlisted = _walk(path, skip_tests)
            issues += unlisted
            files = [p for p in named if p.is_file()]
            # A policy file that cannot be read (a dangling link, a FIFO) is an error, not a
            # file that was never there: skipping it could drop a deny or the PolicySet.
            issues += [
                PolicyIssue(str(p), None, None, "", "not a regular file (a dangling link?)")
                for p in named
                if not p.is_file()
            ]
            if not named:
                issues.append(PolicyIssue(str(path), None, None, "", "no *.yaml files"))
            found += files
        else:
            issues.append(PolicyIssue(str(path), None, None, "", "no such file or directory"))
    return list(dict.fromkeys(found)), issues


def _walk(root: Path, skip_tests: bool) -> tuple[list[Path], list[PolicyIssue]]:
    """The YAML-named entries under `root` that are not directories (hidden entries and,
    with `skip_tests`, `tests/` folders left out), and a problem for each directory that
    could not be listed. `Path.rglob` skipped a directory it was not permitted to list,
    silently: its policy files (a tenant's policy, the PolicySet naming the data-class
    header) were missing from the set compiled, as if never there."""
    named: list[Path] = []
    issues: list[PolicyIssue] = []

    def unlisted(exc: OSError) -> None:
        where = exc.filename if exc.filename is not None else root
        why = f"cannot read: {exc.strerror or exc}"
        issues.append(PolicyIssue(str(where), None, None, "", why, unreadable=True))

    for directory, subdirectories, files in os.walk(root, onerror=unlisted):
        subdirectories[:] = [
            d for d in subdirectories if not d.startswith(".") and not (skip_tests and d == "tests")
        ]
        here = Path(directory)
        # A link to a directory is not walked (a loop could be one): an error, not its
        # policies left out as if never there. List the directory itself instead.
        issues += [
            PolicyIssue(str(here / d), None, None, "", "a link to a directory: not read")
            for d in subdirectories
            if (here / d).is_symlink()
        ]
        named += [here / f for f in files if not f.startswith(".") and is_yaml_name(Path(f))]
    return sorted(named), issues


def is_yaml_name(path: Path) -> bool:
    """Whether a file in a policy directory is read: `.yaml` or `.yml` in any letter case
    (`EU.YAML` too: a file a case-insensitive filesystem or a reviewer takes for YAML is
    never skipped on Linux alone)."""
    return path.suffix.lower() in (".yaml", ".yml")


def read_documents(file: str, text: str) -> tuple[list[Document], list[PolicyIssue]]:
    """Every document of a (possibly multi-document) YAML text."""
    hidden = hidden_text(text)
    if hidden is not None:  # the file does not read as it loads: nothing of it is used
        at_line, at_column, why = hidden
        return [], [PolicyIssue(file, at_line, at_column, "", why)]
    try:
        roots = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except RecursionError:  # PyYAML composes recursively: a client's cases could nest deep
        return [], [PolicyIssue(file, None, None, "", _TOO_DEEP)]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [PolicyIssue(file, line, column, "", f"not valid YAML: {problem}")]
    documents: list[Document] = []
    issues: list[PolicyIssue] = []
    for root in roots:
        if root is None:
            continue
        marks: dict[YamlPath, tuple[int, int]] = {}
        found: list[PolicyIssue] = []
        try:
            data = _to_python(root, (), marks, found, file, set())
        except RecursionError:
            return [], [PolicyIssue(file, None, None, "", _TOO_DEEP)]
        issues += found
        if not any(issue.message in _UNREADABLE for issue in found):  # else nothing to validate
            documents.append(Document(file, data, marks))
    if not documents and not issues:
        issues.append(PolicyIssue(file, None, None, "", "the file is empty"))
    return documents, issues


def validate(document: Document, model: type[Model]) -> tuple[Model | None, list[PolicyIssue]]:
    try:
        return model.model_validate(document.data), []
    except ValidationError as exc:
        return None, _issues(document, exc)


def render_path(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _to_python(
    node: yaml.Node,
    path: YamlPath,
    marks: dict[YamlPath, tuple[int, int]],
    issues: list[PolicyIssue],
    file: str,
    seen: set[int],
) -> Any:
    marks.setdefault(path, _mark(node))
    if id(node) in seen:  # an alias: refused, so a policy reads as written (and cannot blow up)
        line, column = marks[path]
        issues.append(PolicyIssue(file, line, column, render_path(path), _ALIAS))
        return None
    seen.add(id(node))
    if explicit_tag(node):
        line, column = marks[path]
        issues.append(PolicyIssue(file, line, column, render_path(path), _TAG))
        return None
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            unread = _key_problem(key_node, seen)
            if unread is not None:  # not read, never shown: see `_key_problem`
                # (an alias is the node it names, marked where that is: its value is here)
                line, column = _mark(value_node if unread == _ALIAS else key_node)
                issues.append(PolicyIssue(file, line, column, render_path(path), unread))
                continue
            key = str(key_node.value)  # the key as written: `no:` stays "no"
            escaped = escaped_ascii(key_node)  # `"provid\x65rs":` is `providers:`
            if escaped is not None:
                line, column = _mark(key_node)
                issues.append(PolicyIssue(file, line, column, render_path((*path, key)), escaped))
            if key in result:
                line, column = _mark(key_node)
                issues.append(
                    PolicyIssue(file, line, column, render_path((*path, key)), "duplicate key")
                )
            marks[(*path, key)] = _mark(key_node)
            result[key] = _to_python(value_node, (*path, key), marks, issues, file, seen)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(item, (*path, i), marks, issues, file, seen)
            for i, item in enumerate(node.value)
        ]
    assert isinstance(node, yaml.ScalarNode)
    if unplain_number(node):
        line, column = marks[path]
        issues.append(PolicyIssue(file, line, column, render_path(path), _NUMBER))
        return None
    escaped = escaped_ascii(node)  # `allow: ["\x2a"]` is `allow: ["*"]`
    if escaped is not None:
        line, column = marks[path]
        issues.append(PolicyIssue(file, line, column, render_path(path), escaped))
    return plain_scalar(node)


def _key_problem(node: yaml.Node, seen: set[int]) -> str | None:
    """Why a mapping key is not read: an alias (`*name:`), an explicit tag, or a list or
    mapping (`? [a, b]`). Such a key was read as `str` of its node, whose repr spells out
    every node under it, through every alias: a key naming an alias of ten aliases of ten
    ... was a file of some 300 bytes that took gigabytes and hours to read."""
    if id(node) in seen:
        return _ALIAS
    seen.add(id(node))
    if not isinstance(node, yaml.ScalarNode):
        return _KEY
    return _TAG if explicit_tag(node) else None


def _issues(document: Document, exc: ValidationError) -> list[PolicyIssue]:
    issues = []
    errors = exc.errors(include_url=False)
    nested = {tuple(e["loc"][:n]) for e in errors for n in range(len(e["loc"]))}
    for error in errors:
        loc: YamlPath = tuple(error["loc"])
        if error["type"] == "too_short" and loc in nested:
            continue  # a list whose items failed also looks "too short"; the item errors say why
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (not part of the schema)"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "string_type" and isinstance(error.get("input"), bool):
            message = (
                "expected a string; YAML reads unquoted yes/no/on/off as true/false, "
                "so quote it (e.g. 'no' for Norway)"
            )
        issues.append(document.issue(loc, message))
    return issues
