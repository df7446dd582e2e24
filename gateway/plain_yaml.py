"""YAML read as the plain data it shows: what gateway.yaml and the policy files share.

Both are trust inputs a reviewer reads as text (a backend's declared `retention.days`, a
policy's `max_days`), so each YAML node must read as what it looks like:

- no explicit tags (`!!str 0`, `!!python/...`, `!!set`, a custom `!tag`): a tag changes
  what a value reads as, and PyYAML's safe loader fails on an unknown one;
- whole numbers only in plain decimal digits: YAML 1.1, which PyYAML reads, takes `010`
  for 8, `0x1e` for 30, `1_000` for 1000 and `1:30` for 90, where YAML 1.2 tools and
  reviewers read them otherwise (floats with `_` or `:` likewise);
- a date or time (`version: 2025-06-01`) is kept as the text written;
- no numeric escape in a double-quoted string (`"\\x2a"`, `"\\u0061cme"`) that stands for
  a printable ASCII character: it reads as escape text and loads as the character
  (`allow: ["\\x2a"]` is `allow: ["*"]`, a tenant written `"\\x61cme"` is found by no
  `grep acme`); the character itself is what to write.

The loaders (`gateway.config.yaml_nodes`, `gateway.policy.source`) walk the composed nodes
themselves (they record paths and lines, and differ on aliases and `${ENV}`) and ask this
module about each node.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any, cast

import yaml

__all__ = [
    "NUMBER_PROBLEM",
    "escaped_ascii",
    "explicit_tag",
    "hidden_text",
    "key_in_text",
    "key_pattern",
    "plain_scalar",
    "tag_problem",
    "unplain_number",
]

NUMBER_PROBLEM = (
    "write numbers in plain decimal digits (quote a name): YAML 1.1 reads 010 as 8, "
    "0x1e as 30, 1_000 as 1000 and 1:30 as 90, where YAML 1.2 tools read them otherwise"
)
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_Resolve = Callable[[type[yaml.Node], str, tuple[bool, bool]], str]
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")


# Characters that make a file load other than it reads. YAML 1.1 breaks lines at NEL,
# LINE SEPARATOR and PARAGRAPH SEPARATOR and at a carriage return alone, where diffs,
# grep and most editors see one line: whatever follows one inside a comment (a whole
# second document binding a tenant to a permissive policy) is loaded unseen. Bidirectional
# controls reorder how a line is displayed ("Trojan Source", CVE-2021-42574).
_HIDDEN = re.compile("[\x85\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")


def hidden_text(text: str) -> tuple[int, int, str] | None:
    """The first character of `text` that hides or reorders what a reviewer reads, as
    (line, column, why), lines counted at newlines as editors count them; or None."""
    found = _HIDDEN.search(text)
    if found is None:
        return None
    at = found.start()
    line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
    char = found.group()
    controls = {"\r": "CARRIAGE RETURN", "\x85": "NEXT LINE"}  # unicodedata names neither
    name = f"U+{ord(char):04X} {controls.get(char) or unicodedata.name(char, 'unnamed')}"
    if char == "\r" or char in "\x85\u2028\u2029":
        why = (
            f"{name}: YAML reads a line break there, where editors, diffs and reviews "
            "show one line, so text after it (in a comment, say) is read unseen; "
            "end lines with a newline only"
        )
    else:
        why = (
            f"{name}: a bidirectional control changes the order a line is displayed in, "
            "so what a review shows is not what is read; remove it"
        )
    return line, column, why


# A free-text value (a policy's description, a backend's `retention.evidence`) written as
# a block scalar runs on over the lines indented below it: a key written there reads as
# one in a review and is text. Also when quoted (`"days": 365`, as JSON writes it) or
# written with characters a review does not see or takes for ASCII: `fall\u200bback:` (a
# zero-width space, soft hyphen, word joiner), `require:` in full-width forms, or with a
# Cyrillic `e` (U+0435). So the text is matched as it reads: invisible characters
# dropped, NFKC forms folded, look-alike letters taken for the ASCII ones.
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0\ufe00-\ufe0f]")
_LOOK_ALIKE = str.maketrans(
    # Cyrillic, Greek, Armenian and Latin letters that look like the ASCII ones keys use.
    "аԁеһіјӏорԛѕуүхԝсαονιкκτυχρıɡɑօսհ",
    "adehijlopqsyyxwcaovikktuxpigaouh",
)


def key_pattern(keys: Iterable[str]) -> re.Pattern[str]:
    """What `key_in_text` looks for: one of `keys` followed by a colon, as YAML writes a key."""
    names = "|".join(sorted((re.escape(key) for key in keys), key=len, reverse=True))
    return re.compile(rf"(?:^|[\s{{\[,\"'-])({names})[\"']?\s*:(?:\s|$)")


def key_in_text(text: str, keys: re.Pattern[str]) -> str | None:
    """The first key (`key_pattern`) that free text holds as a review reads it, or None."""
    visible = "".join(c for c in text if unicodedata.category(c) != "Cf")
    read = _IGNORABLE.sub("", unicodedata.normalize("NFKC", visible)).translate(_LOOK_ALIKE)
    found = keys.search(read)
    return None if found is None else found.group(1)


def tag_problem(where: str) -> str:
    """The message for an explicit tag in `where` ("policy files", "gateway.yaml")."""
    return (
        f"YAML tags (!!str, !!int, !!set, !!python/..., !custom) are not allowed in {where}; "
        "write the value plainly (quote a string)"
    )


def explicit_tag(node: yaml.Node) -> bool:
    """Whether the file gave `node` a tag that changes what it reads as (`!!str 0`,
    `!!set {}`, `!custom x`): any tag but the one the value has without it."""
    if isinstance(node, yaml.MappingNode):
        return bool(node.tag != _MAP)
    if isinstance(node, yaml.SequenceNode):
        return bool(node.tag != _SEQ)
    assert isinstance(node, yaml.ScalarNode)
    resolve = cast(_Resolve, yaml.resolver.Resolver().resolve)  # SafeLoader's; untyped stubs
    plain = node.style is None  # quoted and block scalars resolve as strings
    return bool(node.tag != resolve(yaml.ScalarNode, node.value, (plain, not plain)))


# An escape in a double-quoted scalar, matched from its backslash: `\\` is one escape (a
# backslash), so `"\\x41"` is the text `\x41`, not an escape of `A`.
_ESCAPE = re.compile(r"\\(?:x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|.)", re.DOTALL)
# The named escapes of a printable ASCII character that need none (`\\"` and `\\\\` do),
# and the line breaks PyYAML reads (an escaped one joins its lines).
_NAMED_ASCII = frozenset({"/", " "})
_LINE_BREAKS = frozenset("\r\n\x85\u2028\u2029")


def escaped_ascii(node: yaml.Node) -> str | None:
    """Why `node`, a double-quoted scalar, does not read as it loads, or None: the first
    escape in it that stands for a printable ASCII character other than the two that must
    be escaped (`\\"`, `\\\\`): a numeric one (`\\x2a`, `\\u0061`, `\\U0000002a`) or a
    named one (`\\/`, `\\ `), which a reader sees as escape text and the loader reads as
    that character (`"\\x2a"` is `*`); or an escaped line break that joins two words into
    one (`"a\\` then `cme"` on the next line is `acme`, found by no `grep acme`). Escapes
    of what cannot be written plainly (a control, a line break, a non-ASCII character) are
    left to the checks of the value itself, and a line broken after a space still loads."""
    if not isinstance(node, yaml.ScalarNode) or node.style != '"':
        return None
    start, end = node.start_mark, node.end_mark
    if start is None or end is None or start.buffer is None:  # composed from a text: never
        return None
    written = start.buffer[start.pointer : end.pointer]
    for found in _ESCAPE.finditer(written):
        digits = found.group(1) or found.group(2) or found.group(3)
        if digits is not None and 0x20 <= int(digits, 16) <= 0x7E:
            return (
                f"the escape `{found.group()}` stands for {chr(int(digits, 16))!r}: a reader "
                "sees the escape, the loader the character; write the character itself"
            )
        named = found.group()[1:]
        if named in _NAMED_ASCII:
            return (
                f"the escape `{found.group()}` stands for {named!r}: a reader sees the "
                "escape, the loader the character; write the character itself"
            )
        before = written[found.start() - 1]  # `written` opens with its quote
        if named[:1] in _LINE_BREAKS and not before.isspace() and before != '"':
            return (
                f"a line ends in `{before}\\`, an escaped line break: the loader joins it to "
                "the next line's text with no space, a reader sees two words; write the "
                "value on one line, or break it after a space"
            )
    return None


def unplain_number(node: yaml.ScalarNode) -> bool:
    """Whether `node` is a number in a YAML 1.1 form other than plain decimal digits
    (`010`, `0x1e`, `0o17`, `1_000`, `1:30`, `1_0.5`)."""
    return (node.tag == _INT and not _DECIMAL.match(node.value)) or (
        node.tag == _FLOAT and ("_" in node.value or ":" in node.value)
    )


def plain_scalar(node: yaml.ScalarNode) -> Any:
    """The value of a scalar without an explicit tag (`explicit_tag` false): str, int,
    float, bool or None, and a date or time as the text written (a datetime would not be)."""
    if node.tag == _TIMESTAMP:
        return node.value
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
