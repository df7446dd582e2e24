"""Load `gateway.yaml`: YAML with line marks, `${ENV}` interpolation, schema validation.

The file is read as the plain data it shows, as the policy files are
(`gateway.plain_yaml`): no explicit YAML tags, whole numbers only in plain decimal digits
(no `010`, `0x1e`, `1_000`, `1:30`), dates kept as text, no `"\\x75s"` for `us` in a value
or key; and a value must already be of its setting's type (`days: '30'` is refused, not
read as 30: `gateway.config.as_written`). Aliases stay allowed (bounded by `_MAX_VALUES`).

Every problem is reported as a `ConfigIssue` carrying the YAML path (`backends[0].kind`)
and the line it sits on, all at once, so `owngate config validate` shows the whole list.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.as_written import coerced
from gateway.config.schema import GatewaySettings
from gateway.plain_yaml import (
    NUMBER_PROBLEM,
    escaped_ascii,
    explicit_tag,
    hidden_text,
    plain_scalar,
    tag_problem,
    unplain_number,
)
from gateway.small_files import read_small_file

__all__ = [
    "MAX_CONFIG_BYTES",
    "ConfigError",
    "ConfigIssue",
    "load_config",
    "load_config_file",
    "load_config_text",
    "parse_config",
    "referenced_variables",
    "unquoted",
]

# Searched only up to the last `}`: a `${X:-` with no `}` after it scanned to the end of
# the text from each of its starts (quadratic: a 256 KiB candidate config of `${a:-`,
# validated for an operator through the admin API, held the interpreter for hours). Up
# to the last `}` each `${X:-` matches, so every character is read once.
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

Path_ = tuple[str | int, ...]
# A config has hundreds of values; a few nested YAML aliases expand to billions (the
# admin API validates a candidate config sent by a client: gateway/admin/app.py).
_MAX_VALUES = 100_000
# gateway.yaml is read whole and parsed on the event loop at a reload: a path replaced by
# a FIFO must not block it for ever, nor `/dev/zero` or a huge file exhaust memory or hold
# the loop for minutes (room for the 100,000 values above, each a key hash).
MAX_CONFIG_BYTES = 16 * 1024 * 1024
_TAG = tag_problem("gateway.yaml")


class _TooLarge(Exception):
    """The config expands to more than `_MAX_VALUES` values."""


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    line: int | None
    message: str
    loc: tuple[str | int, ...] = ()  # the path as keys and indexes

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.path or '<root>'}: {self.message}"


class ConfigError(Exception):
    """The config file is invalid; `issues` lists every problem found. `unreadable`: the
    file (gateway.yaml or its keys file) could not be read at all (an OSError: too many
    open files, an I/O error, a permission), which may pass while the file stays as it
    is: a reload watcher tries such a file again rather than wait for it to change."""

    def __init__(self, source: str, issues: list[ConfigIssue], *, unreadable: bool = False) -> None:
        self.source = source
        self.issues = issues
        self.unreadable = unreadable
        lines = "\n".join(f"  {source}:{issue}" for issue in issues)
        super().__init__(f"invalid config {source} ({len(issues)} problem(s)):\n{lines}")


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Read and validate a config file; raises `ConfigError` listing every problem."""
    return load_config_file(path, env)[0]


def load_config_file(
    path: str | Path, env: Mapping[str, str] | None = None
) -> tuple[GatewaySettings, str]:
    """`load_config`, and the text it read: what `unquoted` needs to keep a problem found
    later (assembling the gateway) from quoting what a `${VAR}` filled in."""
    source = str(path)
    try:
        raw = read_small_file(Path(path), MAX_CONFIG_BYTES)
    except OSError as exc:
        issue = ConfigIssue("", None, f"cannot read: {exc.strerror}")
        raise ConfigError(source, [issue], unreadable=True) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # a ConfigError, so the reload watcher lives on
        problem = f"not UTF-8 text (byte {exc.start})"
        raise ConfigError(source, [ConfigIssue("", None, problem)]) from None
    return load_config_text(text, Path(path).parent, source=source, env=env), text


def load_config_text(
    text: str,
    directory: Path,
    *,
    source: str,
    env: Mapping[str, str] | None = None,
    files: Callable[[GatewaySettings], list[ConfigIssue]] | None = None,
) -> GatewaySettings:
    """`load_config` of a config's text as if it were a file in `directory` (its keys
    file is read from there): the admin API validates a candidate with it, `files` naming
    the paths it may not read (gateway/admin/candidate_files.py), before any is read. Its
    problems, the keys file's and the cross-checks' too, never quote what `${VAR}` filled
    in."""
    environ = os.environ if env is None else env
    config = parse_config(text, source=source, env=environ)
    try:
        refused = files(config) if files is not None else []
        if refused:
            raise ConfigError(source, refused)
        if config.keys_file is not None:
            config = _merge_keys_file(config, directory / config.keys_file, source)
        _no_key_is_an_admin_token(config, source)
    except ConfigError as exc:
        raise _unquoted_error(exc, text, environ) from None
    return config


def _no_key_is_an_admin_token(config: GatewaySettings, source: str) -> None:
    """Refuse a digest that is both a tenant's API key and an admin token (in gateway.yaml
    or its keys file): whoever holds that tenant key would hold the admin API too."""
    admin = {t.hash for t in config.admin.tokens} | set(config.admin.token_hashes)
    for tenant in config.tenants:
        shared = admin.intersection(tenant.api_key_hashes)
        if shared:
            problem = (
                f"tenant {tenant.id!r} has an API key whose digest is also an admin token's "
                f"({min(shared)[:19]}...): a tenant key must never open the admin API"
            )
            raise ConfigError(source, [ConfigIssue("admin", None, problem)])


def referenced_variables(text: str) -> set[str]:
    """The environment variables a config's text names with `${VAR}`."""
    return {match.group(1) for match in _ENV_REF.finditer(text, 0, _past_last_brace(text))}


def unquoted(problems: list[str], text: str, environ: Mapping[str, str]) -> list[str]:
    """`problems` with the value of each variable `text` names (`${VAR}`) written as
    `${VAR}`, also where a problem quotes it escaped (`repr`, JSON, `ascii`): a value
    `${VAR}` fills in is most often a secret (a password in a URL, a key), and a problem
    that quotes it (a URL's bad port, a glob in a region) would print it to whoever reads
    the problem (a CI log, the reload log line, an admin API client)."""
    forms: dict[str, str] = {}
    for name in referenced_variables(text):
        value = environ.get(name)
        if value:
            for form in (value, repr(value)[1:-1], json.dumps(value)[1:-1], ascii(value)[1:-1]):
                forms.setdefault(form, f"${{{name}}}")
    for form in sorted(forms, key=len, reverse=True):  # a value inside another: after it
        problems = [p.replace(form, forms[form]) for p in problems]
    return problems


def parse_config(
    text: str, *, source: str = "<config>", env: Mapping[str, str] | None = None
) -> GatewaySettings:
    """The config `text` holds; a ConfigError's problems never quote what `${VAR}` filled
    in (`unquoted`)."""
    environ = os.environ if env is None else env
    try:
        return _parse_config(text, source=source, env=environ)
    except ConfigError as exc:
        raise _unquoted_error(exc, text, environ) from None


def _unquoted_error(exc: ConfigError, text: str, environ: Mapping[str, str]) -> ConfigError:
    """`exc` with its problems `unquoted` (itself when none quoted a value)."""
    messages = unquoted([issue.message for issue in exc.issues], text, environ)
    source = unquoted([exc.source], text, environ)[0]  # a keys file's path may be one
    if messages == [issue.message for issue in exc.issues] and source == exc.source:
        return exc
    issues = [
        ConfigIssue(issue.path, issue.line, message, issue.loc)
        for issue, message in zip(exc.issues, messages, strict=True)
    ]
    return ConfigError(source, issues, unreadable=exc.unreadable)


def _parse_config(text: str, *, source: str, env: Mapping[str, str]) -> GatewaySettings:
    hidden = hidden_text(text)
    if hidden is not None:  # the declared facts would not read as they load
        at_line, _column, why = hidden
        raise ConfigError(source, [ConfigIssue("", at_line, why)])
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as exc:  # PyYAML composes recursively
        raise ConfigError(
            source, [ConfigIssue("", None, "not valid YAML: it nests too deep")]
        ) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [ConfigIssue("", line, f"not valid YAML: {problem}")]) from exc
    if root is None:
        raise ConfigError(source, [ConfigIssue("", None, "the file is empty")])
    lines: dict[Path_, int] = {}
    issues: list[ConfigIssue] = []
    interpolated: set[Path_] = set()  # the paths whose value `${VAR}` filled in
    try:
        data = _to_python(root, (), lines, issues, env, interpolated)
    except _TooLarge as exc:  # aliases expanding
        problem = f"it expands to more than {_MAX_VALUES} values (YAML aliases?)"
        raise ConfigError(source, [ConfigIssue("", None, problem)]) from exc
    except RecursionError as exc:
        raise ConfigError(source, [ConfigIssue("", None, "it nests too deep")]) from exc
    try:
        config = GatewaySettings.model_validate(data)
    except ValidationError as exc:
        # An unset ${VAR} also fails validation where it sits; report only the cause.
        unset = [issue.loc for issue in issues if issue.loc]
        issues += [
            i
            for i in _pydantic_issues(exc, lines)
            if not any(_nested(i.loc, u) or _nested(u, i.loc) for u in unset)
        ]
        raise ConfigError(source, issues) from exc
    if issues:
        raise ConfigError(source, issues)
    converted = [
        ConfigIssue(_render(path), lines.get(path), problem, path)
        for path, problem in coerced(data, config, interpolated)
    ]
    if converted:
        raise ConfigError(source, converted)
    return config


def _to_python(
    node: yaml.Node,
    path: Path_,
    lines: dict[Path_, int],
    issues: list[ConfigIssue],
    env: Mapping[str, str],
    interpolated: set[Path_],
) -> Any:
    lines[path] = node.start_mark.line + 1
    if len(lines) > _MAX_VALUES:  # each value has its own path: aliases count every use
        raise _TooLarge
    if explicit_tag(node):  # `!!str 0`, `!!set`, `!custom 3` (which PyYAML fails on)
        issues.append(ConfigIssue(_render(path), lines[path], _TAG, path))
        return None
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or explicit_tag(key_node):  # `!x a:`
                issues.append(ConfigIssue(_render(path), line, "keys must be plain names", path))
                continue
            key = key_node.value
            if (escaped := escaped_ascii(key_node)) is not None:  # `"regi\x6fn":` is `region:`
                issues.append(ConfigIssue(_render((*path, key)), line, escaped, (*path, key)))
            if key in result:
                issues.append(ConfigIssue(_render((*path, key)), line, "duplicate key", path))
            result[key] = _to_python(value_node, (*path, key), lines, issues, env, interpolated)
            lines[(*path, key)] = key_node.start_mark.line + 1  # a key's line, not its value's
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(item, (*path, i), lines, issues, env, interpolated)
            for i, item in enumerate(node.value)
        ]
    assert isinstance(node, yaml.ScalarNode)
    if unplain_number(node):  # `010` (8 in YAML 1.1), `0x1e`, `1_000`, `1:30`
        issues.append(ConfigIssue(_render(path), lines[path], NUMBER_PROBLEM, path))
        return None
    if (escaped := escaped_ascii(node)) is not None:  # `region: "\x75s"` is `us`
        issues.append(ConfigIssue(_render(path), lines[path], escaped, path))
    value = plain_scalar(node)
    if isinstance(value, str) and _ENV_REF.search(value, 0, _past_last_brace(value)):
        value = _interpolate(value, path, lines[path], issues, env)
        interpolated.add(path)
    return value


def _interpolate(
    value: str, path: Path_, line: int, issues: list[ConfigIssue], env: Mapping[str, str]
) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        issues.append(
            ConfigIssue(_render(path), line, f"environment variable {name} is not set", path)
        )
        return ""

    end = _past_last_brace(value)
    return _ENV_REF.sub(replace, value[:end]) + value[end:]


def _past_last_brace(text: str) -> int:
    """Where `_ENV_REF` stops searching: past the last `}` (no match ends later)."""
    return text.rfind("}") + 1


def _render(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _pydantic_issues(exc: ValidationError, lines: dict[Path_, int]) -> list[ConfigIssue]:
    issues = []
    errors = exc.errors(include_url=False)
    nested = {tuple(e["loc"][:n]) for e in errors for n in range(len(e["loc"]))}
    for error in errors:
        loc: Path_ = tuple(error["loc"])
        if error["type"] == "too_short" and loc in nested:
            continue  # a list whose items failed also looks "too short"; the item errors say why
        # Find the deepest part of the path that exists in the file to give a line.
        probe = loc
        while probe not in lines and probe:
            probe = probe[:-1]
        message = error["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if error["type"] == "extra_forbidden":
            message = "unknown key (not part of the schema)"
        elif error["type"] == "string_type" and isinstance(error.get("input"), bool):
            message = (
                "expected a string; YAML reads unquoted yes/no/on/off as true/false, "
                "so quote it (e.g. 'no' for Norway)"
            )
        issues.append(ConfigIssue(_render(loc), lines.get(probe), message, loc))
    return issues


def _nested(inner: Path_, outer: Path_) -> bool:
    return inner[: len(outer)] == outer


def _merge_keys_file(config: GatewaySettings, keys_path: Path, source: str) -> GatewaySettings:
    """Add the hashes stored by `owngate keys new` to the tenants they belong to."""
    from gateway.tenants import read_keys_file

    try:
        stored = read_keys_file(keys_path)
    except OSError as exc:  # a ConfigError, so a reload keeps the running config (and its
        # watcher) instead of dying on an unreadable file
        issue = ConfigIssue("", None, f"cannot read: {exc.strerror}")
        raise ConfigError(str(keys_path), [issue], unreadable=True) from exc
    except RecursionError as exc:  # PyYAML composes recursively
        issue = ConfigIssue("", None, "not valid YAML: it nests too deep")
        raise ConfigError(str(keys_path), [issue]) from exc
    except yaml.YAMLError as exc:
        # Where and what, never PyYAML's text: it quotes the line it stopped at, and a
        # candidate config (the admin API's config/validate) may name any readable file.
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or type(exc).__name__
        issue = ConfigIssue("", line, f"not valid YAML: {problem}")
        raise ConfigError(str(keys_path), [issue]) from exc
    except ValueError as exc:
        raise ConfigError(str(keys_path), [ConfigIssue("", None, str(exc))]) from exc
    known = {t.id for t in config.tenants}
    unknown = sorted(set(stored) - known)
    if unknown:
        issue = ConfigIssue("", None, f"keys for tenants not in {source}: {', '.join(unknown)}")
        raise ConfigError(str(keys_path), [issue])
    tenants = tuple(
        t.model_copy(update={"api_key_hashes": t.api_key_hashes + tuple(stored.get(t.id, ()))})
        for t in config.tenants
    )
    return config.model_copy(update={"tenants": tenants})
