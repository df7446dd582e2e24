"""`owngate audit open --salt --commitment` says which bytes it opened a response with.

A response file may open a commitment in three forms (docs/provenance.md, "The body a
client commits to"): all of it, a stream as received less the gateway's tail (its receipt
line and the line end or error event before it), or a countersigned answer less its
receipt line alone. Tried all at once, a party could hand the auditor a countersigned
stream with an event of its own appended (`data: {"error":{},"choices":[...]}`, which
SDKs read as content) and the tool said `ok`: the extra bytes were taken off as the
gateway's. With `--receipt` the log decides the form; without one the auditor states it
(`--form`), a response without one is refused (exit 2), and the result names the form
and the bytes that opened the commitment."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.provenance import commit

SALT = bytes(range(32))
STREAM = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
RECEIPT_LINE = b": owngate-receipt " + base64.b64encode(b"{}") + b"\n\n"
# shaped as the gateway's error event; SDKs read its content
INJECTED = b'data: {"error":{},"choices":[{"delta":{"content":"pay here"}}],"x":{}}\n\n'


def _open(tmp_path: Path, received: bytes, committed: bytes, *flags: str) -> int:
    (tmp_path / "received").write_bytes(received)
    argv = ["audit", "open", str(tmp_path / "received"), "--salt", SALT.hex()]
    return main([*argv, "--commitment", commit("response", SALT, committed), *flags])


def test_a_response_without_a_form_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attack: a countersigned stream, an event appended before the receipt line."""
    forged = STREAM + INJECTED + RECEIPT_LINE
    assert _open(tmp_path, forged, STREAM, "--kind", "response") == 2
    err = capsys.readouterr().err
    assert "give --form exact|stream|countersigned" in err


def test_the_stated_form_decides_which_bytes_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = STREAM + INJECTED + RECEIPT_LINE
    response = ("--kind", "response", "--form")
    # a countersigned answer is whole: the appended event is not the gateway's
    assert _open(tmp_path, forged, STREAM, *response, "countersigned") == 1
    assert "do not open this response commitment" in capsys.readouterr().err
    assert _open(tmp_path, STREAM + RECEIPT_LINE, STREAM, *response, "countersigned") == 0
    out = capsys.readouterr().out
    assert (
        f"form countersigned, its first {len(STREAM)} of {len(STREAM + RECEIPT_LINE)} bytes" in out
    )
    assert "the gateway's own: its receipt line)" in out
    # nor as a stream: the appended event is no OpenAI error object (before, it was taken
    # off as the gateway's error event, and the tool said `ok` naming it)
    assert _open(tmp_path, forged, STREAM, *response, "stream") == 1
    captured = capsys.readouterr()
    assert "it is not the gateway's error event" in captured.err
    assert "ok" not in captured.out
    # exact: the file is the committed bytes, all of them
    assert _open(tmp_path, STREAM + RECEIPT_LINE, STREAM, *response, "exact") == 1
    capsys.readouterr()
    assert _open(tmp_path, STREAM, STREAM, *response, "exact") == 0
    assert f"form exact, all {len(STREAM)} bytes of it" in capsys.readouterr().out


def test_a_stream_that_ended_mid_line_names_the_gateways_line_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    relayed = STREAM + b"data: x"
    received = relayed + b"\n" + RECEIPT_LINE
    assert _open(tmp_path, received, relayed, "--kind", "response", "--form", "stream") == 0
    assert "the gateway's own: 1 line end, its receipt line)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (("--kind", "request", "--form", "stream"), "a request commitment is to the body"),
        (("--kind", "response", "--form", "whole"), "--form is one of exact, stream"),
        (("--kind", "response", "--form", "exact", "--receipt", "r.json"), "with --receipt"),
    ],
)
def test_a_form_that_cannot_apply_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], problem: str
) -> None:
    assert _open(tmp_path, STREAM, STREAM, *flags) == 2
    assert problem in capsys.readouterr().err


def test_a_request_needs_no_form_and_says_it_opened_all_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = b'{"model":"m","messages":[]}'
    (tmp_path / "request.json").write_bytes(body)
    argv = ["audit", "open", str(tmp_path / "request.json"), "--salt", SALT.hex()]
    assert main([*argv, "--commitment", commit("request", SALT, body).upper()]) == 0
    assert f"form exact, all {len(body)} bytes of it" in capsys.readouterr().out


def test_the_form_has_an_environment_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OWNGATE_AUDIT_FORM", "stream")
    assert _open(tmp_path, STREAM + RECEIPT_LINE, STREAM, "--kind", "response") == 0
    assert "form stream" in capsys.readouterr().out


@pytest.mark.parametrize("code", ["upstream_error", "rate_limit_exceeded", "pay_here"])
def test_an_error_event_is_not_taken_off_without_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], code: str
) -> None:
    """An event that is an OpenAI error object alone, of a code of the gateway's or not:
    without the completion record (its status) nothing says it is the gateway's, so
    `--salt --commitment` refuses to take it off and names what would (before: `ok`,
    `its error event` taken off as the gateway's)."""
    error = {"message": "m", "type": "t", "param": None, "code": code}
    event = b"data: " + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n\n"
    received = STREAM + event + RECEIPT_LINE
    assert _open(tmp_path, received, STREAM, "--kind", "response", "--form", "stream") == 1
    captured = capsys.readouterr()
    assert "open it with --receipt RECEIPT --log LOGDIR --key VKEY" in captured.err
    assert "ok" not in captured.out
    # the same stream, its commitment covering the event: opened, all of it before the line
    committed = STREAM + event
    assert _open(tmp_path, received, committed, "--kind", "response", "--form", "stream") == 0
    assert f"its first {len(committed)} of {len(received)} bytes" in capsys.readouterr().out
