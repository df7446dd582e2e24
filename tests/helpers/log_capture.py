"""The gateway's logs as they are rendered, for tests that read them: `rendered_logs()`
configures the process's logging (`gateway.logs.configure_logging`) to write into a
string buffer, and puts the previous configuration back on exit. Loggers made inside
the block (an app created there) write to the buffer. `logging_to(stream)` does the same
with a stream of the test's own (one with a binary `buffer`, as stderr has); `level` is
the configured level (gateway.yaml's `logging.level`)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, TextIO

import structlog

from gateway import access_log
from gateway.logs import configure_logging

__all__ = ["kept_logging", "logging_to", "rendered_logs"]


@contextmanager
def kept_logging() -> Iterator[None]:
    """Puts this process's logging configuration back as it was on exit: structlog's, the
    access log writer, the root logger's handlers and level, and uvicorn's loggers (which
    `configure_logging` claims). For a test that runs a command configuring logging itself
    (`start_logging` onto a captured stderr, closed once the test ends)."""
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    saved_level = logging.getLogger().level
    uvicorn = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved_uvicorn = [(each.handlers[:], each.propagate, each.disabled) for each in uvicorn]
    try:
        yield
    finally:
        access_log.install(None)
        structlog.configure(**saved)
        root = logging.getLogger()
        root.handlers[:] = handlers
        root.setLevel(saved_level)
        for each, (its_handlers, propagate, disabled) in zip(uvicorn, saved_uvicorn, strict=True):
            each.handlers[:] = its_handlers
            each.propagate, each.disabled = propagate, disabled


@contextmanager
def logging_to(
    stream: TextIO, fmt: Literal["json", "console"] = "json", level: str = "info"
) -> Iterator[None]:
    with kept_logging():
        configure_logging(fmt, level, stream=stream)
        yield


@contextmanager
def rendered_logs(
    fmt: Literal["json", "console"] = "json", level: str = "info"
) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    with logging_to(stream, fmt, level):
        yield stream
