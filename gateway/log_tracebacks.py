"""A traceback as a log writes it: where an exception happened, never what it said.

An exception's message is data, and often the request's: `KeyError('<the prompt>')`,
`invalid literal for int() with base 10: '<a header>'`, a `GatewayError` naming the
client's model, a library quoting the bytes it could not parse. Written into a log it
would put client input there, verbatim but for the escaping `gateway.logs` does. The
stack is the code's own: its files, line numbers, function names and source lines say
where the fault is, which is what an operator needs from a traceback.

`traceback_without_messages` writes Python's traceback of an exception (its causes and
contexts first, as Python does, and the members of an exception group after it) with
every exception's last line cut to its class and how long its message was, e.g.
`KeyError: [message withheld: 18 characters]`; notes added to it (`add_note`) are
counted, not shown. What the operating system said is the gateway's side, never the
request's, and is kept: an `OSError` of Python's own classes (FileNotFoundError,
PermissionError, ConnectionResetError, ...) whose errno is one the OS defines reads
`OSError: [Errno 28 ENOSPC] No space left on device [message withheld: ...]`, its name
and text made from the number alone (the text the exception carries, and the file names
in it, stay withheld); an `ssl.SSLError` keeps OpenSSL's library and reason codes
(`[SSL: CERTIFICATE_VERIFY_FAILED]`). Local variables are never part of it (Python's default, kept).
`gateway.logs` uses it for every traceback it writes: structlog's `exc_info` and the
stdlib handler's (uvicorn's "Exception in ASGI application", asyncio, libraries).

A stdlib line's own message may repeat the exception it carries: asyncio's "Task
exception was never retrieved" names the task as `<Task finished ... exception=
KeyError('<the prompt>')>`. `message_without_exception` takes its `repr` (and its text,
when that is long enough not to be an ordinary word of the message) out of it.
"""

from __future__ import annotations

import errno
import os
import re
import ssl
import traceback
from typing import Final

__all__ = ["MAX_EXCEPTIONS", "message_without_exception", "traceback_without_messages"]

MAX_EXCEPTIONS: Final = 32
"""The exceptions one traceback shows (a chain of causes, the members of groups); more are
counted, not shown."""
_OPENSSL_CODE: Final = re.compile(r"[A-Z0-9_]{1,64}\Z")
"""What an OpenSSL library or reason code is (`SSL`, `CERTIFICATE_VERIFY_FAILED`)."""
_QUOTED_CHARS: Final = 8
"""Shorter texts of an exception (`'x'`, `42`) are left in a message: replacing them
would garble its own words, and they quote too little to matter."""


def traceback_without_messages(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it, every exception's message withheld."""
    out: list[str] = []
    shown: set[int] = set()
    _exception(exc, out, shown)
    return "".join(out).rstrip("\n")


def message_without_exception(message: str, exc: BaseException) -> str:
    """`message` (a stdlib log line's) with `exc`'s `repr`, and its text if at least
    `_QUOTED_CHARS` long, replaced by `[<its class>: message withheld]`."""
    name = type(exc).__qualname__
    try:
        said = [repr(exc), str(exc)]
    except Exception:  # noqa: BLE001 - its __str__ failed: nothing of it can be in message
        return message
    for text in said:
        if len(text) >= _QUOTED_CHARS and text in message:
            message = message.replace(text, f"[{name}: message withheld]")
    return message


def _exception(exc: BaseException, out: list[str], shown: set[int]) -> None:
    shown.add(id(exc))
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and _room(cause, out, shown):
        _exception(cause, out, shown)
        out.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif context is not None and not exc.__suppress_context__ and _room(context, out, shown):
        _exception(context, out, shown)
        out.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if exc.__traceback__ is not None:
        out.append("Traceback (most recent call last):\n")
        out.extend(traceback.format_tb(exc.__traceback__))
    out.append(_last_line(exc) + "\n")
    if isinstance(exc, BaseExceptionGroup):
        members = exc.exceptions
        for number, member in enumerate(members, 1):
            if id(member) in shown:  # the same exception twice: shown once
                continue
            if not _room(member, out, shown):
                out.append(f"[{len(members) - number + 1} more exceptions of the group]\n")
                break
            out.append(f"\n[exception {number} of {len(members)} in the group]\n")
            _exception(member, out, shown)


def _room(exc: BaseException, out: list[str], shown: set[int]) -> bool:
    """Whether `exc` is shown: not shown already (a cycle), and within `MAX_EXCEPTIONS`
    (else a line says there were more)."""
    if id(exc) in shown:
        return False
    if len(shown) >= MAX_EXCEPTIONS:
        out.append(f"[more exceptions: {MAX_EXCEPTIONS} shown]\n")
        return False
    return True


def _last_line(exc: BaseException) -> str:
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    try:
        length = len(str(exc))
    except Exception:  # noqa: BLE001 - its __str__ failed; Python's own traceback says so too
        return f"{name}: [message unprintable]"
    said = _system_said(exc)
    line = f"{name}: {said}" if said else name
    if length:
        line += f"{' ' if said else ': '}[message withheld: {length} characters]"
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, (list, tuple)) and notes:
        line += f" [{len(notes)} notes withheld]"
    return line


def _system_said(exc: BaseException) -> str:
    """What the OS (or OpenSSL) said of `exc`, from its codes alone, or "": `[Errno 5
    EIO] Input/output error` for an OSError of Python's own classes with an errno the OS
    defines (another module's subclass may number something else: socket.gaierror's EAI
    codes, ssl's), `[SSL: REASON]` for an SSLError."""
    if isinstance(exc, ssl.SSLError):
        codes = [code for code in (exc.library, exc.reason) if code is not None]
        if codes and all(isinstance(code, str) and _OPENSSL_CODE.match(code) for code in codes):
            return f"[{': '.join(codes)}]"
        return ""
    if not isinstance(exc, OSError) or type(exc).__module__ != "builtins":
        return ""
    number = exc.errno
    if type(number) is not int or number not in errno.errorcode:
        return ""
    return f"[Errno {number} {errno.errorcode[number]}] {os.strerror(number)}"
