"""How a problem in gateway.yaml is told: `ConfigIssue` (its YAML path, the line it sits on,
what is wrong), `ConfigError` (every issue of one file), and pydantic's validation errors
as issues at the deepest part of their path the file has (gateway/config/loader.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

__all__ = ["ConfigError", "ConfigIssue", "Path_", "pydantic_issues", "render_path", "within"]

Path_ = tuple[str | int, ...]


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


def render_path(path: Path_) -> str:
    """The YAML path as a problem names it (`backends[0].kind`)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def pydantic_issues(exc: ValidationError, lines: dict[Path_, int]) -> list[ConfigIssue]:
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
        issues.append(ConfigIssue(render_path(loc), lines.get(probe), message, loc))
    return issues


def within(inner: Path_, outer: Path_) -> bool:
    """Whether `inner` is `outer` or a path under it."""
    return inner[: len(outer)] == outer
