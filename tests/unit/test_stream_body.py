"""`owngate audit open --kind response --form stream` takes a stream as the client received it: the
gateway's receipt line, and the line end or error event it wrote before it, are not in
the response commitment (docs/provenance.md, "The body a client commits to"), so the
tool takes them off; what the backend sent must still match to the byte."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance import commit
from gateway.provenance.formats.stream_body import committed_bodies
from tests.helpers.paths import REPO_ROOT

SALT = bytes(range(32))
RECEIPT = b": owngate-receipt " + base64.b64encode(b'{"payload":"x"}') + b"\n\n"
# the gateway's own error event, as it writes it (gateway/api/exchange.py)
FAILED = GatewayError(ErrorCode.upstream_error, "the backend failed in the middle of the stream")
ERROR = b"data: " + FAILED.body() + b"\n\n"
EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'

# (what the backend relayed, what the gateway wrote after it), per the docs' rules
CASES = {
    "ended": (EVENT + b"data: [DONE]\n\n", RECEIPT),
    "ended-crlf": (EVENT.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n", RECEIPT),
    "ended-cr": (EVENT.replace(b"\n", b"\r") + b"data: [DONE]\r\r", RECEIPT),
    "mid-line": (EVENT + b"data: [DONE]", b"\n" + RECEIPT),
    "broken-after-event": (EVENT, ERROR + RECEIPT),
    "broken-in-event": (EVENT + b'data: {"choices":[]}\n', b"\n" + ERROR + RECEIPT),
    "broken-after-cr": (EVENT + b'data: {"choices":[]}\r', b"\n\n" + ERROR + RECEIPT),
    "broken-mid-line": (EVENT + b'data: {"cho', b"\n\n" + ERROR + RECEIPT),
    # the backend's event ended by a blank line whose last line end is a lone CR
    "broken-after-crlf-cr": (EVENT.replace(b"\n", b"\r\n")[:-1], ERROR + RECEIPT),
    "broken-after-cr-cr": (EVENT.replace(b"\n", b"\r"), ERROR + RECEIPT),
    "whole-answer": (b'{"choices":[]}', b""),
    "no-receipt-line": (EVENT + b"data: [DONE]\n\n", b""),
}


def _open(tmp_path: Path, received: bytes, committed: bytes) -> int:
    path = tmp_path / "received"
    path.write_bytes(received)
    commitment = commit("response", SALT, committed)
    argv = ["audit", "open", str(path), "--kind", "response", "--form", "stream"]
    return main([*argv, "--salt", SALT.hex(), "--commitment", commitment])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_stream_as_received_opens_the_commitment_to_the_backends_bytes(
    tmp_path: Path, case: tuple[bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    relayed, gateway = case
    assert relayed in committed_bodies(relayed + gateway)
    if ERROR not in gateway:
        assert _open(tmp_path, relayed + gateway, relayed) == 0
        return
    # The gateway's error event is taken off only against the completion record that
    # says the stream broke off with its code's status (`--receipt --log`): a salt and
    # commitment alone cannot tell it from an event another party appended.
    assert _open(tmp_path, relayed + gateway, relayed) == 1
    assert "open it with --receipt RECEIPT --log LOGDIR" in capsys.readouterr().err


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_changed_byte_of_the_backends_stream_still_fails(
    tmp_path: Path, case: tuple[bytes, bytes]
) -> None:
    relayed, gateway = case
    changed = relayed.replace(b"[", b"{", 1) if b"[" in relayed else relayed + b" "
    assert _open(tmp_path, changed + gateway, relayed) == 1


def test_every_candidate_is_the_received_bytes_less_a_tail() -> None:
    for relayed, gateway in CASES.values():
        received = relayed + gateway
        for body in committed_bodies(received):
            assert received.startswith(body)


def test_a_receipt_line_inside_a_line_is_not_taken_off(tmp_path: Path) -> None:
    """Only a line of its own is the gateway's: text that merely ends like one stays."""
    received = b"data: x: owngate-receipt QUJD\n\n"
    assert committed_bodies(received) == (received,)
    assert _open(tmp_path, received, b"data: x") == 1


def _documented() -> Any:
    """The `committed_bodies` of docs/provenance.md, run as written."""
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    section = text.split("### The body a client commits to", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "docs/provenance.md shows no committed_bodies"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "docs/provenance.md:committed_bodies", "exec"), namespace)
    return namespace["committed_bodies"]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_documented_recipe_finds_the_same_bodies(case: tuple[bytes, bytes]) -> None:
    relayed, gateway = case
    received = relayed + gateway
    assert tuple(_documented()(received)) == committed_bodies(received)
    assert tuple(_documented()(b"data: x: owngate-receipt QUJD\n\n")) == committed_bodies(
        b"data: x: owngate-receipt QUJD\n\n"
    )
