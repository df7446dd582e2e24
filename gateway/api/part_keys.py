"""Content parts that mean one thing: no key given twice, or in two cases, in a media
reference's object.

The media check (gateway/api/private_media.py) reads the document orjson parsed, which
keeps the last copy of a repeated key. Readers after the gateway do not all agree with
that: Go's encoding/json, decoding a part into a struct (a server behind a `kind: openai`
backend), keeps a string over a later `null` copy (`{"url": "http://10.0.0.5/", "url":
null}`: fetched there, no URL to the check), merges two copies of an object (`"image_url":
{"url": ...}, "image_url": {"detail": "low"}`), keeps the earlier value over a later one
of another type, and matches names without regard to case (folding U+017F and U+212A to
`s` and `k`), so `{"type": "text", "Type": "image_url"}` is text to vLLM (exact case) and
an image to such a server. Python servers and llama.cpp read the last copy, exact case.

So, in a body the media check walks (`MediaRefs.of`: a message whose content is not a
plain string, or a llama.cpp prompt object), no object inside a chat message's content
parts or `images`, or inside a llama.cpp prompt object (`prompt`, `input`, `content` at
the top level), may hold a key twice (after JSON unescaping: `"u\\u0072l"` is `url`) or
two keys Go folds together (`"url"` and `"URL"`); nor may a message repeat a key
(`"content": [...], "content": "hi"`: a Go type that reads a string or parts into two
fields may keep both). Each is a 400 `invalid_request` naming the object's place
(`messages[0].content[1]`), not the key: the client's names are not echoed. A plain chat
(every message a role and a string content, as orjson kept them) is not parsed again
unless a search of its bytes finds `"content"` written more often than its messages keep
it, or a letter escaped (`\\u0063`); then a message that writes `content` twice is
refused (`refuse_repeated_content`): `"content": [parts], "content": "hi"` is `hi` to the
gateway, the parts to a first-wins reader (Go's gjson) and both to a Go type whose
`UnmarshalJSON` keeps a string and parts in two fields.

The keys kept are read from a second parse that keeps every pair (`json.loads` with
`object_pairs_hook=tuple`, called from C: no Python call per object), only for the
bodies walked; the walk below looks at each object of those places once, and counts
each part, object and array it reads one at a time against `limits.max_media_walk_values`
(an array standing as a part is read here, not by the media walk).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import itemgetter, ne
from typing import Any, Final

from gateway.errors import ErrorCode, GatewayError
from gateway.json_loads import at_most, no_collection

__all__ = ["refuse_ambiguous_parts", "refuse_repeated_content"]

_Pairs = tuple[tuple[str, Any], ...]
_PROMPT_KEYS: Final = ("prompt", "input", "content")  # llama.cpp prompt objects' holders
_NESTED: Final = (tuple, list)
_MESSAGE_LISTS: Final = frozenset({"content", "images"})  # a message's parts, its images
_NAME, _VALUE = itemgetter(0), itemgetter(1)


def refuse_ambiguous_parts(body: bytes, spend: Callable[[int], None]) -> None:
    """Raise 400 `invalid_request` for the first object in a media place of `body` (see
    above) that holds a key twice or in two cases; `body` is a JSON object already parsed
    (gateway/api/body.py bounded its depth). Each part, and each object and array inside
    one, read one at a time is `spend(1)` (the media walk's bound, `MediaWalk.spend`: its
    400 past it); what is not read (a number where a part stands) is skipped in C."""
    # The collector stays off until the pairs are freed: a collection then would walk
    # each of them (as long as the walk below, for 130,000 parts), for no cycle.
    with no_collection(at_most(body)):
        _refuse_ambiguous(json.loads(body, object_pairs_hook=tuple), spend)


def _refuse_ambiguous(top: _Pairs, spend: Callable[[int], None]) -> None:
    for name, value in top:
        if name == "messages" and isinstance(value, list):
            for i, message in compress(enumerate(value), map(isinstance, value, repeat(tuple))):
                _message(i, message, spend)
        elif name in _PROMPT_KEYS:
            items = value if isinstance(value, list) else [value]
            for k, item in compress(enumerate(items), map(isinstance, items, repeat(tuple))):
                wrong = _nested(item, spend)
                if wrong is not None:
                    raise _ambiguous(f"{name}[{k}]" if isinstance(value, list) else name, wrong)


def refuse_repeated_content(body: bytes) -> None:
    """Raise 400 `invalid_request` for the first message of a plain chat `body` (each
    message a role and a string content, as orjson kept them) that writes `content` more
    than once: `"content": [parts], "content": "hi"` is `hi` to the gateway, the parts to a
    first-wins reader (Go's gjson) and both to a Go type whose `UnmarshalJSON` keeps a
    string and parts in two fields. Called only when a search of the body found a name
    written more often than kept, or escaped (gateway/api/private_media.py)."""
    with no_collection(at_most(body)):  # off until the pairs are freed (above)
        _refuse_repeated(json.loads(body, object_pairs_hook=tuple))


def _refuse_repeated(top: _Pairs) -> None:
    for name, value in top:
        if name == "messages" and value.__class__ is list:
            for i, message in enumerate(value):
                if message.__class__ is tuple and [k for k, _ in message].count("content") > 1:
                    raise _ambiguous(f"messages[{i}]", _TWICE)


def _message(i: int, message: _Pairs, spend: Callable[[int], None]) -> None:
    """A message's own keys (no repeat: a case variant of `content` is walked by the
    media check, both copies), then each of its parts and images. The part's place is
    written only for the error: a body may hold 300,000 parts."""
    if len(dict(message)) < len(message):
        raise _ambiguous(f"messages[{i}]", _TWICE)
    for key, value in message:
        if value.__class__ is not list or _folded(key) not in _MESSAGE_LISTS:
            continue
        if tuple not in (kinds := set(map(type, value))) and list not in kinds:
            continue  # strings only (`images`): nothing to read one at a time
        if _plain_parts(value):
            continue  # flat objects of distinct lowercase names, told in C
        for j, part in compress(enumerate(value), map(isinstance, value, repeat(_NESTED))):
            spend(1)
            if part.__class__ is tuple:  # inline: most parts are one flat object
                wrong = _wrong_keys(part) if len(part) > 1 else None
                if wrong is None:
                    for _, item in part:
                        if item and (item.__class__ is tuple or item.__class__ is list):
                            wrong = _nested(item, spend)
                            if wrong is not None:
                                break
            else:
                wrong = _nested(part, spend)
            if wrong is not None:
                raise _ambiguous(f"messages[{i}].{key}[{j}]", wrong)


def _plain_parts(parts: list[Any]) -> bool:
    """Whether `parts` are objects (as decoded, repeats kept) each of distinct names, no two
    Go folds together, and so are the objects they hold: read in C, no Python step per
    part or name (a body within `limits.max_media_walk_values` may hold 130,000 parts),
    a call per level of nesting (the body's depth is bounded). False when any is another
    shape (an array), or a name is not lowercase ASCII: the part loop judges each then,
    exactly."""
    if len(objects := list(compress(parts, map(isinstance, parts, repeat(tuple))))) < len(parts):
        return False
    pairs = list(chain.from_iterable(objects))
    names = "\0".join(map(_NAME, pairs))
    if not names.isascii() or names != names.lower():
        return False  # names that fold (`Type`): judged part by part
    if any(map(ne, map(len, map(dict, objects)), map(len, objects))):
        return False  # a name twice (lowercase ASCII: no other fold)
    values = list(map(_VALUE, pairs))
    inner = list(compress(values, map(isinstance, values, repeat(_NESTED))))
    return not inner or _plain_parts(inner)  # an `image_url` object's, alike


def _nested(value: _Pairs | list[Any], spend: Callable[[int], None]) -> str | None:
    """What is wrong with `value` or an object inside it, if anything. Depth is bounded
    by the body's (gateway/api/body.py `MAX_DEPTH`); each object and array is `spend(1)`."""
    stack = [value]
    while stack:
        value = stack.pop()
        spend(1)
        if value.__class__ is tuple and len(value) > 1:
            wrong = _wrong_keys(value)
            if wrong is not None:
                return wrong
        if value.__class__ is list:  # its objects and arrays picked out in C, not one by one
            stack.extend(compress(value, map(isinstance, value, repeat(_NESTED))))
            continue
        for item in (pair[1] for pair in value):
            if item and (item.__class__ is tuple or item.__class__ is list):
                stack.append(item)
    return None


_TWICE: Final = "holds a key twice"


def _wrong_keys(pairs: _Pairs) -> str | None:
    """Whether an object's `pairs` (as decoded, repeats kept) hold a key twice, or two
    keys Go folds together."""
    keys = dict(pairs)  # from C: no Python call per key
    if len(keys) < len(pairs):
        return _TWICE
    joined = "".join(keys)
    if joined.isascii() and joined.islower():  # no upper case: no two fold together
        return None
    if len({_folded(name) for name in keys}) < len(keys):
        return "holds a key in two cases"
    return None


def _folded(name: str) -> str:
    """`name` as Go's encoding/json matches it: without regard to case, one character to
    one (`casefold` folds U+017F and U+212A to `s` and `k`; a fold to more characters,
    `ß` to `ss`, is not Go's, so such a name is lowered instead: `ẞ` is `ß` to both)."""
    if name.isascii() and name.islower():
        return name
    folded = name.casefold()
    return folded if len(folded) == len(name) else name.lower()


def _ambiguous(where: str, what: str) -> GatewayError:
    return GatewayError(
        ErrorCode.invalid_request,
        f"`{where}` {what}: a backend may read either copy, and fetch what the gateway "
        "did not check",
        param=where,
    )
