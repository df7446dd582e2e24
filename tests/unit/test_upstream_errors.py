"""A backend's error message on its way to the client: read in time whatever its shape,
shown bounded and printable (gateway/upstream/errors.py)."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from gateway.errors import ErrorCode
from gateway.upstream.errors import sanitize_upstream_message, translate_upstream_error
from gateway.upstream.hosted_errors import hosted_error, local_reason, unnamed

# Generous: the message takes milliseconds; the quadratic search took hours on this one.
DEADLINE_S = 60.0


@pytest.mark.parametrize("unit", ["a-", "a."], ids=["dashes", "dots"])
def test_a_hostile_message_is_read_in_time(unit: str) -> None:
    # A backend's 400 of 64 KiB `a-a-a-...`: the host:port search was tried at every word
    # boundary and scanned to the end from each, holding the event loop for ~40 s at 16 KB
    # (any client whose request the backend quotes back in its error could set that off).
    # Run apart: a search stuck in the regex engine holds the interpreter.
    body = orjson.dumps({"error": {"message": unit * (60_000 // len(unit))}})
    script = (
        "import sys; from gateway.upstream.errors import translate_upstream_error as t; "
        "print(len(t(400, sys.stdin.buffer.read()).message))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=body,
        capture_output=True,
        timeout=DEADLINE_S,
        check=True,
    )
    assert 0 < int(done.stdout) < 400


def test_a_hosted_refusal_reason_is_read_in_time() -> None:
    # LiteLLM's reason for refusing a request it will not send goes through the same kind
    # of URL search, which was quadratic on `a-a-a-...` too (~1.4 s at 8,000 characters).
    script = (
        "import sys; from gateway.upstream.hosted_errors import local_reason; "
        "print(len(local_reason(sys.stdin.read())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input="a-" * 32_000,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    assert 0 < int(done.stdout) <= 200


def test_urls_lose_their_whole_scheme_run() -> None:
    # The search starts where a run of scheme characters starts: `-ftp://` goes whole.
    assert local_reason("see xhttp://h/x and -ftp://a/b now") == "see (redacted) and (redacted) now"


def test_a_message_shows_no_control_or_bidi_characters() -> None:
    body = orjson.dumps({"error": {"message": "bad\x1b[2J\u202eroles\r\nforged: yes\x00"}})
    error = translate_upstream_error(400, body)
    assert error.code is ErrorCode.upstream_bad_request
    assert error.message.isprintable()
    assert error.message == "the backend rejected the request: bad [2J roles  forged: yes "


def test_a_long_message_loses_no_host_to_the_cut() -> None:
    # The searches read the first 2,048 characters; a word cut there goes, whole (here a
    # long URL before it shrinks to `[backend]`, so the cut host would have been shown).
    text = "see http://" + "u" * 2020 + " gpu-node-7.internal:8000 rest"
    error = translate_upstream_error(400, orjson.dumps({"error": {"message": text}}))
    assert "gpu-node" not in error.message and len(error.message) < 400


def test_a_field_index_is_not_taken_for_an_address() -> None:
    # `messages[0].content[1]` read as an IPv6 address in brackets: the client was told
    # "`messages[backend].content[backend]` must be ..." about its own request.
    said = "`messages[0].content[12]` must be a content part; see [::1]:8000 and [fe80::1]"
    assert sanitize_upstream_message(said) == (
        "`messages[0].content[12]` must be a content part; see [backend] and [backend]"
    )


@pytest.mark.parametrize(
    ("text", "provider", "expected"),
    [
        (
            "Anthropic doesn't support tool_choice",
            "anthropic",
            "the provider doesn't support tool_choice",
        ),
        ("VertexAI needs a region", "vertex_ai", "the provider needs a region"),
        ("vertex ai needs a region", "vertex_ai", "the provider needs a region"),
        ("Invalid Message passed in", "anthropic", "Invalid Message passed in"),
        ("anything", "", "anything"),
    ],
)
def test_a_client_reads_no_provider_name(text: str, provider: str, expected: str) -> None:
    """`unnamed`: LiteLLM's reason, as the client reads it, says "the provider"."""
    assert unnamed(text, provider) == expected


def test_a_local_refusal_names_the_provider_to_the_operator_only() -> None:
    """LiteLLM refused the request unsent (a 4xx of its own): `message` (the operator's)
    names the provider, `public` (the client's) does not, and keeps the reason."""
    exc = _local(400, "litellm.BadRequestError: AnthropicException - Anthropic needs max_tokens. x")
    error = hosted_error(exc, "anthropic")
    assert error.message.startswith("the request is not valid for anthropic (HTTP 400, not sent)")
    assert error.public == (
        "the request is not valid for this model's provider (HTTP 400, not sent): "
        "the provider needs max_tokens."
    )


class _LocalRefusal(Exception):
    """What LiteLLM raises for a request it will not send: a status of its own, no wire."""

    def __init__(self, status_code: int, text: str) -> None:
        super().__init__(text)
        self.status_code = status_code


def _local(status: int, text: str) -> Exception:
    return _LocalRefusal(status, text)


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "failed to load model /models/secret-70b/q4.gguf: bad magic",
            "failed to load model [path]: bad magic",
        ),
        ('File "/srv/vllm/engine/core.py", line 3, in run', 'File "[path]", line 3, in run'),
        ("use one and/or the other; a 1/2 chance", "use one and/or the other; a 1/2 chance"),
    ],
)
def test_a_backend_file_path_is_not_shown(message: str, shown: str) -> None:
    """A private backend's 400 that names a file on its machine (its model's, a
    traceback's) reaches the client without the path."""
    body = orjson.dumps({"error": {"message": message}})
    error = translate_upstream_error(400, body)
    assert error.message == f"the backend rejected the request: {shown}"
