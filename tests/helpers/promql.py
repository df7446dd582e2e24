"""The metric names a PromQL expression reads, for checking dashboards and alert rules
against a live `/metrics` (tests/integration/test_observability.py).

A tokenizer that knows PromQL's lexical shapes, not a full parser: strings, numbers and
durations, `{...}` label matchers, `[...]` ranges and subqueries, operators, and
identifiers. An identifier is a metric name unless it is a keyword (`by`, `on`,
`offset`, `and`...), a function or aggregation (an identifier followed by `(`, which
must be a known one, so a misspelt function fails rather than passing as a metric; or an
aggregation followed by its `by`/`without` clause), or a
label in the list after `by`, `without`, `on`, `ignoring`, `group_left` or
`group_right`. A selector that names its metric as `{__name__="..."}` counts too.
Grafana's template variables (`$instance`, `${backend}`, `[[var]]`, `$__rate_interval`)
are skipped, and its `label_values(metric, label)` variable queries read their metric.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["PromQLError", "metric_names", "variable_query_names"]


class PromQLError(ValueError):
    """The expression has a shape this tokenizer does not know (or is malformed)."""


AGGREGATIONS: Final = frozenset(
    {
        "avg",
        "bottomk",
        "count",
        "count_values",
        "group",
        "limit_ratio",
        "limitk",
        "max",
        "min",
        "quantile",
        "stddev",
        "stdvar",
        "sum",
        "topk",
    }
)
FUNCTIONS: Final = frozenset(
    {
        *(f"{f}_over_time" for f in ("avg", "min", "max", "sum", "count", "quantile")),
        *(f"{f}_over_time" for f in ("stddev", "stdvar", "last", "present", "mad", "absent")),
        *("abs", "absent", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil"),
        *("changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "day_of_month"),
        *("day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv"),
        *("double_exponential_smoothing", "end", "exp", "floor", "histogram_avg"),
        *("histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev"),
        *("histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase"),
        *("info", "irate", "label_join", "label_replace", "ln", "log10", "log2", "minute"),
        *("month", "pi", "predict_linear", "rad", "rate", "resets", "round", "scalar", "sgn"),
        *("sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt"),
        *("start", "tan", "tanh", "time", "timestamp", "vector", "year"),
    }
)
# Followed by a parenthesised list of label names (optional after group_left/right).
LABEL_LISTS: Final = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS: Final = frozenset({"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan"})

_TOKEN = re.compile(
    r"""
      (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
    | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])\d*)*)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<open>[({\[])
    | (?P<close>[)}\]])
    | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=,@:])
    """,
    re.VERBOSE,
)
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"((?:[^"\\]|\\.)*)"')
_PAIRS: Final = {"(": ")", "{": "}", "[": "]"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"unexpected {expr[at : at + 20]!r} at {at} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append((kind, match.group()))
        at = match.end()
    return tokens


def _skip_group(tokens: list[tuple[str, str]], start: int, expr: str) -> tuple[int, str]:
    """From the opening bracket at `start`: the index after its closing one, and the
    source of what it encloses (strings kept whole, so a `}` in a label value is text)."""
    stack = [tokens[start][1]]
    inner: list[str] = []
    i = start + 1
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "open":
            stack.append(text)
        elif kind == "close":
            if _PAIRS[stack.pop()] != text:
                raise PromQLError(f"mismatched {text!r} in {expr!r}")
            if not stack:
                return i + 1, " ".join(inner)
        inner.append(text)
        i += 1
    raise PromQLError(f"unclosed {tokens[start][1]!r} in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (raises `PromQLError` on an unknown function or a
    malformed expression)."""
    tokens = _tokens(expr)
    names: set[str] = set()
    depth = 0
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "open" and text in "{[":
            end, inner = _skip_group(tokens, i, expr)
            if text == "{":  # a selector's matchers: only `__name__` names a metric
                names.update(_NAME_MATCHER.findall(inner))
            i = end
            continue
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth < 0:
                raise PromQLError(f"unbalanced ')' in {expr!r}")
        elif kind == "ident":
            if text in LABEL_LISTS:
                if following == ("open", "("):
                    i, _ = _skip_group(tokens, i + 1, expr)
                    continue
                if text not in ("group_left", "group_right"):
                    raise PromQLError(f"{text!r} without its label list in {expr!r}")
            elif text in AGGREGATIONS and following in (("ident", "by"), ("ident", "without")):
                pass  # `sum by (label) (...)`: the clause comes first
            elif following == ("open", "("):
                if text not in FUNCTIONS and text not in AGGREGATIONS:
                    raise PromQLError(f"unknown function {text!r} in {expr!r}")
            elif text.lower() not in KEYWORDS:
                names.add(text)
        i += 1
    if depth:
        raise PromQLError(f"unclosed '(' in {expr!r}")
    return names


_LABEL_VALUES = re.compile(r"\s*label_values\s*\((?P<args>.*)\)\s*\Z", re.DOTALL)


def variable_query_names(query: str) -> set[str]:
    """The metric names a Grafana Prometheus variable query reads: `label_values(expr,
    label)` reads `expr`'s (`label_values(label)` none), `query_result(expr)` and
    `metrics(...)` are not used here and refused."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise PromQLError(f"variable query {query!r} is not label_values(...)")
    args = match["args"]
    selector, comma, label = args.rpartition(",")
    if not comma:
        return set()  # label_values(label): every series
    if not re.fullmatch(r"\s*[a-zA-Z_][a-zA-Z0-9_]*\s*", label):
        raise PromQLError(f"variable query {query!r}: {label!r} is not a label name")
    return metric_names(selector)
