"""Values of gateway.yaml that pydantic would convert to another type: refused.

pydantic (lax, as `GatewaySettings` validates) turns the text `'30'` into the number 30,
`true` into 1 and `1` into true. In gateway.yaml that hides what a reviewer reads: a
backend declared `retention: {days: '30'}` is judged by a policy as keeping data 30
days, where a YAML 1.2 tool, a linter or a schema reads a string. So a value written in
the file must already be of the type its setting takes (an int is still a float).

A value that `${VAR}` filled in is text by nature: it may stand for a number written in
plain decimal digits (`port: ${PORT}`) or for `true`/`false`, and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["coerced"]

Path_ = tuple[str | int, ...]
_MISSING = object()
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_QUOTED_NUMBER = (
    "a number written as text (quoted, or not a plain number): write it unquoted in "
    "plain decimal digits, e.g. 30 (a float with an exponent needs a point and a sign: "
    "YAML reads 1e3 as text, 1.0e+3 as 1000.0)"
)
_QUOTED_BOOL = "true/false written as text: write true or false, unquoted"
_BOOL_AS_NUMBER = (
    "true/false where a number goes (YAML reads unquoted yes/no/on/off as true/false): "
    "write the number"
)
_NUMBER_AS_BOOL = "a number where true or false goes: write true or false"


def coerced(
    data: Any, config: BaseModel, interpolated: Collection[Path_]
) -> Iterator[tuple[Path_, str]]:
    """(path, problem) for every value of `data` (the file as read) that validating it
    into `config` converted to another type, other than the forms `${VAR}` may give
    (`interpolated`: the paths whose value it filled in)."""
    yield from _walk(data, config, (), interpolated)


def _walk(
    data: Any, value: Any, path: Path_, interpolated: Collection[Path_]
) -> Iterator[tuple[Path_, str]]:
    if isinstance(data, dict):
        for key, item in data.items():
            if isinstance(value, BaseModel):
                found = (
                    getattr(value, key, _MISSING) if key in type(value).model_fields else _MISSING
                )
            elif isinstance(value, Mapping):
                found = value.get(key, _MISSING)
            else:
                return
            if found is not _MISSING:
                yield from _walk(item, found, (*path, key), interpolated)
    elif isinstance(data, list):
        if isinstance(value, (list, tuple)) and len(value) == len(data):
            for i, (item, found) in enumerate(zip(data, value, strict=True)):
                yield from _walk(item, found, (*path, i), interpolated)
    else:
        problem = _conversion(data, value, path in interpolated)
        if problem is not None:
            yield path, problem


def _conversion(written: Any, read: Any, interpolated: bool) -> str | None:
    """Why turning `written` into `read` is refused, or None when it is not a conversion
    (or one that is allowed: an int read as a float, a `${VAR}` in a plain form)."""
    if isinstance(read, bool):
        if isinstance(written, bool):
            return None
        if isinstance(written, str):
            return None if interpolated and written in ("true", "false") else _QUOTED_BOOL
        return _NUMBER_AS_BOOL
    if isinstance(read, (int, float)):
        if isinstance(written, bool):
            return _BOOL_AS_NUMBER
        if isinstance(written, str):
            plain = _INT if isinstance(read, int) else _FLOAT
            return None if interpolated and plain.match(written) else _QUOTED_NUMBER
    return None
