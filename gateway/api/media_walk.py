"""The strings of a request's media places that may be media references, gathered with as
little Python work per value as each shape allows, and within `limits.max_media_walk_values`.

gateway/api/private_media.py says which places a private backend reads media from and how
each string there is judged. A body may hold a million values in those places (an 8 MiB
body of `{"type":"text","x":"a"}` parts, or of `{"a":"b"}` in `mm_payload`), and the walk
runs on the event loop before routing: at several microseconds of Python per value it held
every other tenant's requests, and `/healthz`, for seconds. So:

- a string is judged by C-level calls: where no URL stands, only one that starts with a
  scheme (`xxx:`) or with `http` (any case) can be refused or name a host (a bare path, text
  or base64 is let through there), and a `data:` URL never is; only those are kept;
- an array's strings are picked out and judged in C (`map`, `compress`, `filter`), with no
  Python step per item; only its objects and arrays are walked one at a time;
- an object's members are read one at a time (a member's name decides what its value is),
  and every member and every array read one at a time counts against the request's bound
  (`MediaWalk`), an empty object as one (a body of `{}` parts is millions of objects):
  past it, 400 `invalid_request` naming `limits.max_media_walk_values`. What is not read
  (a number or an array where a part stands) is skipped in C.
"""

from __future__ import annotations

import re
from itertools import compress, filterfalse, repeat
from typing import Any, Final

from gateway.errors import ErrorCode, GatewayError

__all__ = ["MAX_DEPTH", "MediaWalk", "Ref"]

MAX_DEPTH: Final = 6
"""How deep a content part's or a prompt object's value may nest (its objects and arrays)."""

Ref = tuple[str, str, bool]
"""(where, string, whether a URL stands there): one string a server may fetch."""

_URL_KEYS: Final = frozenset({"url", "image_url", "video_url", "audio_url"})
_SKIPPED: Final = frozenset({"type", "text"})  # a part's kind and its prose
# Where no URL stands: a string that may be refused or name a host (`_has_scheme`, or
# `http` in any case, which llama.cpp fetches), and is not a `data:` URL.
_MATTERS: Final = re.compile(r"(?!data:)(?:[Hh][Tt][Tt][Pp]|[A-Za-z][A-Za-z0-9+.\-]{0,38}:)").match
_DATA: Final = re.compile("data:").match
_CONTAINERS: Final = (dict, list)


class _Stop(Exception):
    """The walk met a value nested too deep: what it gathered before stands."""


class MediaWalk:
    """One request's walk: the strings it kept (`refs`, in the order met), the refusal for a
    value nested too deep that stopped it (`too_deep`), and the members and arrays it may
    still read one at a time (`left`)."""

    __slots__ = ("_payload_items", "left", "most", "payload_refs", "refs", "too_deep")

    def __init__(self, most: int) -> None:
        self.most = most
        self.left = most
        self.refs: list[Ref] = []
        self.too_deep: GatewayError | None = None
        self.payload_refs: list[Ref] | None = None  # `mm_payload`'s, once walked
        self._payload_items = 0

    def parts(self, where: str, parts: list[Any]) -> None:
        """A message's content parts at `where` (`messages[0].content`): each part's members
        but its `type` and `text` (in any case), a URL at `url`, `image_url`, ..."""
        refs: list[Ref] = self.refs
        stack: list[tuple[list[Any], bool, int]] = []
        objects = map(isinstance, parts, repeat(dict))  # the parts read, picked out in C
        for j, part in compress(enumerate(parts if self.too_deep is None else ()), objects):
            self.left -= len(part) or 1  # inline, not `spend`: a call less per part
            if self.left < 0:
                raise self._too_many()
            for key, value in part.items():
                if key in _SKIPPED:
                    continue
                folded = key.casefold()
                if folded in _SKIPPED:
                    continue
                if value.__class__ is str:
                    if (not value.startswith("data:")) if folded in _URL_KEYS else _MATTERS(value):
                        refs.append((f"{where}[{j}]", value, folded in _URL_KEYS))
                elif value.__class__ is dict or value.__class__ is list:
                    stack.append(([value], folded in _URL_KEYS, 1))
            if stack and not self._nested(f"{where}[{j}]", stack):
                return

    def strings(self, where: str, value: Any, url_place: bool, depth: int) -> None:
        """`value` at `where`, nested `depth` deep: its strings, a URL standing at `url`
        members (any case) and in `value` itself when `url_place`, none in an array's items;
        members named `type` skipped."""
        if self.too_deep is not None:
            return
        if value.__class__ is str:
            if (not value.startswith("data:")) if url_place else _MATTERS(value):
                self.refs.append((where, value, url_place))
        else:
            self._nested(where, [([value], url_place, depth)])

    def payload(self, where: str, payload: Any) -> int:
        """vLLM's `mm_payload`: every string, at any depth (the body's is bounded), a URL where
        its member's name is `url` or ends in `_url`, and in the arrays under it. The one
        reading of it (gateway/api/mm_payload.py): the strings kept go to `payload_refs`,
        and the count of all its strings (each a media item to vLLM) is returned. Walked
        once per request: a second call (the media check's, after the count's) reads what
        the first found."""
        if self.payload_refs is not None:
            return self._payload_items
        refs: list[Ref] = []
        self.payload_refs = refs
        items = 0
        # Each entry: values of one URL place (an array's objects and arrays as one list,
        # not a tuple per item: a million of those cost more than the walk).
        stack: list[tuple[list[Any], bool]] = [([payload], False)]
        while stack:
            values, url_place = stack.pop()
            for value in values:
                if value.__class__ is str:
                    items += 1
                    if (not value.startswith("data:")) if url_place else _MATTERS(value):
                        refs.append((where, value, url_place))
                elif value.__class__ is dict:
                    self.spend(len(value) or 1)
                    for k, v in value.items():  # a loop, not a generator: a frame less each
                        if v.__class__ is str:
                            items += 1
                            if v.startswith("data:"):
                                continue
                            url = k.casefold() in _URL_KEYS or k.endswith("_url")
                            if url or _MATTERS(v):
                                refs.append((where, v, url))
                        elif v.__class__ is dict or v.__class__ is list:
                            stack.append(([v], k.casefold() in _URL_KEYS or k.endswith("_url")))
                elif value.__class__ is list:
                    self.spend(1)
                    strings, inner = _split(value)
                    items += len(strings)
                    refs.extend(zip(repeat(where), _kept(strings, url_place), repeat(url_place)))
                    if inner:
                        stack.append((inner, url_place))
        self._payload_items = items
        return items

    def _nested(self, where: str, stack: list[tuple[list[Any], bool, int]]) -> bool:
        """The values on `stack` (values of one URL place and depth), and everything under
        them (the stack is left empty); False when one nests too deep (`too_deep` then says
        where)."""
        try:
            self._values(where, stack)
        except _Stop:
            stack.clear()
            return False
        return True

    def _values(self, where: str, stack: list[tuple[list[Any], bool, int]]) -> None:
        refs = self.refs
        while stack:
            values, url_place, depth = stack.pop()
            for value in values:
                if value.__class__ is str:
                    if (not value.startswith("data:")) if url_place else _MATTERS(value):
                        refs.append((where, value, url_place))
                elif depth >= MAX_DEPTH:
                    self._deep(where)  # a number, too, as the walk read it before
                elif value.__class__ is dict:
                    self.spend(len(value) or 1)
                    for key, item in value.items():
                        folded = key.casefold()
                        if folded == "type":
                            continue
                        if item.__class__ is str:
                            url = folded == "url"
                            if (not item.startswith("data:")) if url else _MATTERS(item):
                                refs.append((where, item, url))
                        else:
                            stack.append(([item], folded == "url", depth + 1))
                elif value.__class__ is list:
                    self.spend(1)
                    strings, inner = _split(value)
                    refs.extend(zip(repeat(where), _kept(strings, False), repeat(False)))
                    if depth + 1 >= MAX_DEPTH and len(strings) < len(value):
                        self._deep(where)
                    if inner:
                        stack.append((inner, False, depth + 1))

    def spend(self, values: int) -> None:
        self.left -= values
        if self.left < 0:
            raise self._too_many()

    def _deep(self, where: str) -> None:
        self.too_deep = GatewayError(
            ErrorCode.invalid_request, f"`{where}` nests at most {MAX_DEPTH} deep", param=where
        )
        raise _Stop

    def _too_many(self) -> GatewayError:
        return GatewayError(
            ErrorCode.invalid_request,
            f"the request holds more than {self.most} values where media may stand (its "
            "messages' content parts and images, its prompt and input objects, its "
            "`mm_payload`; `limits.max_media_walk_values`): send fewer, in more requests",
        )


def _split(items: list[Any]) -> tuple[list[str], list[Any]]:
    """An array's strings, and its objects and arrays, each in order, picked out in C."""
    strings = list(compress(items, map(isinstance, items, repeat(str))))
    if len(strings) == len(items):
        return strings, []
    return strings, list(compress(items, map(isinstance, items, repeat(_CONTAINERS))))


def _kept(strings: list[str], url_place: bool) -> Any:
    """The strings of an array that may be refused or name a host, picked out in C."""
    if url_place:
        return filterfalse(_DATA, strings)
    joined = "\0".join(strings)  # most arrays: no string with a colon or `http`, one look
    if ":" not in joined and "http" not in joined.lower():
        return ()
    return filter(_MATTERS, strings)
