"""Load `gateway.yaml`: YAML with line marks, `${ENV}` interpolation, schema validation.

The file is read as the plain data it shows, as the policy files are
(`gateway.plain_yaml`): no explicit YAML tags, whole numbers only in plain decimal digits
(no `010`, `0x1e`, `1_000`, `1:30`), dates kept as text, no `"\\x75s"` for `us` in a value
or key; and a value must already be of its setting's type (`days: '30'` is refused, not
read as 30: `gateway.config.as_written`). Aliases stay allowed (bounded by `MAX_VALUES`,
`gateway.config.yaml_nodes`).

Every problem is reported as a `ConfigIssue` carrying the YAML path (`backends[0].kind`)
and the line it sits on, all at once, so `owngate config validate` shows the whole list.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from gateway.config.as_written import coerced
from gateway.config.env_refs import unquoted_error
from gateway.config.issues import (
    ConfigError,
    ConfigIssue,
    Path_,
    pydantic_issues,
    render_path,
    within,
)
from gateway.config.schema import GatewaySettings
from gateway.config.tenant_keys import merge_keys_file, no_key_is_an_admin_token
from gateway.config.yaml_nodes import MAX_VALUES, TooLarge, to_python
from gateway.logs import get_logger
from gateway.plain_yaml import hidden_text
from gateway.small_files import read_small_file

__all__ = [
    "MAX_CONFIG_BYTES",
    "load_config",
    "load_config_file",
    "load_config_text",
    "parse_config",
]

# gateway.yaml is read whole and parsed on the event loop at a reload: a path replaced by
# a FIFO must not block it for ever, nor `/dev/zero` or a huge file exhaust memory or hold
# the loop for minutes (room for `MAX_VALUES` values, each a key hash).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


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
            config = merge_keys_file(config, directory / config.keys_file, source)
        no_key_is_an_admin_token(config, source)
    except ConfigError as exc:
        raise unquoted_error(exc, text, environ) from None
    unserved = unserved_models(config)
    if unserved:  # a typo, or a model taken off its backends: denied, never an error
        get_logger("owngate.config").warning(
            "tenants list models no backend serves: requests for them are refused",
            config=source,
            models=unserved,
        )
    return config


def parse_config(
    text: str, *, source: str = "<config>", env: Mapping[str, str] | None = None
) -> GatewaySettings:
    """The config `text` holds; a ConfigError's problems never quote what `${VAR}` filled
    in (`unquoted`)."""
    environ = os.environ if env is None else env
    try:
        return _parse_config(text, source=source, env=environ)
    except ConfigError as exc:
        raise unquoted_error(exc, text, environ) from None


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
        data = to_python(root, (), lines, issues, env, interpolated)
    except TooLarge as exc:  # aliases expanding
        problem = f"it expands to more than {MAX_VALUES} values (YAML aliases?)"
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
            for i in pydantic_issues(exc, lines)
            if not any(within(i.loc, u) or within(u, i.loc) for u in unset)
        ]
        raise ConfigError(source, issues) from exc
    if issues:
        raise ConfigError(source, issues)
    converted = [
        ConfigIssue(render_path(path), lines.get(path), problem, path)
        for path, problem in coerced(data, config, interpolated)
    ]
    if converted:
        raise ConfigError(source, converted)
    return config


def unserved_models(config: GatewaySettings) -> list[str]:
    """`tenant: model` for each name a tenant's `models` lists that no backend serves
    (nor names as an alias): requests for it are refused as for any unknown model."""
    served = {n for b in config.backends for m in b.models for n in (m.name, *m.aliases)}
    return [
        f"{tenant.id}: {name}"
        for tenant in config.tenants
        for name in tenant.models
        if name != "*" and name not in served
    ]
