"""Text from an artefact under audit, made safe to show: `shown` and `quoted`.

Receipts, records, checkpoints, signed-note lines, cosignatures and sidecar statements are
written by the party being audited. What `owngate audit` prints of them (a request id, an
origin, key and witness names, a backend id, a failure naming a field) must not be able to
drive the auditor's terminal or rewrite a report: an ESC sequence that hides a line or
moves the cursor, a carriage return or a line end followed by a forged `ok:` line, a
bidirectional override that reorders what is read, a line or paragraph separator.

`shown(value)` escapes every character that is not printable (`str.isprintable`: the C0
and C1 controls, DEL, format characters such as U+202E and U+200B, U+2028 and U+2029,
spaces other than the ASCII space, surrogates, private-use and unassigned code points) the
way Python writes them in a literal (`\\x1b`, `\\u202e`), and bounds the result to
`limit` characters, saying how many were left out. The result is one line of printable
text (a backslash is left as it is: text that only looks like an escape moves nothing).
JSON output needs none of this: the encoder escapes (`json.dumps`, ASCII by default).
"""

from __future__ import annotations

__all__ = ["MAX_SHOWN", "MAX_SHOWN_MESSAGE", "quoted", "shown"]

MAX_SHOWN = 200  # a name, an id, an origin: owngate's own are far shorter
MAX_SHOWN_MESSAGE = 2000  # a whole failure message, which may quote a few of them


def _escape(char: str) -> str:
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(value: object, limit: int | None = MAX_SHOWN) -> str:
    """`value` as one line of printable text, at most `limit` characters (None: no bound)
    plus a note of how many characters of `value` were left out."""
    text = value if isinstance(value, str) else str(value)
    if limit is None:
        return "".join(_escape(char) for char in text)
    pieces: list[str] = []
    length = 0
    for used, char in enumerate(text):
        piece = _escape(char)
        if length + len(piece) > limit:
            return "".join(pieces) + f"...[{len(text) - used} more characters]"
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)


def quoted(value: object, limit: int | None = MAX_SHOWN) -> str:
    """`shown(value)` between single quotes, a quote in it escaped: where it ends is
    plain to see."""
    return "'" + shown(value, limit).replace("'", "\\'") + "'"
