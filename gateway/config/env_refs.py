"""`${VAR}` in gateway.yaml: filled in from the environment as the file is read
(`interpolate`), and written back as `${VAR}` wherever a problem would quote what it
filled in (`unquoted`): that is most often a secret."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from gateway.config.issues import ConfigError, ConfigIssue, Path_, render_path

__all__ = [
    "interpolate",
    "names_a_variable",
    "referenced_variables",
    "unquoted",
    "unquoted_error",
]

# Searched only up to the last `}`: a `${X:-` with no `}` after it scanned to the end of
# the text from each of its starts (quadratic: a 256 KiB candidate config of `${a:-`,
# validated for an operator through the admin API, held the interpreter for hours). Up
# to the last `}` each `${X:-` matches, so every character is read once.
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


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


def unquoted_error(exc: ConfigError, text: str, environ: Mapping[str, str]) -> ConfigError:
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


def names_a_variable(value: str) -> bool:
    """Whether `value` holds a `${VAR}`."""
    return _ENV_REF.search(value, 0, _past_last_brace(value)) is not None


def interpolate(
    value: str, path: Path_, line: int, issues: list[ConfigIssue], env: Mapping[str, str]
) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        issues.append(
            ConfigIssue(render_path(path), line, f"environment variable {name} is not set", path)
        )
        return ""

    end = _past_last_brace(value)
    return _ENV_REF.sub(replace, value[:end]) + value[end:]


def _past_last_brace(text: str) -> int:
    """Where `_ENV_REF` stops searching: past the last `}` (no match ends later)."""
    return text.rfind("}") + 1
