"""The `owngate` commands README.md and docs/*.md show: in code blocks (a line each, `\\`
continuations joined) and in inline code, as word lists after `owngate`, with the
`export` lines of the block they sit in (the environment a block's commands assume)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.paths import REPO_ROOT

__all__ = ["DocCommand", "doc_commands", "doc_files"]

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"`([^`\n]+)`")
# `owngate` where a command starts: at the start, after a path (`.venv/bin/`), a pipe,
# `;`, `&&` or `-- ` (`kubectl exec POD -- owngate ...`); followed by one blank (two or
# more are a table's columns: output, not a command). Not `owngate-bench`, `owngate_...`.
_CALL = re.compile(
    r"(?:^|[|;&]\s*|\s--\s+)(?:[\w.~/-]*/)?owngate((?: (?! )[^|;&()#`]*)?)(?=[|;&()#`]|$)"
)


@dataclass(frozen=True)
class DocCommand:
    source: str  # e.g. "docs/deploy.md"
    words: tuple[str, ...]  # after `owngate`, up to a pipe, `;`, `&&` or a comment
    line: str  # the whole line as written (a block's line), or the inline code
    in_block: bool
    environ: dict[str, str] = field(default_factory=dict)


def doc_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _words(tail: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(tail, comments=True))
    except ValueError:  # an unclosed quote in prose: split on blanks
        return tuple(tail.split())


def _exports(block: str) -> dict[str, str]:
    environ: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line[len("export ") :]):
                name, _, value = word.partition("=")
                environ[name] = value
    return environ


def doc_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for path in doc_files():
        text = path.read_text()
        source = path.relative_to(REPO_ROOT).as_posix()
        for block in _FENCE.findall(text):
            joined = block.replace("\\\n", " ")
            environ = _exports(joined)
            for line in joined.splitlines():
                for call in _CALL.finditer(line.strip().removeprefix("$ ")):
                    found.append(DocCommand(source, _words(call.group(1)), line, True, environ))
        for code in _INLINE.findall(_FENCE.sub("", text)):
            for call in _CALL.finditer(code):
                found.append(DocCommand(source, _words(call.group(1)), code, False))
    return found
