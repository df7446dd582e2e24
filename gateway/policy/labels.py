"""How a data-class label reads, wherever it comes from: the gateway's request header
(every copy) and `owngate policy explain --data-class` agree by using this one parser.

A label is one class name, compared as the engine compares it (`normalized`: surrounding
spaces and tabs stripped, ASCII letters lower-cased). Nothing else is folded: Python's
`str.strip()` also strips NEL (0x85), NBSP (0xa0) and Unicode spaces, and `str.lower()`
makes the Kelvin sign a `k`, so a class name with a raw 0xa0 byte beside it was read as
that class while the same look-alike in UTF-8 was refused; a label with such a character
names no class and is refused as any other look-alike. Several values (copies of the
header, or comma-separated values, as HTTP joins repeated headers) must all name the same
class; an empty or blank value names none. Either is refused (`InvalidLabel`), never read
as "no label" and never "first value wins".
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["InvalidLabel", "normalized", "one_label"]

# HTTP's optional whitespace around a field value (RFC 9110 section 5.6.3): SP and HTAB.
_OWS = " \t"


class InvalidLabel(ValueError):
    """The label is present but names no single class (empty, blank, or values that
    disagree)."""


def one_label(values: Iterable[str]) -> str | None:
    """The one label `values` name (stripped, lower case), or None when there are no
    values at all. Raises `InvalidLabel` for an empty or blank value and for values that
    name different labels."""
    found: str | None = None
    for value in values:
        for part in value.split(","):
            label = normalized(part)
            if not label:
                raise InvalidLabel("is empty or blank")
            if found is None:
                found = label
            elif label != found:
                raise InvalidLabel("has values that disagree (copies must name one class)")
    return found


def normalized(label: str) -> str:
    """`label` as classes compare: spaces and tabs around it stripped, ASCII letters in
    lower case. A label with any other character is kept as it is (class names are
    `[a-z0-9_-]`, so it names none): no Unicode case or space folding makes it one."""
    stripped = label.strip(_OWS)
    return stripped.lower() if stripped.isascii() else stripped
