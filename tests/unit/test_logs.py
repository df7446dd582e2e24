"""The redaction processor: content fields dropped, secrets masked anywhere in strings."""

from __future__ import annotations

import io
import json
import logging

import structlog

from gateway import access_log
from gateway.logs import configure_logging, get_logger, redact


def test_redact_drops_content_fields_and_masks_secrets() -> None:
    event = {
        "event": "x",
        "messages": [{"content": "secret prompt"}],
        "Authorization": "Bearer sk-live-123456789",
        "note": "used key og-abcdefghijklmnop and Bearer tok-123",
        "tenant": "acme",
    }
    out = redact(None, "info", event)
    assert out["messages"] == "[redacted]"
    assert out["Authorization"] == "[redacted]"
    assert out["note"] == "used key [redacted] and Bearer [redacted]"
    assert out["tenant"] == "acme"


def test_redact_catches_case_nesting_and_secret_like_names() -> None:
    event = {
        "a": "BEARER abcdef123456",
        "b": {"authorization": "Bearer secret123", "n": ["Basic dXNlcjpwYXNz"]},
        "x-api-key": "k1",
        "access_token": "t1",
        "apikey": "k2",
        "completion_tokens": 12,
    }
    out = redact(None, "info", event)
    assert out["a"] == "BEARER [redacted]"
    assert out["b"] == {"authorization": "[redacted]", "n": ["Basic [redacted]"]}
    assert out["x-api-key"] == out["access_token"] == out["apikey"] == "[redacted]"
    assert out["completion_tokens"] == 12


def test_json_logs_go_through_redaction() -> None:
    stream = io.StringIO()
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    configure_logging("json", "info", stream=stream)
    try:
        get_logger("t").info("hello", prompt="do not log", model="m")
        logging.getLogger("uvicorn.error").warning("header was Bearer og-zzzzzzzzzzzz")
    finally:
        access_log.install(None)
        structlog.configure(**saved)
        logging.getLogger().handlers[:] = handlers
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["prompt"] == "[redacted]"
    assert lines[0]["model"] == "m"
    assert "og-zzzzzzzzzzzz" not in lines[1]["event"]


def test_redact_masks_secrets_in_any_letter_case() -> None:
    out = redact(None, "info", {"a": "BeArEr tok-123456", "b": "key OG-ABCDEFGHIJKL", "c": "Sk-x"})
    assert out == {"a": "BeArEr [redacted]", "b": "key [redacted]", "c": "Sk-x"}
