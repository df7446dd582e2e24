"""Every `owngate` command README.md and docs/*.md show names a command that exists, and
every `--flag` it passes is one that command takes (`owngate <verb> --help` lists it)."""

from __future__ import annotations

import argparse
import re

from gateway.cli.main import build_parser
from tests.helpers.doc_commands import doc_commands

# A word that names something, not a command: `owngate <noun> <verb>`, `owngate VERB`.
_PLACEHOLDER = re.compile(r"[<A-Z\[]")
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _check(root: argparse.ArgumentParser, words: tuple[str, ...]) -> str | None:
    """What is wrong with `owngate WORDS`, or None."""
    parser, path, rest = root, ["owngate"], list(words)
    while rest and rest[0] in _subcommands(parser):
        parser = _subcommands(parser)[rest[0]]
        path.append(rest.pop(0))
    if len(path) == 1:
        if rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]) and rest[0] != "serve's":
            return f"no command {rest[0]!r}"
        return None
    if _subcommands(parser) and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        return f"{' '.join(path)} has no verb {rest[0]!r}"
    if _subcommands(parser) and rest and rest[0].startswith("--") and rest[0] != "--help":
        return None  # `owngate audit --key`: a flag shared by verbs, named in prose
    for word in rest:
        flag = _FLAG.match(word)
        if flag and flag.group() not in _flags(parser) | {"--help"}:
            return f"{' '.join(path)} takes no {flag.group()}"
    return None


def test_every_documented_command_and_flag_exists() -> None:
    root = build_parser()
    problems = set()
    for command in doc_commands():
        if command.words and _PLACEHOLDER.match(command.words[0]):
            continue
        wrong = _check(root, command.words)
        if wrong:
            problems.add(f"{command.source}: {wrong} (`{command.line.strip()[:80]}`)")
    assert not problems, "\n".join(sorted(problems))


def test_a_made_up_flag_or_verb_is_caught() -> None:
    root = build_parser()
    assert _check(root, ("serve", "--workers", "2")) is None
    assert _check(root, ("serve", "--worker", "2")) == "owngate serve takes no --worker"
    assert _check(root, ("audit", "verfy", "DIR")) == "owngate audit has no verb 'verfy'"
    assert _check(root, ("audti", "verify")) == "no command 'audti'"
