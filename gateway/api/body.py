"""The request body: parsed once, and refused where its fields could mean one thing to the
gateway and another to a backend (its rewrites, for aliases and stream usage, are in
gateway/api/body_rewrites.py).

The gateway decides on a few fields of the body and forwards the rest untouched. Those
fields must mean one thing, to the gateway and to whatever reads the body after it:

- `model` (where the request may go), `stream` (how the answer is relayed) and
  `stream_options` (whether the client gets the usage chunk), and `include_usage` inside
  `stream_options`, may each appear once in their object: a repeat, however its name is
  spelled (`"mod\\u0065l"` is `model`), is refused, since a backend could read the copy
  the gateway did not (and no object anywhere may repeat any name: body_names.py). Nor
  may such a name appear in another case (`"Model"`, `"\\u017ftream"`): Go's encoding/json (Ollama,
  LocalAI and other servers behind a `kind: openai` backend) matches names without regard
  to case, folding U+017F (long s) to `s` and U+212A (Kelvin) to `k`, and reads the last
  match, so `{"model": "a", "Model": "b"}` would be served as `b` while the gateway
  decided, and logged, `a`.
- The same holds for the fields that bound the tokens a request is reserved and charged
  (`max_tokens`, `n`, `messages`, Infinity's `modality`, ...: gateway/api/usage_bound.py's
  `READ_FIELDS`; `modality` also says whether the media check reads `input` as URLs):
  `{"max_tokens": 1, "Max_tokens": 100000}` was reserved and bounded as one output token
  while such a server generated 100,000. Nor may they repeat: Go leaves a field that is
  not a pointer, slice, map or interface as it was for a `null`, so `{"n": 8, "n":
  null}` was eight choices to a server whose `n` is a plain integer, one to the gateway.
- `stream` is `true`, `false` or `null`; `stream_options` an object or `null`, with a
  boolean or `null` `include_usage`. A string `"true"` that a backend might read as true
  while the gateway reads it as false is refused.
- Nesting deeper than `MAX_DEPTH` objects and arrays is refused: the gateway and the
  libraries after it (re-encoding, LiteLLM) recurse over the document.
- An integer literal outside the 64-bit range, anywhere in the body, is refused: a body
  re-encoded would carry another number (gateway/api/body_integers.py).

Every refusal is a 400 `invalid_request` (or `invalid_json` for what is not JSON).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from types import EllipsisType
from typing import Any, Final, NamedTuple

import orjson

from gateway.api.body_integers import check_integers, long_digit_run
from gateway.api.body_names import check_unique_names
from gateway.api.usage_bound import READ_FIELDS
from gateway.body_budget import held_for_characters
from gateway.errors import ErrorCode, GatewayError
from gateway.json_loads import at_most, loads, no_collection

__all__ = [
    "MAX_DEPTH",
    "PER_VALUE",
    "BodyScan",
    "held_bound",
    "parse_body",
    "scan_body",
]


MAX_DEPTH: Final = 128
"""The deepest nesting of objects and arrays accepted, the top-level object counting 1."""

# orjson refuses documents nested deeper than 1024 (a test pins it): the body wrapped in
# 1024 - MAX_DEPTH arrays parses only when the body itself is at most MAX_DEPTH deep.
_ORJSON_DEPTH: Final = 1024
_WRAP: Final = _ORJSON_DEPTH - MAX_DEPTH
_OPEN, _CLOSE = b"[" * _WRAP, b"]" * _WRAP

# The top-level names no key may repeat or spell in another case: the decided-on ones,
# and those the tokens reserved and charged are bounded by (gateway/api/usage_bound.py).
_TOP_KEYS: Final = ("model", "stream", "stream_options", *READ_FIELDS)
_OPTION_KEYS: Final = ("include_usage",)
_FOLDED_KEYS: Final = frozenset(_TOP_KEYS)
_TOP_LENGTHS: Final = frozenset(len(n) for n in _FOLDED_KEYS)
_OPTION_LENGTHS: Final = frozenset(len(n) for n in _OPTION_KEYS)


def _spellings(name: str) -> bytes:
    """A regex for every JSON spelling of the string `name`: each character as itself or
    as a `\\uXXXX` escape (the names here have no other escape)."""
    chars = b"".join(b"(?:" + re.escape(c.encode()) + b"|\\\\u" + _hex(ord(c)) + b")" for c in name)
    return b'"' + chars + b'"'


def _hex(code: int) -> bytes:
    return b"".join(
        b"[" + d.lower().encode() + d.upper().encode() + b"]" if d.isalpha() else d.encode()
        for d in f"{code:04x}"
    )


# The plain spellings: a body without escapes that holds each at most once has no repeat.
_QUOTED: Final = tuple(f'"{n}"'.encode() for n in (*_TOP_KEYS, *_OPTION_KEYS))
# Every place where a decided-on name is written as a key. A key always matches (it starts
# at an unescaped quote), so fewer than two matches per name proves no repeat; two or
# more (the name may also be a nested key) call for the exact check.
_DECIDED_KEYS: Final = re.compile(
    b"(" + b"|".join(_spellings(n) for n in (*_TOP_KEYS, *_OPTION_KEYS)) + b")[ \t\r\n]*:"
)


PER_VALUE: Final = 320
"""Bytes a request may hold per `{`, `[` or `,` in its body, on top of its characters.
The most one parsed value was measured to take is 226 bytes with tracemalloc (an object
of one member under a new name, nested; orjson 3.13, CPython 3.11), about 10% more in
the process's resident memory (allocator rounding): tests/unit/test_held_bound.py."""

_COUNT_OUTSIDE: Final = 16 * 1024  # bytes of body from which the walk counts all commas
_NOT_BEFORE_A_VALUE: Final = bytes(b for b in range(256) if b not in b"{[,")


def held_bound(body: bytes, scan: BodyScan | None) -> int:
    """An upper bound of the memory a request holds for `body` until it ends: the body, one
    rewritten copy (`rewrite_model`, `ask_for_usage`), and the document parsed from it.
    `scan` is `scan_body(body)`.

    Every JSON value and object member follows a `[`, `{` or `,` outside strings, so
    `PER_VALUE` times their count covers the objects; a string's characters take at most
    1 byte each in CPython when the body is ASCII without escapes, at most 4 otherwise. A
    body of few strings is counted outside them (its walk, `scan`) when it is over
    `_COUNT_OUTSIDE` bytes or its stretches between strings are all short (a chat body:
    one count of them, where the pass below cost about 12 K instructions per 1 KB);
    any other in one C-level pass over all of it (brackets and commas inside strings
    too): cheaper than a count per long stretch below that size, and about a third of
    the parse's time for an 8 MiB body. Not counted: what the parse needs while it runs
    and frees when it returns (orjson's 12 bytes per body byte, the repeat checks' second
    parses: body_names.py), which one process needs for one body at a time."""
    plain = body.isascii() and body.find(b"\\") < 0  # find: memchr, not `in`
    if scan is None or scan.commas < 0:
        values = len(body.translate(None, _NOT_BEFORE_A_VALUE))  # one pass, not three counts
    else:
        values = scan.brackets + scan.commas
    return held_for_characters(len(body), plain=plain) + PER_VALUE * values


def parse_body(body: bytes, scan: BodyScan | EllipsisType | None = ...) -> dict[str, Any]:
    """The request document, once its decided-on fields are unambiguous (see above).
    `scan` is `scan_body(body)` when the caller has it already."""
    if scan is ...:
        scan = scan_body(body)
    doc = _loads(body, _brackets(body, 0, len(body)) if scan is None else scan.brackets)
    if not isinstance(doc, dict):
        raise GatewayError(ErrorCode.invalid_request, "the request body must be a JSON object")
    once = _searched_once(body) if scan is None else scan.once
    repeated = [] if once else _exact_repeats(body)
    if repeated:
        raise GatewayError(
            ErrorCode.invalid_request,
            f"the request body repeats the `{repeated[0]}` key",
            param=repeated[0],
        )
    folded = _folded_name(doc)
    if folded is not None:
        raise GatewayError(
            ErrorCode.invalid_request,
            f"the request body holds the `{folded}` key in another case (a backend may read "
            "names without regard to case)",
            param=folded,
        )
    _check_stream_fields(doc)
    check_integers(body, None if scan is None else scan.digits)
    check_unique_names(body, doc, -1 if scan is None else scan.colons)
    return doc


def _folded_name(doc: dict[str, Any]) -> str | None:
    """The decided-on name a key of `doc` (or of its `stream_options`) spells in another
    case, if one does. Go folds one character to one (`simple folding`), so only keys as
    long as a name can match it; `casefold` folds every character Go folds to an ASCII
    letter (U+017F, U+212A), and only keys of a name's length are folded at all."""
    for name in doc:
        if len(name) in _TOP_LENGTHS and name not in _FOLDED_KEYS:
            folded = name.casefold()  # `ß` is `ss` here, one character to Go: not a name
            if folded in _FOLDED_KEYS and len(folded) == len(name):
                return folded
    options = doc.get("stream_options")
    for name in options if isinstance(options, dict) else ():
        if len(name) in _OPTION_LENGTHS and name not in _OPTION_KEYS:
            folded = name.casefold()
            if folded in _OPTION_KEYS:
                return f"stream_options.{folded}"
    return None


def _loads(body: bytes, brackets: int) -> Any:
    # Fewer opening brackets (outside strings) than MAX_DEPTH cannot nest deeper.
    deep = brackets > MAX_DEPTH
    try:
        if not deep:
            return loads(body, brackets)
        return _unwrap(loads(_OPEN + body + _CLOSE, brackets))
    except orjson.JSONDecodeError:
        pass
    try:  # again unwrapped: the client's own offsets, and whether depth was the reason
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(
            ErrorCode.invalid_json,
            f"We could not parse the JSON body of your request ({_why_not(body, exc)}).",
        ) from None
    raise GatewayError(
        ErrorCode.invalid_request,
        f"the request body nests objects and arrays more than {MAX_DEPTH} levels deep",
    )


def _why_not(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """orjson's reason, except for bytes that are not UTF-8, where it names surrogates and
    the first character whatever the bytes were: the offset of the first byte that is not
    (none of the body is quoted)."""
    try:
        body.decode()
    except UnicodeDecodeError as bad:
        return f"the body is not valid UTF-8: {bad.reason} at byte {bad.start}"
    return str(exc.args[0])


def _unwrap(doc: Any) -> Any:
    for _ in range(_WRAP):
        doc = doc[0]
    return doc


def _repeated_keys(body: bytes) -> list[str]:
    """The decided-on names that appear twice in their object (`stream_options.x` for a
    name inside `stream_options`), decoded as JSON decodes them."""
    return [] if _no_name_twice(body) else _exact_repeats(body)


def _exact_repeats(body: bytes) -> list[str]:
    """`_repeated_keys` for a body where a name may be written twice."""
    seen: Counter[str] = Counter()
    # Each spelling decoded once (a body may write a name 700,000 times, in few ways).
    for spelled, count in Counter(_DECIDED_KEYS.findall(body)).items():
        seen[orjson.loads(spelled)] += count
    if all(count < 2 for count in seen.values()):
        return []
    # The exact check: the top-level object's names, and its `stream_options`' names,
    # with escapes decoded and repeats kept. Every object decodes to the tuple of its
    # pairs (`tuple` is called from C, and `{}` is the one empty tuple): a Python hook
    # per object cost about 4 us each, 3 s of the event loop for an 8 MiB body of
    # `{"model":1},` that any tenant may send. Safe from recursion limits: `_loads`
    # bounded the depth first. Lists and tuples are the collector's: it stays off.
    with no_collection(at_most(body)):
        top: tuple[tuple[str, Any], ...] = json.loads(body, object_pairs_hook=tuple)
    repeated = _repeated_names(top, _TOP_KEYS)
    options = [value for name, value in top if name == "stream_options"]
    if len(options) == 1 and isinstance(options[0], tuple):
        repeated += [f"stream_options.{n}" for n in _repeated_names(options[0], _OPTION_KEYS)]
    return repeated


def _repeated_names(pairs: tuple[tuple[str, Any], ...], names: tuple[str, ...]) -> list[str]:
    """The `names` that an object's `pairs` (as decoded, repeats kept) hold more than once."""
    counts = Counter(name for name, _ in pairs if name in names)
    return [n for n in names if counts[n] > 1]


# A body of at most this many strings is walked in Python (one step per string), which
# costs less than searching the whole body once per name and counting its brackets; one
# of more strings takes the searches.
_WALK_STRINGS: Final = 256
_NAMES: Final = frozenset(n.encode() for n in (*_TOP_KEYS, *_OPTION_KEYS))
_LONGEST_ESCAPED: Final = 6 * max(len(n) for n in _NAMES)  # each character as \\uXXXX
_SHORT_GAP: Final = 64  # bytes between two strings copied to be counted at the end


class BodyScan(NamedTuple):
    """What one walk of a body's strings found (`scan_body`)."""

    brackets: int  # `{` and `[` outside strings: no deeper nesting is possible
    commas: int  # `,` outside strings (with the brackets, no more values); -1: not counted
    once: bool  # no decided-on name is written twice, in any spelling
    digits: bool = True  # 19 digits in a row outside strings (body_integers.py)
    colons: int = -1  # `:` outside strings: the body's members (body_names.py)


def scan_body(body: bytes) -> BodyScan | None:
    """Walk the strings of `body`; None when it has more than `_WALK_STRINGS` (or a
    string that does not end). Exact for a valid JSON text: outside its strings it has
    no quote and no backslash, so each quote there opens a string. For any other text,
    orjson refuses it whatever the scan says.

    `once` is False when a name appears twice (as a key or as a value) or when a short
    string has an escape (it may spell a name): the exact check decides then."""
    seen: set[bytes] = set()
    # The short stretches between strings (`":"`, `",["`...) are gathered and counted in
    # one piece at the end: two or three counts per string cost more than the copy.
    gaps: list[bytes] = []
    brackets, commas, colons, once, end = 0, 0, 0, True, -1
    digits = False
    # Commas too (`held_bound`): in the gathered stretches always (one count), in the
    # long ones only in a long body (below it, one pass over the body costs less than a
    # count per long stretch: `held_bound` takes it when `commas` is -1).
    outside = len(body) >= _COUNT_OUTSIDE
    counted = True
    escapes = body.find(b"\\") >= 0  # else no string has one: no search per string
    quotes = body  # where each quote found ends a string (`_quotes_ending_strings`)
    for _ in range(_WALK_STRINGS):
        start = quotes.find(b'"', end + 1)
        if start < 0:
            break
        if start - end > _SHORT_GAP:  # counted where it is: copies stay small
            brackets += _brackets(body, end + 1, start)
            colons += body.count(b":", end + 1, start)
            if outside:
                commas += body.count(b",", end + 1, start)
            else:
                counted = False
            digits = digits or long_digit_run(body, end + 1, start)
        else:
            gaps.append(body[end + 1 : start])
        end = quotes.find(b'"', start + 1)
        if end > 0 and quotes[end - 1] == 0x5C:  # perhaps a `\\"` inside the string
            if quotes is body:
                quotes = _quotes_ending_strings(body)
            end = quotes.find(b'"', start + 1)
        if end < 0:
            return None
        if not once or end - start - 1 > _LONGEST_ESCAPED:
            continue  # longer than any name, however escaped: neither copied nor hashed
        text = body[start + 1 : end]
        if text in _NAMES:
            once = text not in seen
            seen.add(text)
        elif escapes and text.find(b"\\") >= 0:  # not `in`: it first tries an int (see find)
            once = False  # perhaps a name spelled with escapes
    else:
        if body.find(b'"', end + 1) >= 0:
            return None  # more strings than walked
    size = len(body)
    between = b"".join(gaps)
    brackets += _brackets(body, end + 1, size) + _brackets(between, 0, len(between))
    colons += body.count(b":", end + 1, size) + between.count(b":")
    if counted:
        commas += body.count(b",", end + 1, size) + between.count(b",")
    # (the gaps joined may put two digit runs together: the exact check then decides)
    digits = digits or long_digit_run(body, end + 1, size) or long_digit_run(between)
    return BodyScan(brackets, commas if counted else -1, once, digits, colons)


def _brackets(body: bytes, start: int, end: int) -> int:
    return body.count(b"{", start, end) + body.count(b"[", start, end)


def _no_name_twice(body: bytes) -> bool:
    """True when no decided-on name is written twice anywhere in `body` (a valid JSON
    text), as a key or as a value, in any spelling; False when one may be."""
    scan = scan_body(body)
    return _searched_once(body) if scan is None else scan.once


def _searched_once(body: bytes) -> bool:
    """`_no_name_twice` by searching the whole body once per name and for escapes."""
    return b"\\u" not in body and all(body.count(q) < 2 for q in _QUOTED)


def _quotes_ending_strings(body: bytes) -> bytes:
    """`body` with each escaped backslash and escaped quote (`\\\\`, `\\"`) overwritten
    by two `_`, in two C passes: every quote left starts or ends a string, at the same
    offset as in `body` (a valid JSON text). Each run of backslashes in a string begins
    with an escape, and `replace` pairs them from the left as JSON does. Finding a
    string's end a quote at a time, each looked back on for the backslashes before it,
    took a Python loop turn per escaped quote: 2.6 s of the event loop for an 8 MiB body
    of `\\"`, which a prompt quoting JSON is made of."""
    return body.replace(b"\\\\", b"__").replace(b'\\"', b"__")


def _check_stream_fields(doc: dict[str, Any]) -> None:
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise GatewayError(
            ErrorCode.invalid_request, "`stream` must be true, false or null", param="stream"
        )
    options = doc.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise GatewayError(
            ErrorCode.invalid_request,
            "`stream_options` must be an object or null",
            param="stream_options",
        )
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise GatewayError(
            ErrorCode.invalid_request,
            "`stream_options.include_usage` must be true, false or null",
            param="stream_options.include_usage",
        )
