"""Library log lines that would say what the far side of a connection sent, or what a
signed request held, kept out of the gateway's log (the stdlib handler's filter,
installed by gateway/logs.py `configure_logging`): the info and debug lines of HTTP
client libraries and of the AWS SDK, the arguments of their warnings, and the strings an
OpenTelemetry exporter's line quotes."""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["AWS_SDK_LOGGERS", "EXPORTER_LOGGERS", "REMOTE_WORDS_LOGGERS", "QuietRemoteWords"]

# HTTP client libraries whose info and debug lines say what the far side sent: the OpenAI
# SDK (under LiteLLM) logs a hosted provider's `x-request-id` header as it came (`request_id:
# %s`), httpx (and httpx2, the SDK's own client) the status line's reason phrase, httpcore
# (httpcore2) and hpack every response header, urllib3 (under botocore's credential fetches
# and the OTLP/HTTP exporter) a redirect's `Location`. A provider, a collector, an AWS
# endpoint, or a backend that quotes a client's request, chooses those strings. Only these
# libraries' warnings and errors are written (`QuietRemoteWords`), and of those only the
# library's own words: urllib3's warnings quote the far side as their arguments (`Failed to
# parse headers (url=%s): %s` the header bytes it could not parse, `Certificate did not
# match expected hostname: %s. Certificate: %s` the peer's certificate, `Retrying (%r) after
# connection broken by '%r'` a status line it could not read; aiohttp's `aiohttp.internal`,
# under LiteLLM's calls to hosted providers, `Can not load cookies: Illegal cookie name %r`
# the name a far side's `Set-Cookie` gave, and its cookie jar's debug lines name cookies
# and hosts). A filter on the handler, not
# a logger level: `OPENAI_LOG=debug` sets the SDK's level when it is imported.
REMOTE_WORDS_LOGGERS: Final = (
    "openai",
    "anthropic",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "hpack",
    "urllib3",
    "aiohttp",
)

# The AWS SDK, which LiteLLM runs to sign a Bedrock (or SageMaker) call and to fetch its
# credentials. Its debug lines write what it signs and sends and what AWS answered:
# botocore's signer the whole canonical request once per call, the session token
# (`x-amz-security-token`) and the SHA-256 of the request body (an unsalted hash of the
# prompt) among its lines, then the signature; a credential fetch (STS, the container
# endpoint) its parameters and the answer, keys and all. Only its warnings and errors are
# written, as for the HTTP clients above.
AWS_SDK_LOGGERS: Final = ("botocore", "boto3")
_QUIET: Final = REMOTE_WORDS_LOGGERS + AWS_SDK_LOGGERS

# The OpenTelemetry exporters log the reason phrase the collector answered with as it came
# (`Failed to export span batch code: 401, reason: <phrase>`): a collector, or a proxy in
# front of it, that quotes the request puts the exporter's own headers there, the
# `OTEL_EXPORTER_OTLP_HEADERS` auth token included. The transport's exception says what
# the far side sent too: a garbled status line is `ConnectionError(('Connection
# aborted.', BadStatusLine('<its bytes>')))`, in that line and in `Transient error %s`.
# Every string such a line quotes is written as its length, an exception as its class
# and OS error number (`_exporter_arg`); its numbers and its own words are kept.
EXPORTER_LOGGERS: Final = ("opentelemetry.exporter",)
_EXPORTER_KINDS: Final = frozenset({"span", "spans", "metric", "metrics", "log", "logs"})
_CHAIN_LINKS: Final = 8  # causes looked through for an OS error number


class QuietRemoteWords(logging.Filter):
    """Drops the info and debug lines of `REMOTE_WORDS_LOGGERS` and `AWS_SDK_LOGGERS`
    (and their children) and writes each argument of their warnings as what it is, never
    what it says (`_withheld`); withholds the strings an `EXPORTER_LOGGERS` line quotes."""

    def filter(self, record: logging.LogRecord) -> bool:  # the stdlib's name
        name = record.name
        if name.startswith(EXPORTER_LOGGERS) and isinstance(record.args, tuple):
            record.args = tuple(_exporter_arg(arg) for arg in record.args)
        if not any(name == library or name.startswith(library + ".") for library in _QUIET):
            return True
        if record.levelno < logging.WARNING:
            return False
        record.msg, record.args = _library_words(record), ()
        return True


def _library_words(record: logging.LogRecord) -> str:
    """The line's format (the library's own words), what fills it `_withheld`."""
    if not isinstance(record.msg, str):  # `log.warning(exc)`: the object is the message
        return str(_withheld(record.msg))
    args = record.args
    if not args:
        return record.msg
    try:
        if isinstance(args, dict) and "%(" in record.msg:  # `%(name)s` formats
            return record.msg % {key: _withheld(arg) for key, arg in args.items()}
        if isinstance(args, dict):  # one dict argument (`logging` unwraps it): its keys too
            return record.msg % (_withheld(args),)
        return record.msg % tuple(_withheld(arg) for arg in args)
    except (TypeError, ValueError, KeyError):  # a format that wanted what was withheld
        return f"{record.msg} [its arguments withheld]"


def _withheld(arg: object) -> object:
    """A number as it is (a status code, a count, a pool size); anything else as its
    length or its class (`%r` of a `str` still formats it: a string comes back)."""
    if arg is None or isinstance(arg, (int, float)):
        return arg
    if isinstance(arg, (str, bytes, bytearray)):
        return f"[withheld: {len(arg)} {'characters' if isinstance(arg, str) else 'bytes'}]"
    return f"[withheld: {type(arg).__qualname__}]"


def _exporter_arg(arg: object) -> object:
    """A number and a batch kind as they are; an exception as its class and the first OS
    error number along its chain (`_exception_kind`); any other argument `_withheld`."""
    if isinstance(arg, BaseException):
        return _exception_kind(arg)
    if isinstance(arg, str) and arg in _EXPORTER_KINDS:
        return arg
    return _withheld(arg)


def _exception_kind(exc: BaseException) -> str:
    """`[withheld: ConnectionError, errno 111]`: the class, and the first `errno` that is a
    number among the exception and its causes (`requests` wraps a refused connection's
    `ConnectionRefusedError` three times over). An `OSError` made with two or more
    arguments takes the first as its `errno`, whatever it is: only an `int` is kept."""
    errno, seen = None, 0
    link: BaseException | None = exc
    while link is not None and errno is None and seen < _CHAIN_LINKS:
        number = getattr(link, "errno", None)
        if isinstance(number, int) and not isinstance(number, bool):
            errno = number
        link, seen = link.__cause__ or link.__context__, seen + 1
    name = type(exc).__qualname__
    return f"[withheld: {name}]" if errno is None else f"[withheld: {name}, errno {errno}]"
