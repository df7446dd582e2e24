"""`owngate status`'s table shows what a gateway's status report says (backend ids, health
and breaker errors, tenants, queue names) escaped and bounded (`shown`): a backend's error
text cannot drive the operator's terminal, and a plain report reads as it is."""

from __future__ import annotations

from typing import Any

from gateway.cli.status import format_table
from gateway.provenance.audit.shown import MAX_SHOWN, MAX_SHOWN_MESSAGE

FORGED = "\r\x1b[2K\x1b[1Agpu  vllm  up  closed\u202e\u2028ok"


def _hostile() -> dict[str, Any]:
    return {
        "backends": [
            {
                "id": "gpu\x1b]0;owned\x07",
                "kind": "vllm\x9b",
                "health": "down",
                "health_error": FORGED + "x" * 10_000,
                "breaker": {
                    "state": "open\n",
                    "tenants": [{"tenant": "acme\x1b[2J", "state": "open", "last_error": FORGED}],
                },
            }
        ],
        "queues": {"pool\u200b": {"waiting": 3, "size": 8}},
        "readiness": {"status": "not ready\x1b[8m"},
    }


def _controls(text: str) -> list[str]:
    return [char for line in text.split("\n") for char in line if not char.isprintable()]


def test_what_the_report_says_is_printed_escaped_and_bounded() -> None:
    table = format_table(_hostile())
    assert _controls(table) == []
    assert "gpu\\x1b]0;owned\\x07" in table
    assert "acme\\x1b[2J" in table
    assert "\\x0d\\x1b[2K\\x1b[1Agpu  vllm  up  closed\\u202e\\u2028ok" in table
    assert "pool\\u200b: 3/8" in table
    assert table.endswith("gateway: not ready\\x1b[8m")
    assert max(len(line) for line in table.split("\n")) < MAX_SHOWN_MESSAGE + 2 * MAX_SHOWN


def test_a_plain_report_reads_as_it_is() -> None:
    report = {
        "backends": [
            {"id": "gpu-vllm", "kind": "vllm", "health": "down", "health_error": "connect: refused"}
        ]
    }
    lines = format_table(report).split("\n")
    assert lines[1].split()[:3] == ["gpu-vllm", "vllm", "down"]
    assert lines[-1] == "  gpu-vllm: connect: refused"
