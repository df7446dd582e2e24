"""Structured logging: structlog, JSON in production, readable in the demo, redacted last.

The gateway never logs prompts, outputs, API keys or auth headers. Call sites only pass
metadata; `redact` is the last processor before rendering and is the safety net: it
drops fields whose names mean content or secrets and masks bearer tokens and owngate
keys wherever they appear in a string.

It also keeps a string that someone outside chose (a backend's or a witness's words in a
failure, an exception's message) from being written verbatim: every string value is cut
to `MAX_FIELD_CHARS` (a traceback to `MAX_EXCEPTION_CHARS`) and every character that is
not printable (line breaks, terminal escapes, bidi overrides, other invisibles) is
written as its Python escape (`\\n`, `\\x1b`, `\\u202e`), in the JSON and the console
format alike, so one line of the log is one event and shows what it holds. A traceback
keeps its line breaks (the console format prints it as lines), every line after its first
indented, so no line of it can pass for an event of its own, and says where an exception
happened, never what its message said (a message may quote the request: a prompt, a
header, a model name): each exception's last line is its class and its message's length
(gateway/log_tracebacks.py). The stdlib handler's lines (uvicorn, libraries) get the same
treatment.

The names are treated as the values are: a key of a logged dict, at any depth, and a
field's own name are written as strings (an int key as its digits: orjson refuses any
other), cut to `MAX_KEY_CHARS` and escaped. The whole of one event's strings, keys
included, is bounded by `MAX_EVENT_CHARS` (a traceback apart): a dict or a list keeps the
items that fit, then says how many more there were, and one nested deeper than
`MAX_DEPTH` is written as a note of its size. What is not a string, a number, a bool,
None, a dict, a list, a tuple or a set (bytes, an exception, any object) is written as its
`repr`, cut and escaped like a string; an integer past 64 bits as a note of its size (the
JSON encoder raises on both, so the line, and the call that logged it, would fail).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Final, Literal, TextIO

import orjson
import structlog

from gateway.log_remote_words import QuietRemoteWords
from gateway.log_tracebacks import message_without_exception, traceback_without_messages

__all__ = [
    "MAX_DEPTH",
    "MAX_EVENT_CHARS",
    "MAX_EXCEPTION_CHARS",
    "MAX_FIELD_CHARS",
    "MAX_KEY_CHARS",
    "SENSITIVE_FIELDS",
    "configure_logging",
    "get_logger",
    "redact",
]

SENSITIVE_FIELDS = frozenset(
    {
        "authorization",
        "api_key",
        "key",
        "password",
        "secret",
        "token",
        "headers",
        "body",
        "prompt",
        "messages",
        "input",
        "content",
        "completion",
        "output",
        "choices",
    }
)

MAX_FIELD_CHARS = 4096
"""The characters of one string value a log line keeps; the rest is cut, and counted."""
MAX_EXCEPTION_CHARS = 32768
"""The characters of a traceback (`exception`) a log line keeps."""
MAX_KEY_CHARS = 128
"""The characters of one name (a field's, or a key of a logged dict at any depth) kept."""
MAX_EVENT_CHARS = 16 * MAX_FIELD_CHARS
"""About the characters one event's fields take in a line (names and values, the traceback
apart; each string counted with its quotes and separator, any other value as the 24 the
longest number takes): past them, strings are cut to nothing and containers to a count."""
MAX_DEPTH = 8
"""How deep in nested dicts and lists a log line goes; deeper ones are counted, not shown."""
_INT_RANGE = range(-(2**63), 2**64)  # what orjson encodes; it raises on any other int
_SCALAR_CHARS = 24  # the most a number writes (-1.2345678901234567e-308); bool, None less

_SECRET_PATTERN = re.compile(
    r"(?i)((?:bearer|basic)\s+)\S+|\bog-[A-Za-z0-9_-]{8,}|\bsk-[A-Za-z0-9_-]{8,}"
)
# What the (case-insensitive) pattern can match starts with one of these, in lowercase.
_SECRET_HINTS = ("bearer", "basic", "og-", "sk-")
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# The fields every line has, added by the logging pipeline itself.
_OWN_FIELDS: Final = ("event", "level", "timestamp", "logger")
# Fields every line of this process carries (`bind_process`: a worker's index).
_PROCESS: dict[str, Any] = {}


def bind_process(**fields: Any) -> None:
    """Fields every later log line of this process carries: from any thread, and through
    stdlib logging (uvicorn's error log). structlog's contextvars reach neither."""
    _PROCESS.update(fields)


def _process_fields(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Any:
    for name, value in _PROCESS.items():
        event.setdefault(name, value)
    return event


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    budget = [MAX_EVENT_CHARS]
    names = list(event)
    # The line's own fields (structlog adds them after the caller's) are scrubbed first, so
    # a caller's large fields use up the budget after them, never them.
    own = {name: _scrub(name, event[name], budget, 0) for name in _OWN_FIELDS if name in event}
    if all(type(name) is str and _plain_key(name) for name in names):
        for name in names:
            event[name] = own[name] if name in own else _scrub(name, event[name], budget, 0)
        return event
    # A name nobody wrote in a call (a dict spread into the call): rebuilt, order kept.
    fields = [(name, event[name]) for name in names]
    event.clear()
    for name, value in fields:
        if type(name) is str and name in own:
            event[name] = own[name]
            continue
        raw = _name(name)
        shown = _key(raw, budget)
        if shown in event:  # the same once cut or escaped: both kept
            shown = f"{shown}#{len(event)}"
        event[shown] = _scrub(raw, value, budget, 0)
    return event


def _sensitive_name(name: str) -> bool:
    lowered = name.lower().replace("-", "_")
    return (
        lowered in SENSITIVE_FIELDS
        or lowered.endswith(("key", "secret", "password", "_token", "authorization"))
        or lowered in ("token", "auth", "cookie", "set_cookie")
    )


def _plain_key(name: str) -> bool:
    return len(name) <= MAX_KEY_CHARS and name.isprintable()


def _name(key: Any) -> str:
    """A dict key as a string (an int as its digits, anything else but a str its repr):
    what its sensitivity is judged on, whole, before `_key` cuts it."""
    if type(key) is str:
        return key
    if isinstance(key, int):  # str() raises past 4,300 digits
        return str(key) if key in _INT_RANGE else f"[an integer of {key.bit_length()} bits]"
    return repr(key)


def _key(name: str, budget: list[int]) -> str:
    """A dict key or field name (`_name`) as a line writes it: cut and escaped."""
    if not _plain_key(name):
        name = _plain(name, MAX_KEY_CHARS)
    budget[0] -= len(name) + 4  # quotes, colon, separator
    return name


def _scrub(name: str, value: Any, budget: list[int], depth: int) -> Any:
    if _sensitive_name(name):
        return "[redacted]"
    if isinstance(value, str):
        lowered = value.lower()
        if any(hint in lowered for hint in _SECRET_HINTS):
            value = _SECRET_PATTERN.sub(_mask, value)
        if name == "exception" and depth == 0:  # format_exc_info's traceback
            return _plain(value, MAX_EXCEPTION_CHARS, lines=True)
        text = _plain(value, max(0, min(MAX_FIELD_CHARS, budget[0])))
        budget[0] -= len(text) + 3  # quotes, separator
        return text
    budget[0] -= _SCALAR_CHARS
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        return value if value in _INT_RANGE else f"[an integer of {value.bit_length()} bits]"
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"[a dict of {len(value)} items, nested too deep]"
        out: dict[str, Any] = {}
        for count, (key, item) in enumerate(value.items()):
            if budget[0] <= 0:
                out["..."] = f"[{len(value) - count} more items]"
                break
            raw = _name(key)
            shown = _key(raw, budget)
            if shown in out:  # the same once cut or escaped (1 and "1"): both kept
                shown = f"{shown}#{count}"
            out[shown] = _scrub(raw, item, budget, depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        if depth >= MAX_DEPTH:
            return f"[{len(value)} items, nested too deep]"
        items: list[Any] = []
        for count, item in enumerate(value):
            if budget[0] <= 0:
                items.append(f"...[{len(value) - count} more items]")
                break
            items.append(_scrub("", item, budget, depth + 1))
        return items
    # bytes, an exception, any object: its repr, as the renderers would write it, bounded
    return _scrub(name, repr(value), budget, depth)


def _mask(match: re.Match[str]) -> str:
    return (match.group(1) or "") + "[redacted]"


def _plain(text: str, limit: int = MAX_FIELD_CHARS, *, lines: bool = False) -> str:
    """`text` as a log writes it: at most `limit` characters (then how many were cut),
    every character that is not printable written as its Python escape (`lines`: line
    breaks kept, as in a traceback, each line after the first indented). Printable text
    of up to `limit` characters, what nearly every value is, comes back as it is after
    two C-speed checks."""
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(
            char
            if char.isprintable() or (lines and char == "\n")
            else char.encode("unicode_escape").decode("ascii")
            for char in text
        )
    if lines:  # no line of a traceback can pass for a log line of its own
        text = text.replace("\n", "\n  ")
    return text + f"...[{cut} more characters]" if cut > 0 else text


# uvicorn's loggers: its default `log_config` (any `uvicorn.Config` made without
# `log_config=None`) gives them stderr handlers and stops them propagating, which would
# write their lines (a request's path among them) past the masking handler.
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(
    fmt: Literal["json", "console"] = "json",
    level: str = "info",
    stream: TextIO | None = None,
) -> None:
    """Configure structlog for this process (the CLI calls it once at start)."""
    out = stream or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _process_fields,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.ExceptionRenderer(_traceback),
        redact,
    ]
    factory: Any
    _install_access_log(fmt, level, out)
    if fmt == "json":
        binary = getattr(out, "buffer", None)
        if binary is not None:  # a real file: write orjson's bytes straight through
            renderer = structlog.processors.JSONRenderer(serializer=orjson.dumps)
            factory = structlog.BytesLoggerFactory(binary)
        else:
            renderer = structlog.processors.JSONRenderer(serializer=_dumps_text)
            factory = structlog.PrintLoggerFactory(out)
        processors = [*shared, renderer]
    else:
        processors = [*shared, structlog.dev.ConsoleRenderer(colors=False)]
        factory = structlog.PrintLoggerFactory(out)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    # Libraries that log through stdlib (uvicorn's error log) get the same masking, and
    # the same JSON lines in production.
    handler = logging.StreamHandler(out)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _RedactingFormatter())
    handler.addFilter(QuietRemoteWords())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    for name in _UVICORN_LOGGERS:  # uvicorn's own dictConfig gives them unmasked handlers
        claimed = logging.getLogger(name)
        claimed.handlers[:] = []
        claimed.propagate, claimed.disabled = True, False


def _install_access_log(fmt: str, level: str, out: TextIO) -> None:
    """The JSON access line gets its own encoder and writer (gateway/access_log.py); the
    console format (the demo) and levels above info leave it to structlog."""
    from gateway import access_log  # it builds on this module's `redact`

    writer = None
    if fmt == "json" and _LEVELS[level] <= logging.INFO:
        binary = getattr(out, "buffer", None)
        if binary is not None:
            writer = access_log.AccessLog(binary.write, binary.flush)
        else:
            writer = access_log.AccessLog(lambda line: out.write(line.decode()), out.flush)
    access_log.install(writer)


def _traceback(exc_info: Any) -> str:
    """structlog's `exc_info` (a triple) as `traceback_without_messages` writes it."""
    return "NoneType: None" if exc_info[1] is None else traceback_without_messages(exc_info[1])


class _WithheldFormatter(logging.Formatter):
    """A stdlib formatter whose tracebacks withhold exceptions' messages, as does the
    line's own message where it repeats the exception (asyncio's task `repr`)."""

    def formatException(self, ei: Any) -> str:  # the stdlib's name
        return _traceback(ei)

    def message(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            message = message_without_exception(message, exc)
        return _plain(_SECRET_PATTERN.sub(_mask, message))


class _RedactingFormatter(_WithheldFormatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname} {record.name}: {self.message(record)}"
        if record.exc_info:
            trace = _SECRET_PATTERN.sub(_mask, self.formatException(record.exc_info))
            line += "\n" + _plain(trace, MAX_EXCEPTION_CHARS, lines=True)
        return line


class _JsonFormatter(_WithheldFormatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "event": self.message(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            **_PROCESS,
        }
        if record.exc_info:
            trace = _SECRET_PATTERN.sub(_mask, self.formatException(record.exc_info))
            entry["exception"] = _plain(trace, MAX_EXCEPTION_CHARS, lines=True)
        return orjson.dumps(entry).decode()


def _dumps_text(obj: Any, **kw: Any) -> str:
    return orjson.dumps(obj, **kw).decode()  # kw: structlog's `default` (repr)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
