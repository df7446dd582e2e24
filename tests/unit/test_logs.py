"""The redaction processor: content fields dropped, secrets masked anywhere in strings."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.config
import socket
import threading
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
import pytest
import urllib3
import uvicorn.config
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider

import gateway.logs
from gateway.logs import MAX_FIELD_CHARS, get_logger, redact
from tests.helpers.log_capture import logging_to, rendered_logs


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
    with rendered_logs() as stream:
        get_logger("t").info("hello", prompt="do not log", model="m")
        logging.getLogger("uvicorn.error").warning("header was Bearer og-zzzzzzzzzzzz")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["prompt"] == "[redacted]"
    assert lines[0]["model"] == "m"
    assert "og-zzzzzzzzzzzz" not in lines[1]["event"]


def test_redact_masks_secrets_in_any_letter_case() -> None:
    out = redact(None, "info", {"a": "BeArEr tok-123456", "b": "key OG-ABCDEFGHIJKL", "c": "Sk-x"})
    assert out == {"a": "BeArEr [redacted]", "b": "key [redacted]", "c": "Sk-x"}


_HOSTILE = '\n{"event":"forged"}\r\x1b[2J\u202egnp.exe\x00' + "x" * 1_000_000


def _logged(fmt: Literal["json", "console"]) -> str:
    with rendered_logs(fmt) as stream:
        # a backend's or witness's words in a failure, through structlog and through stdlib
        get_logger("t").warning("backend failed", reason=_HOSTILE, problems=[_HOSTILE])
        logging.getLogger("uvicorn.error").warning("said %s", _HOSTILE)
        try:
            raise ValueError(_HOSTILE)
        except ValueError:
            get_logger("t").exception("crashed")
            logging.getLogger("uvicorn.error").exception("crashed")
    return stream.getvalue()


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_no_string_reaches_a_log_line_verbatim_or_unbounded(
    fmt: Literal["json", "console"],
) -> None:
    out = _logged(fmt)
    # 1 MB in each of five fields was written whole; a line break or an escape sequence
    # in it split the console line or reached the terminal, a bidi override the reader.
    assert len(out) < 200_000
    assert "\x1b" not in out and "\u202e" not in out and "\x00" not in out and "\r" not in out
    assert "[2J" in out and "more characters]" in out  # escaped and cut, not dropped
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["event"] for line in lines if line["event"] == "forged"] == []
        assert len(lines) == 4
    else:  # only tracebacks span lines; the forged line never starts one
        assert not any(line.startswith('{"event":"forged"}') for line in out.splitlines())


def test_printable_short_values_are_kept_as_they_are() -> None:
    out = redact(None, "info", {"reason": "HTTP 503 ünïcode", "n": 3, "l": ["a b"]})
    assert out == {"reason": "HTTP 503 ünïcode", "n": 3, "l": ["a b"]}


def _lines(fmt: Literal["json", "console"], log: Callable[[Any], None], *, file: bool) -> str:
    """What `log(logger)` writes with `configure_logging(fmt)`; `file`: to a stream with a
    binary `buffer` (stderr in production: orjson's bytes written straight through)."""
    text = io.StringIO()
    binary = io.BytesIO()
    stream = io.TextIOWrapper(binary, encoding="utf-8", write_through=True) if file else text
    with logging_to(stream, fmt):
        log(get_logger("t"))
    return binary.getvalue().decode() if file else text.getvalue()


_HOSTILE_KEY = '\n{"event":"forged"}\r\x1b[2J\u202egnp.exe\x00\ud800' + "k" * 1_000_000


@pytest.mark.parametrize("fmt", ["json", "console"])
@pytest.mark.parametrize("file", [False, True])
def test_no_key_reaches_a_log_line_verbatim_or_unbounded(
    fmt: Literal["json", "console"], file: bool
) -> None:
    # A dict logged whole (say, a parsed body field or a backend's JSON), keyed by what
    # someone outside chose, and a field named so (a dict spread into the call).
    # A secret's name past the cut is judged whole: its value stays out.
    nested = {_HOSTILE_KEY: {_HOSTILE_KEY: "v", "x" * 200 + "_token": "plain-secret"}}
    out = _lines(fmt, lambda log: log.warning("seen", d=nested, **{_HOSTILE_KEY: 1}), file=file)
    # Keys were left as they came: 1 MB each, the bidi override and (console, top level)
    # the line break written raw.
    assert len(out) < 2000  # three keys of at most 128 characters, escaped, and the rest
    assert "\x1b" not in out and "\u202e" not in out and "\x00" not in out and "\r" not in out
    assert "[2J" in out and "more characters]" in out and "plain-secret" not in out
    if fmt == "json":
        (line,) = [json.loads(line) for line in out.splitlines()]
        assert line["event"] == "seen"
    else:
        assert len(out.splitlines()) == 1


@pytest.mark.parametrize("fmt", ["json", "console"])
@pytest.mark.parametrize("file", [False, True])
def test_values_the_json_encoder_refuses_are_written_not_raised(
    fmt: Literal["json", "console"], file: bool
) -> None:
    def log(logger: Any) -> None:
        # gateway/workers.py logs its failed workers' exit codes by worker index.
        logger.error("workers exited with errors", codes={0: 1, 2: -9})
        logger.warning("odd keys", by={10**5000: 1, ("t", 1): 2})
        logger.warning("odd values", big=2**70, raw=b"\n" * 10_000, kinds={"a\x1b"})

    out = _lines(fmt, log, file=file)  # orjson raised TypeError: the call itself failed
    assert len(out.splitlines()) == 3 and len(out) < 2 * MAX_FIELD_CHARS
    if fmt == "json":
        codes, keys, odd = [json.loads(line) for line in out.splitlines()]
        assert codes["codes"] == {"0": 1, "2": -9}
        assert keys["by"] == {"[an integer of 16610 bits]": 1, "('t', 1)": 2}
        assert odd["big"] == "[an integer of 71 bits]"
        assert odd["raw"].startswith("b'\\n\\n") and odd["raw"].endswith("more characters]")
        assert odd["kinds"] == ["a\\x1b"]


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_line_is_bounded_however_many_or_deep_its_items(
    fmt: Literal["json", "console"],
) -> None:
    deep: list[Any] = []
    for _ in range(5000):  # past the interpreter's recursion limit
        deep = [deep]

    def log(logger: Any) -> None:
        logger.warning("many", items=["ab"] * 1_000_000, by={str(i): i for i in range(100_000)})
        logger.warning("deep", nested=deep)

    out = _lines(fmt, log, file=False)  # 7 MB written; then a RecursionError
    assert len(out) < 200_000  # gateway.logs.MAX_EVENT_CHARS (64 Ki) and the escaping
    assert "more items]" in out and "nested too deep]" in out
    assert len(out.splitlines()) == 2


def test_a_line_past_its_size_keeps_its_event_level_and_time() -> None:
    # structlog adds event, level and timestamp after the caller's fields: a caller's
    # large fields used up the line's budget first and left them cut to nothing, so
    # filters and alerts on the level missed the line.
    def log(logger: Any) -> None:
        logger.error("reload refused", problems=["p" * 3000] * 40)

    (line,) = _lines("json", log, file=False).splitlines()
    record = json.loads(line)
    assert (record["event"], record["level"]) == ("reload refused", "error")
    assert record["timestamp"] and "more characters" not in record["timestamp"]


def test_keys_that_are_the_same_once_cut_or_escaped_are_both_kept() -> None:
    # 1 and "1", or two long keys alike in their first characters, wrote one key: the
    # second value hid the first.
    long = "k" * 500

    def log(logger: Any) -> None:
        logger.warning("keys", seen={1: "first", "1": "second", long + "a": "x", long + "b": "y"})

    (line,) = _lines("json", log, file=False).splitlines()
    seen = json.loads(line)["seen"]
    assert sorted(v for v in seen.values()) == ["first", "second", "x", "y"]


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_http_client_libraries_never_log_what_the_far_side_sent(
    fmt: Literal["json", "console"],
) -> None:
    """At `logging.level: debug` the OpenAI SDK under LiteLLM logged a hosted provider's
    `x-request-id` as it came (`request_id: <value>`, openai/_base_client.py), and
    httpx/httpcore log reason phrases and response headers: strings the provider (or a
    backend quoting a client) chose; botocore's signer the canonical request of each
    Bedrock call, its session token included. Their info and debug lines are dropped,
    whatever level the library set itself (`OPENAI_LOG=debug`); warnings still come
    through."""
    canary = 'CANARY7f3a"provider-id'
    names = (
        "openai._base_client",
        "openai",
        "httpx",
        "httpcore.http11",
        "hpack.hpack",
        "botocore.auth",  # a Bedrock call's canonical request: the session token
        "boto3",
        "httpx2",  # the OpenAI SDK's own client: httpx's `HTTP Request:` line
        "httpcore2.http11",
        "urllib3.poolmanager",  # a redirect's `Location` (botocore, the OTLP exporter)
    )
    with rendered_logs(fmt, level="debug") as logs:
        for name in names:
            library = logging.getLogger(name)
            library.setLevel(logging.DEBUG)  # as `OPENAI_LOG=debug` does for openai
            try:
                library.debug("request_id: %s", canary)
                library.info('HTTP Request: POST "HTTP/1.1 200 %s"', canary)
                library.warning("a library warning")
            finally:
                library.setLevel(logging.NOTSET)
        logging.getLogger("openai_lookalike").debug("a logger of another name")
        get_logger("owngate.test").debug("the gateway's own debug line")
    out = logs.getvalue()
    assert "CANARY7f3a" not in out
    assert out.count("a library warning") == len(names)
    assert "a logger of another name" in out and "the gateway's own debug line" in out


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_urllib3_s_warnings_never_quote_what_the_far_side_sent(
    fmt: Literal["json", "console"],
) -> None:
    """urllib3 (botocore's credential fetches, the OTLP/HTTP exporter) warns `Retrying
    (%r) after connection broken by '%r': %s` with the status line it could not read, as
    it came, and `Failed to parse headers (url=%s): %s`: an AWS endpoint or a collector
    wrote what it chose into the gateway's log. A loopback server answers a garbled status
    line, then a malformed header; both warnings are written, their arguments only as
    what they are."""
    canary = "CANARYu3b9-far-side-words"
    answers = [
        f"{canary} 200 OK\r\n\r\n".encode(),
        f"HTTP/1.1 200 OK\r\nX-Fine: 1\r\n{canary}\r\nContent-Length: 0\r\n\r\n".encode(),
    ]
    with socket.create_server(("127.0.0.1", 0)) as server, rendered_logs(fmt) as logs:
        server.settimeout(10)
        port = server.getsockname()[1]
        answering = threading.Thread(target=_answer, args=(server, answers), daemon=True)
        answering.start()
        with urllib3.PoolManager() as pool:
            pool.request("GET", f"http://127.0.0.1:{port}/", retries=1, timeout=10)
        answering.join(10)
        logging.getLogger("urllib3.connection").warning(OSError(canary))  # the message an object
        logging.getLogger("urllib3").warning("pool of %d for %s", 3, {canary: 1})
    out = logs.getvalue()
    assert canary not in out
    assert "after connection broken by '[withheld: BadStatusLine]'" in out.replace("''", "'")
    assert "Failed to parse headers (url=[withheld: " in out
    assert "[withheld: OSError]" in out and "pool of 3 for [withheld: dict]" in out


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_aiohttp_s_lines_never_quote_what_the_far_side_sent(
    fmt: Literal["json", "console"],
) -> None:
    """aiohttp (LiteLLM's client for hosted providers) warns `Can not load cookies:
    Illegal cookie name %r` on its `aiohttp.internal` logger with the name a far side's
    `Set-Cookie` gave, as it came, and its cookie jar's debug lines name cookies and
    hosts: a provider (or anything in its path) wrote what it chose into the gateway's
    log. A loopback server answers such a cookie to a real `ClientSession` (with LiteLLM's
    jar, which keeps none), whose response's cookies are read; the warning is written, its
    argument only as what it is, and no debug line at all."""
    canary = "CANARYa1o7 far-side-cookie"
    answers = [f"HTTP/1.1 200 OK\r\nSet-Cookie: {canary}=1\r\nContent-Length: 0\r\n\r\n".encode()]

    async def fetch(port: int) -> None:
        jar = aiohttp.DummyCookieJar()
        async with (
            aiohttp.ClientSession(cookie_jar=jar) as session,
            session.get(f"http://127.0.0.1:{port}/") as response,
        ):
            await response.read()
            assert not response.cookies  # read, as a caller of LiteLLM's transport may

    internal = logging.getLogger("aiohttp.internal")
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        rendered_logs(fmt, level="debug") as logs,
    ):
        server.settimeout(10)
        port = server.getsockname()[1]
        answering = threading.Thread(target=_answer, args=(server, answers), daemon=True)
        answering.start()
        asyncio.run(fetch(port))
        answering.join(10)
        internal.setLevel(logging.DEBUG)
        try:
            internal.debug("Cookie %s for %s", canary, canary)
        finally:
            internal.setLevel(logging.NOTSET)
    out = logs.getvalue()
    assert canary.split()[0] not in out
    assert "Can not load cookies: Illegal cookie name " in out
    assert f"[withheld: {len(canary)} characters]" in out


def _answer(server: socket.socket, answers: list[bytes]) -> None:
    """Each of `answers` to one connection's request, in turn."""
    for answer in answers:
        peer, _ = server.accept()
        with peer:
            peer.settimeout(10)
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = peer.recv(4096)
                if not chunk:
                    break
                request += chunk
            peer.sendall(answer)


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_an_otlp_exporter_never_logs_what_the_collector_answered(
    fmt: Literal["json", "console"],
) -> None:
    """The OTLP/HTTP exporter logged the collector's reason phrase as it came (`Failed to
    export span batch code: 401, reason: <phrase>`): a collector or proxy that quotes the
    request wrote the exporter's own `OTEL_EXPORTER_OTLP_HEADERS` token into the
    gateway's log. Its strings are written as their length, an exception as its class
    and OS error number; numbers and the batch kind are kept."""
    token = "x-honeycomb-team: SecOtlpUnit8e3b"
    exporter = logging.getLogger("opentelemetry.exporter.otlp.common.http")
    with rendered_logs(fmt, level="debug") as logs:
        exporter.error("Failed to export %s batch code: %s, reason: %s", "span", 401, token)
        exporter.warning(
            "Transient error %s encountered while exporting %s batch, retrying in %.2fs.",
            token,
            "span",
            0.5,
        )
        exporter.error(
            "Failed to export %s batch code: %s, reason: %s", "span", None, OSError(111, "refused")
        )
    out = logs.getvalue()
    assert "SecOtlpUnit8e3b" not in out
    assert "span batch code: 401, reason: [withheld: 33 characters]" in out
    assert "retrying in 0.50s" in out and "refused" not in out
    assert "reason: [withheld: ConnectionRefusedError, errno 111]" in out  # OSError(111, …)


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_an_otlp_exporter_never_logs_the_status_line_a_collector_garbled(
    fmt: Literal["json", "console"],
) -> None:
    """A collector that answers a garbled status line: `requests` raises
    `ConnectionError(('Connection aborted.', BadStatusLine('<its bytes>')))`, which the
    exporter logs (`Transient error %s`, `Failed to export ... reason: %s`) and the
    gateway wrote as it said, the collector's bytes and all. The real exporter against a
    loopback collector; its retry is ended by shutting it down once it has said so."""
    canary = "CANARYo7c1-collector-words"
    retrying = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retrying.set()

    said = Said(logging.WARNING)
    exporter_log = logging.getLogger("opentelemetry.exporter")
    answers = [f"{canary} 200 OK\r\n\r\n".encode()] * 2  # the first try and its retry
    with socket.create_server(("127.0.0.1", 0)) as server, rendered_logs(fmt) as logs:
        server.settimeout(10)
        port = server.getsockname()[1]
        answering = threading.Thread(target=_answer, args=(server, answers), daemon=True)
        answering.start()
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        span = TracerProvider().get_tracer("t").start_span("s")
        span.end()
        exporting = threading.Thread(target=exporter.export, args=([span],), daemon=True)
        exporter_log.addHandler(said)
        try:
            exporting.start()
            assert retrying.wait(30), "the exporter never said it failed"
        finally:
            # Ends the exporter's wait before its next try (the SDK's method is unannotated).
            exporter.shutdown()  # type: ignore[no-untyped-call]
            exporting.join(30)
            answering.join(10)
            exporter_log.removeHandler(said)
    out = logs.getvalue()
    assert not exporting.is_alive()
    assert canary not in out and "BadStatusLine" not in out
    assert "[withheld: ConnectionError]" in out


def test_uvicorn_s_own_logging_config_cannot_route_its_lines_past_the_masking() -> None:
    """`uvicorn.Config` made without `log_config=None` (a library, a test) runs uvicorn's
    dictConfig: `uvicorn` gets a stderr handler and stops propagating. Configuring the
    gateway's logs afterwards still sends uvicorn's lines through the masking handler."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    loggers = [logging.getLogger(name) for name in names]
    saved = [(each.handlers[:], each.propagate, each.disabled, each.level) for each in loggers]
    try:
        logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
        with rendered_logs() as stream:
            logging.getLogger("uvicorn.error").warning("header was Bearer og-zzzzzzzzzzzz")
            logging.getLogger("uvicorn.access").warning("GET /?key=og-yyyyyyyyyyyy")
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert len(lines) == 2
        assert "og-zzzzzzzzzzzz" not in lines[0]["event"]
        assert "og-yyyyyyyyyyyy" not in lines[1]["event"]
    finally:
        for each, (handlers, propagate, disabled, level) in zip(loggers, saved, strict=True):
            each.handlers[:] = handlers
            each.propagate, each.disabled = propagate, disabled
            each.setLevel(level)


def test_a_process_field_reaches_threads_and_stdlib_lines_and_yields_to_a_line_s_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # serve --workers bound the worker index as a structlog contextvar: a thread starts
    # with an empty context and a stdlib record never sees it, so their lines had none.
    monkeypatch.setattr(gateway.logs, "_PROCESS", {})
    with rendered_logs() as stream:
        gateway.logs.bind_process(worker=2)
        thread = threading.Thread(target=lambda: get_logger("t").warning("from a thread"))
        thread.start()
        thread.join()
        logging.getLogger("uvicorn.error").error("from stdlib")
        get_logger("t").warning("its own", worker=7)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["event"], line["worker"]) for line in lines] == [
        ("from a thread", 2),
        ("from stdlib", 2),
        ("its own", 7),
    ]
