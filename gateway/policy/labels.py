"""How a data-class label reads, wherever it comes from: the gateway's request header
(every copy) and `owngate policy explain --data-class` agree by using this one parser.

A label is one class name, compared as the engine compares it (surrounding whitespace
stripped, lower case). Several values (copies of the header, or comma-separated values,
as HTTP joins repeated headers) must all name the same class; an empty or blank value
names none. Either is refused (`InvalidLabel`), never read as "no label" and never
"first value wins".
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["InvalidLabel", "one_label"]


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
            label = part.strip().lower()
            if not label:
                raise InvalidLabel("is empty or blank")
            if found is None:
                found = label
            elif label != found:
                raise InvalidLabel("has values that disagree (copies must name one class)")
    return found
