"""Parser for the Prometheus text exposition format 0.0.4, as backends serve it on ``/metrics``.

Small, stdlib only, and strict where a lax parser would read the wrong number: every
malformed line raises :class:`ValueError` naming its 1-based line number, so a broken
scrape is reported as broken instead of becoming "no load".

Supported (https://prometheus.io/docs/instrumenting/exposition_formats/):

- ``# HELP name text`` and ``# TYPE name counter|gauge|histogram|summary|untyped``
  lines (validated; at most one TYPE per name); any other ``#`` line is a comment;
  blank lines are skipped.
- samples ``name{label="value",...} value [timestamp]`` with optional spaces around
  labels, a trailing comma, ``{}``, and label values escaped with ``\\\\``, ``\\"``
  and ``\\n``.
- values as Go's ``ParseFloat`` writes them, including ``NaN``, ``+Inf``, ``-Inf``.
- histogram and summary series (``_bucket{le="+Inf"}``, ``_sum``, ``_count``,
  ``{quantile="0.5"}``): each line is an ordinary sample under its own name.

Timestamps are validated and dropped: the gateway ages a scrape by the time it made
it, not by a clock on the backend. OpenMetrics additions (exemplars, ``# EOF`` as a
terminator, ``_created`` semantics) are not part of 0.0.4; ``# EOF`` reads as a comment
and an exemplar is a malformed line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["Sample", "parse_metrics"]

_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_METRIC_NAME)
_METRIC_NAME_FULL_RE = re.compile(_METRIC_NAME + r"\Z")
# One `name="value"` pair, the blanks around it, and the separator that follows it.
# The value as an unrolled loop (`[^"\\\n]*(?:\\.[^"\\\n]*)*`, not `(?:[^"\\\n]|\\.)*`): the
# same strings, matched a run at a time instead of one alternation a character (50x
# faster on a long value).
_LABEL_RE = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*'
)
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
# Go strconv.ParseFloat spellings that Prometheus accepts, minus hex floats and `_`. Each
# run of digits taken whole (`\d++`), never given back: `\d+\.?\d*` split a run of n digits
# every way before failing on what follows (cubic: 4,000 digits and an `x` took seconds,
# and a kept line may be 256 KiB, read on the event loop).
_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:\d++(?:\.\d*+)?|\.\d++)(?:[eE][+-]?\d++)?"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN])\Z"
)
_TIMESTAMP_RE = re.compile(r"-?\d+\Z")
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})
_QUOTED = 40  # characters of a value, timestamp or label name an error quotes


class Sample(NamedTuple):
    """One line of a scrape: the full sample name (with any ``_bucket``/``_sum``/``_count``
    suffix), its labels (read-only), and its value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> dict[str, list[Sample]]:
    """Parse a whole ``/metrics`` body into samples grouped by sample name, in file order.

    Raises ``ValueError("line N: ...")`` on the first malformed line.
    """
    out: dict[str, list[Sample]] = {}
    typed: set[str] = set()
    # Only "\n" ends a line in this format; str.splitlines() would also split on
    # characters that may legally appear inside HELP text or label values.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip():
            continue
        try:
            if line.lstrip(" \t").startswith("#"):
                _check_comment(line, typed)
                continue
            sample = _parse_sample(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}: {_excerpt(line)}") from None
        bucket = out.get(sample.name)
        if bucket is None:
            out[sample.name] = [sample]
        else:
            bucket.append(sample)
    return out


def _check_comment(line: str, typed: set[str]) -> None:
    """Validate ``# HELP`` / ``# TYPE`` lines; any other comment passes."""
    parts = line.lstrip(" \t")[1:].split(None, 3)
    if len(parts) < 1 or parts[0] not in ("HELP", "TYPE"):
        return
    if len(parts) < 2 or not _METRIC_NAME_FULL_RE.match(parts[1]):
        raise ValueError(f"# {parts[0]} needs a valid metric name")
    if parts[0] == "HELP":
        return
    if len(parts) != 3 or parts[2] not in _TYPES:
        raise ValueError(f"# TYPE needs one of {', '.join(sorted(_TYPES))}")
    if parts[1] in typed:
        raise ValueError(f"second # TYPE line for {parts[1]}")
    typed.add(parts[1])


def _parse_sample(line: str) -> Sample:
    pos = len(line) - len(line.lstrip(" \t"))
    match = _NAME_RE.match(line, pos)
    if match is None:
        raise ValueError("expected a metric name")
    name = match.group()
    pos = match.end()
    labels = _EMPTY_LABELS
    if pos < len(line) and line[pos] == "{":
        parsed, pos = _parse_labels(line, pos + 1)
        if parsed:
            labels = MappingProxyType(parsed)
    elif pos == len(line):
        raise ValueError("expected a value after the metric name")
    elif line[pos] not in (" ", "\t"):
        raise ValueError("expected a blank or '{' after the metric name")
    rest = line[pos:]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        raise ValueError("expected a value and an optional timestamp")
    if not _FLOAT_RE.match(fields[0]):
        raise ValueError(f"invalid value {_excerpt(fields[0], _QUOTED)}")
    if len(fields) == 2 and not _TIMESTAMP_RE.match(fields[1]):
        raise ValueError(f"invalid timestamp {_excerpt(fields[1], _QUOTED)}")
    return Sample(name, labels, float(fields[0]))


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse from just after ``{`` to just after ``}``; returns the labels and the new position."""
    labels: dict[str, str] = {}
    while True:
        match = _LABEL_RE.match(line, pos)
        if match is None:
            closing = pos + len(line[pos:]) - len(line[pos:].lstrip(" \t"))
            if closing < len(line) and line[closing] == "}":
                return labels, closing + 1
            raise ValueError("malformed label set")
        key, raw_value = match.group(1), match.group(2)
        if key in labels:
            raise ValueError(f"duplicate label {_excerpt(key, _QUOTED)}")
        labels[key] = _unescape(raw_value) if "\\" in raw_value else raw_value
        pos = match.end()
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        else:
            raise ValueError("expected ',' or '}' after a label")


def _unescape(raw: str) -> str:
    def replace(match: re.Match[str]) -> str:
        char = match.group(1)
        if char not in _ESCAPES:
            raise ValueError(f"invalid escape \\{ascii(char)[1:-1]} in a label value")
        return _ESCAPES[char]

    return _ESCAPE_RE.sub(replace, raw)


def _excerpt(line: str, limit: int = 80) -> str:
    """`line` as an error quotes it: at most `limit` characters, "..." when cut, as `repr`
    writes it (controls, escape sequences and bidi overrides escaped): a backend's
    `/metrics` is its word, and the error goes to the log and `/admin/status`."""
    return repr(line if len(line) <= limit else line[:limit] + "...")
