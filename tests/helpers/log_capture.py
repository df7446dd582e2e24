"""The gateway's logs as they are rendered, for tests that read them: `rendered_logs()`
configures the process's logging (`gateway.logs.configure_logging`) to write into a
string buffer, and puts the previous configuration back on exit. Loggers made inside
the block (an app created there) write to the buffer."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import structlog

from gateway import access_log
from gateway.logs import configure_logging

__all__ = ["rendered_logs"]


@contextmanager
def rendered_logs(fmt: Literal["json", "console"] = "json") -> Iterator[io.StringIO]:
    stream = io.StringIO()
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    level = logging.getLogger().level
    configure_logging(fmt, "info", stream=stream)
    try:
        yield stream
    finally:
        access_log.install(None)
        structlog.configure(**saved)
        root = logging.getLogger()
        root.handlers[:] = handlers
        root.setLevel(level)
