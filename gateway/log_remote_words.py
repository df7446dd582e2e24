"""Library log lines that would say what the far side of a connection sent, or what a
signed request held, kept out of the gateway's log (the stdlib handler's filter,
installed by gateway/logs.py `configure_logging`): the info and debug lines of HTTP
client libraries and of the AWS SDK, and the strings an OpenTelemetry exporter's line
quotes."""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["AWS_SDK_LOGGERS", "EXPORTER_LOGGERS", "REMOTE_WORDS_LOGGERS", "QuietRemoteWords"]

# HTTP client libraries whose info and debug lines say what the far side sent: the OpenAI
# SDK (under LiteLLM) logs a hosted provider's `x-request-id` header as it came (`request_id:
# %s`), httpx the status line's reason phrase, httpcore and hpack every response header.
# A provider, or a backend that quotes a client's request, chooses those strings; only
# these libraries' warnings and errors are written (`QuietRemoteWords`). A filter on the
# handler, not a logger level: `OPENAI_LOG=debug` sets the SDK's level when it is imported.
REMOTE_WORDS_LOGGERS: Final = ("openai", "anthropic", "httpx", "httpcore", "hpack")

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
# `OTEL_EXPORTER_OTLP_HEADERS` auth token included. Every string such a line quotes is
# written as its length (`_exporter_arg`); its numbers, its own words and an exception
# (the transport's: a refused connection, a timeout) are kept.
EXPORTER_LOGGERS: Final = ("opentelemetry.exporter",)
_EXPORTER_KINDS: Final = frozenset({"span", "spans", "metric", "metrics", "log", "logs"})


class QuietRemoteWords(logging.Filter):
    """Drops the info and debug lines of `REMOTE_WORDS_LOGGERS` and `AWS_SDK_LOGGERS`
    (and their children), and withholds the strings an `EXPORTER_LOGGERS` line quotes."""

    def filter(self, record: logging.LogRecord) -> bool:  # the stdlib's name
        name = record.name
        if name.startswith(EXPORTER_LOGGERS) and isinstance(record.args, tuple):
            record.args = tuple(_exporter_arg(arg) for arg in record.args)
        if record.levelno >= logging.WARNING:
            return True
        return not any(name == library or name.startswith(library + ".") for library in _QUIET)


def _exporter_arg(arg: object) -> object:
    if isinstance(arg, str) and arg not in _EXPORTER_KINDS:
        return f"[withheld: {len(arg)} characters]"
    return arg
