"""The JSON access log (gateway/access_log.py): structlog's line shape, the redaction
guarantee, nothing lost at close, and a bounded buffer behind a stalled stream."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from prometheus_client import generate_latest

from gateway import access_log
from gateway.access_log import AccessLog
from gateway.api.metrics import GatewayMetrics
from gateway.logs import configure_logging, get_logger, redact
from tests.helpers.log_capture import kept_logging

KEY = "og-" + "k" * 24


def _fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": "req_" + "0" * 24,
        "endpoint": "chat",
        "tenant": "acme",
        "model": "m",
        "data_class": None,
        "data_class_defaulted": False,
        "policy": "p@1",
        "backend": "gpu",
        "fallback": None,
        "status": 200,
        "stream": False,
        "upstream_error": None,
        "duration_ms": 1.25,
    }
    fields.update(changes)
    return fields


@pytest.fixture
def restore_logging() -> Iterator[None]:
    with kept_logging():
        yield


def _written(**changes: Any) -> dict[str, Any]:
    chunks: list[bytes] = []
    writer = AccessLog(chunks.append)
    writer.emit(_fields(**changes))
    writer.close()
    (line,) = b"".join(chunks).splitlines()
    entry: dict[str, Any] = json.loads(line)
    return entry


def test_line_has_structlogs_shape(restore_logging: None) -> None:
    """Operators' parsers see the line structlog wrote: same keys, order and values."""
    stream = io.StringIO()
    configure_logging("json", "warning", stream=stream)  # no writer: structlog renders it
    assert access_log.current() is None
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    get_logger("owngate.access").info("request", **_fields())
    before = json.loads(stream.getvalue())
    after = _written()
    assert list(after) == list(before)
    assert {**after, "timestamp": None} == {**before, "timestamp": None}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", after["timestamp"])


@pytest.mark.parametrize(
    ("changes", "leaks"),
    [
        ({"model": "sk-live-" + "a" * 20}, "sk-live-"),
        ({"model": f"x {KEY}"}, KEY),
        ({"upstream_error": "BeArEr tok-123456"}, "tok-123456"),
        ({"tenant": "Basic dXNlcjpwYXNz"}, "dXNlcjpwYXNz"),
    ],
)
def test_secret_shaped_values_are_masked(changes: dict[str, Any], leaks: str) -> None:
    entry = _written(**changes)
    assert leaks not in json.dumps(entry)
    (name,) = changes
    assert "[redacted]" in entry[name]
    assert entry["status"] == 200 and entry["event"] == "request"


@pytest.mark.parametrize(
    "policy",
    [
        "p@2026\u202e" + "x" * 100_000,  # a policy version is any string its author wrote
        'p@1\u2028{"event":"forged"}',  # a JSON line break orjson writes as it is
        "p@1\x1b[2J",  # written as \u001b by orjson: plain JSON, raw to a terminal tool
    ],
)
def test_a_value_that_is_not_short_plain_ascii_is_cut_and_escaped(policy: str) -> None:
    entry = _written(policy=policy)  # written as encoded: 100 KB, the override raw
    shown = entry["policy"]
    assert len(shown) < 4200 and shown.isascii() and shown.isprintable()
    assert shown.startswith("p@") and entry["status"] == 200


@pytest.mark.parametrize("policy", ["p@1\x7f", "p@\x7f\x7f2"])
def test_del_is_escaped_as_the_structured_log_escapes_it(policy: str) -> None:
    """DEL (0x7f) is ASCII that orjson writes raw, no JSON escape: the fast path wrote it
    as it came where `redact` writes `\\x7f` (a policy `version` is any string its author
    wrote). Both write the line alike."""
    entry = _written(policy=policy)
    assert entry["policy"] == redact(None, "info", {"policy": policy})["policy"]
    assert "\x7f" not in entry["policy"] and "\\x7f" in entry["policy"]


def test_content_named_fields_never_reach_the_line() -> None:
    entry = _written(messages=[{"content": "hi"}], prompt="hi")
    assert entry["messages"] == entry["prompt"] == "[redacted]"


def test_close_writes_every_buffered_line() -> None:
    chunks: list[bytes] = []
    writer = AccessLog(chunks.append)
    for status in range(500):
        writer.emit(_fields(status=status))
    writer.close()
    lines = b"".join(chunks).splitlines()
    assert [json.loads(line)["status"] for line in lines] == list(range(500))
    assert writer.dropped == 0
    writer.emit(_fields())  # after close: counted, not buffered
    assert writer.dropped == 1


def test_a_stalled_stream_bounds_the_buffer_and_counts_drops() -> None:
    stalled, release = threading.Event(), threading.Event()
    chunks: list[bytes] = []

    def write(chunk: bytes) -> None:
        chunks.append(chunk)
        stalled.set()
        release.wait()

    limit = 4096
    writer = AccessLog(write, limit_bytes=limit)
    writer.emit(_fields())
    assert stalled.wait(10)  # the writer holds the first line, blocked in write()
    for _ in range(200):  # ~60 KB of lines behind a stalled reader
        writer.emit(_fields())
    assert writer.dropped > 0
    release.set()
    writer.close()
    assert all(len(chunk) <= limit for chunk in chunks)
    written = sum(chunk.count(b"\n") for chunk in chunks)
    assert written + writer.dropped == 201


def test_a_failing_stream_counts_its_lines_as_dropped() -> None:
    def write(_chunk: bytes) -> None:
        raise BrokenPipeError

    writer = AccessLog(write)
    writer.emit(_fields())
    writer.emit(_fields())
    writer.close()
    assert writer.dropped == 2


def _dropped_metric() -> float:
    metrics = generate_latest(GatewayMetrics().registry).decode()
    match = re.search(r"^owngate_access_log_dropped_total (\S+)$", metrics, re.MULTILINE)
    assert match is not None, metrics
    return float(match.group(1))


def test_drops_are_published_as_a_metric(restore_logging: None) -> None:
    before = _dropped_metric()
    writer = AccessLog(lambda _chunk: None)
    access_log.install(writer)
    writer.close()
    writer.emit(_fields())
    assert _dropped_metric() == before + 1
    access_log.install(None)  # a replaced writer's drops still count
    assert _dropped_metric() == before + 1


def test_json_logging_at_info_installs_the_writer(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    writer = access_log.current()
    assert writer is not None
    writer.emit(_fields())
    configure_logging("console", "info", stream=io.StringIO())  # replaces and closes it
    assert access_log.current() is None
    assert json.loads(stream.getvalue())["request_id"] == "req_" + "0" * 24
