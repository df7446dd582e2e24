"""Whether `json.loads` refuses a JSON document for its text, told without building it: for
a whole answer past the bounds the gateway parses within (`usage_read.PastBounds`), whose
verdict must still be the one a smaller answer gets (`answer_reads.check_readable`).

A parse of a document of millions of arrays and objects builds as many Python objects
(a 15 MiB `[],[],...`: 510 MB, the reason for `usage_read.MAX_CONTAINERS`); this scan
builds none. It reads the standard library's grammar (strict: no control character in a
string; `NaN`, `Infinity`, `-Infinity` and numbers of any size read, but an integer of more
digits than `int` converts, 4,300; only ASCII digits; ` \t\n\r` the only whitespace;
nothing but whitespace after the value) with regular expressions of possessive repeats
that take a run of values nested no deeper than `_FLAT` in one match, and a loop with a
stack (a `bytearray`, a byte a level) for what is nested deeper or longer: runs of `[`
and of closing brackets are one step each. Its text is
checked as UTF-8 (lone surrogates allowed, as `json.loads(bytes)` decodes) a chunk at a
time. It does not judge depth: a document nested deeper than the client's stack is left
to the caller (`PastBounds` already says the client may or may not read it).

Bounded: each match takes at most `_RUN_LENGTH` values of at most `_NESTED_LENGTH`
elements in each of their arrays and objects (a few ms: a call into the expression
engine never lets go of the interpreter, and `answer_reads.Unscanned.scanned` runs the
scan in a worker thread; a string is taken whole, so the escapes of a text holding over
`_FEW_ESCAPES` are read apart first, `_unescaped`), no byte is read by more than four
matches (those starting at it and at its two nearest enclosing arrays or objects), and
the loop takes at most
`MAX_STEPS` steps, or one for each `_BYTES_A_STEP` bytes of a longer document, past which
the document is `Unchecked`. Measured on the 2-core test machine: 16 MiB of `[],[],...`
or of `{"a":{}},...`, 0.5 s; `[` 8 million times then as many `]`, 0.4 s; `MAX_STEPS`
steps, some 0.5 s; 16 MiB of `[[[0]]],...` given up on after its 2 million steps, 1.4 s;
the slowest found, 16 MiB of arrays of 17 arrays of 17 numbers, 2.2 s.
Only a document built to hold many structures deeper than `_FLAT` or longer than
`_NESTED_LENGTH` apart from each other takes that many (an answer with logprobs of one
alternative a token takes a step for 12 to 19 bytes).
"""

from __future__ import annotations

import codecs
import re
import sys
from functools import cache
from typing import Final, NamedTuple

__all__ = ["MAX_STEPS", "Unchecked", "refused"]

# Steps of the loop (each a match or two of the expressions below) a document may take:
# `MAX_STEPS`, or one for each `_BYTES_A_STEP` bytes of a longer one. An answer with
# logprobs of one alternative a token takes a step for 12 to 19 bytes: one of 60,000
# tokens (7.5 MB, 480,000 steps) was a failed attempt under the fixed bound alone.
MAX_STEPS: Final = 1 << 18
_BYTES_A_STEP: Final = 8
_FLAT: Final = 2  # arrays and objects, one in another, that one match takes
_UTF8_CHUNK: Final = 1 << 20  # bytes decoded at a time (at most 4 MiB of text held)
_RUN_OF_BRACKETS: Final = 1 << 16  # `[` or closing brackets in a row one step takes
# Values a step's match takes: at most `_RUN_LENGTH` in a row, each holding at most
# `_NESTED_LENGTH` in each of its arrays and objects (a longer one is read by the loop), so
# that one match (a call that never lets go of the interpreter) takes a few ms at most.
_RUN_LENGTH: Final = 256
_NESTED_LENGTH: Final = 16

_WS: Final = rb"[ \t\n\r]*+"
_ESCAPE: Final = rb'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})'
# Backslashes past which a text's escapes are read apart (`_unescaped`), and the pieces
# (runs of text, escapes) one match of those takes: some 5 ms of the expression engine.
_FEW_ESCAPES: Final = 1 << 16
_ESCAPES: Final = 1 << 16
_STR: Final = rb'"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"'
# An integer of more digits than `int` converts (`sys.get_int_max_str_digits`, 4,300 by
# default) is refused by `json.loads` (a ValueError), a number with a fraction or an
# exponent of any length read (as a float): the long digits only before one of those.
_INT_DIGITS: Final = sys.get_int_max_str_digits()
_LONG_INT: Final = rb"[1-9][0-9]*+(?=\.[0-9]|[eE][-+]?+[0-9])"
_INT: Final = (
    rb"(?:0|[1-9][0-9]{0,%d}+(?![0-9])|" % (_INT_DIGITS - 1) + _LONG_INT + rb")"
    if _INT_DIGITS
    else rb"(?:0|[1-9][0-9]*+)"
)
_DIGITS: Final = _INT + rb"(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+"
# Each alternative opens with its own character, which the engine tests first.
_SCALAR: Final = (
    rb"(?:"
    + _STR
    + rb"|-(?:"
    + _DIGITS
    + rb"|Infinity)|"
    + _DIGITS
    + rb"|true|false|null|NaN|Infinity)"
)


def _nested(depth: int) -> bytes:
    """A value holding arrays and objects nested at most `depth` deep (each element
    followed by a comma that is not the last, or by the closing bracket: written once)."""
    if depth == 0:
        return _SCALAR
    inner = _nested(depth - 1)
    at_most = b"{0,%d}+" % _NESTED_LENGTH
    element = rb"(?!\])" + inner + _WS + rb"(?:," + _WS + rb"(?!\])|(?=\]))"
    array = rb"\[" + _WS + rb"(?:" + element + rb")" + at_most + rb"\]"
    pair = _STR + _WS + rb":" + _WS + inner + _WS + rb"(?:," + _WS + rb"(?!\})|(?=\}))"
    obj = rb"\{" + _WS + rb"(?:" + pair + rb")" + at_most + rb"\}"
    return rb"(?:" + array + rb"|" + obj + rb"|" + _SCALAR + rb")"  # brackets first: faster


class _Expressions(NamedTuple):
    one: re.Pattern[bytes]  # a value nested at most `_FLAT` deep, whitespace after it
    run: re.Pattern[bytes]  # such values, a comma between each two
    pairs: re.Pattern[bytes]  # an object's members holding such values
    key: re.Pattern[bytes]  # a member's name and colon
    open: re.Pattern[bytes]  # `[` any times, then `{` or not (group 1)
    close: re.Pattern[bytes]  # closing brackets, one or more
    space: re.Pattern[bytes]
    escapes: re.Pattern[bytes]  # text and valid escapes, at most `_ESCAPES` of each
    escape: re.Pattern[bytes]  # one valid escape


@cache
def _expressions() -> _Expressions:
    """The scan's expressions, compiled when the first document past the bounds comes (some
    20 ms: not at import, nor for a process that never meets one)."""
    value = _nested(_FLAT) + _WS
    pair = _STR + _WS + rb":" + _WS + value
    bounded = b"{%%d,%d}+" % _RUN_OF_BRACKETS  # (a stack of a byte a level, no copy of it)
    more = b"{0,%d}+" % (_RUN_LENGTH - 1)
    return _Expressions(
        one=re.compile(value),
        run=re.compile(value + rb"(?:," + _WS + value + rb")" + more),
        pairs=re.compile(pair + rb"(?:," + _WS + pair + rb")" + more),
        key=re.compile(_STR + _WS + rb":" + _WS),
        open=re.compile(rb"(?:\[" + _WS + rb")" + bounded % 0 + rb"(\{" + _WS + rb")?+"),
        close=re.compile(rb"(?:[\]}]" + _WS + rb")" + bounded % 1),
        space=re.compile(_WS),
        escapes=re.compile(rb"(?:[^\\]++|" + _ESCAPE + rb"){1,%d}+" % _ESCAPES),
        escape=re.compile(_ESCAPE),
    )


_OPENER: Final = bytes.maketrans(b"]}", b"[{")

# What the loop expects next.
_TOP, _ARRAY_FIRST, _ARRAY_NEXT, _OBJECT_FIRST, _OBJECT_NEXT, _MEMBER, _AFTER = range(7)


class Unchecked(ValueError):
    """A document the scan gave up on within `MAX_STEPS`: whether it parses is unknown."""


def refused(text: bytes) -> bool:
    """Whether `json.loads` refuses `text` (UTF-8) for anything but its depth; `Unchecked`
    past `MAX_STEPS`. Builds no value: its memory is the text's depth, a byte a level (and
    a copy of the text where it holds over `_FEW_ESCAPES` backslashes: `_unescaped`)."""
    if not _utf8(text):
        return True
    steps = max(MAX_STEPS, len(text) // _BYTES_A_STEP)
    if text.count(b"\\") > _FEW_ESCAPES:
        unescaped = _unescaped(text)
        return unescaped is None or not _grammatical(unescaped, steps)
    return not _grammatical(text, steps)


def _unescaped(text: bytes) -> bytearray | None:
    """`text` with each escape made an `x`, told a few thousand escapes at a time; None
    where a backslash opens no valid escape (`json.loads` refuses it, in a string or out).

    A match of the expressions takes a string whole, each escape a turn of the expression
    engine (16 MiB of `\\/` held the interpreter 0.59 s in one match): the escapes are
    read here in bounded matches instead, left to right as in a string (a backslash is
    nowhere else valid), and the grammar reads the copy, whose verdict is the text's: an
    `x` stands where a character of a string stood, and one where the text's backslash
    stood outside a string is refused as it was."""
    ex = _expressions()
    copy = bytearray()
    pos, end = 0, len(text)
    while pos < end:
        found = ex.escapes.match(text, pos)
        if found is None or found.end() == pos:
            return None
        copy += ex.escape.sub(b"x", text[pos : found.end()])
        pos = found.end()
    return copy  # (not copied again: the expressions read a bytearray as bytes)


def _utf8(text: bytes) -> bool:
    """Whether `text` decodes as UTF-8 with lone surrogates passed, a chunk at a time."""
    if text.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    try:
        for start in range(0, len(text), _UTF8_CHUNK):
            decoder.decode(text[start : start + _UTF8_CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _grammatical(text: bytes | bytearray, steps: int) -> bool:
    """Whether `text` is one JSON value between whitespace (the module's text), told
    within `steps` steps."""
    ex = _expressions()
    stack = bytearray()  # the open arrays and objects: `[` or `{` each
    pos = _past_space(ex, text, 0)
    state = _TOP
    end = len(text)
    for _ in range(steps):
        if state == _AFTER:
            if not stack:
                return pos == end
            if text[pos : pos + 1] == b",":
                pos = _past_space(ex, text, pos + 1)
                state = _ARRAY_NEXT if stack[-1] == ord("[") else _OBJECT_NEXT
                continue
            closing = ex.close.match(text, pos)
            if closing is None:
                return False
            closers = text[pos : closing.end()].translate(None, b" \t\n\r")
            if (
                len(closers) > len(stack)
                or stack[-len(closers) :] != closers.translate(_OPENER)[::-1]
            ):
                return False
            del stack[-len(closers) :]
            pos = closing.end()
            continue
        if state in (_OBJECT_FIRST, _OBJECT_NEXT):
            found = ex.pairs.match(text, pos)
            if found is not None:
                pos, state = found.end(), _AFTER
                continue
            if state == _OBJECT_FIRST and text[pos : pos + 1] == b"}":
                stack.pop()
                pos, state = _past_space(ex, text, pos + 1), _AFTER
                continue
            key = ex.key.match(text, pos)
            if key is None:
                return False
            pos, state = key.end(), _MEMBER
            continue
        # a value: one (at the top, an object's member) or a run of them (an array's)
        found = (ex.run if state in (_ARRAY_FIRST, _ARRAY_NEXT) else ex.one).match(text, pos)
        if found is not None:
            pos, state = found.end(), _AFTER
            continue
        if state == _ARRAY_FIRST and text[pos : pos + 1] == b"]":
            stack.pop()
            pos, state = _past_space(ex, text, pos + 1), _AFTER
            continue
        opened = ex.open.match(text, pos)
        if opened is None or opened.end() == pos:
            return False
        stack += b"[" * text.count(b"[", pos, opened.end())
        pos = opened.end()
        if opened.start(1) >= 0:  # the run ends with an object
            stack.append(ord("{"))
            state = _OBJECT_FIRST
        else:
            state = _ARRAY_FIRST
    raise Unchecked(f"past {steps} steps of the syntax scan")


def _past_space(ex: _Expressions, text: bytes | bytearray, pos: int) -> int:
    """Where the whitespace at `pos` in `text` ends."""
    found = ex.space.match(text, pos)
    return pos if found is None else found.end()
