"""`refusal.diagnosis`: the access line's `unserved` field, bounded and cut at any text a
client or a provider could have written."""

from __future__ import annotations

import pytest

from gateway.api.refusal import UNSERVED_CHARS, diagnosis


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        (
            ["gpu: /health: connect", "b: circuit breaker open"],
            "gpu: /health: connect; b: circuit breaker open",
        ),
        (["gpu: HTTP 503"], "gpu: HTTP 503"),
        (
            ["openai: openai answered HTTP 400 'echo of the prompt'"],
            "openai: openai answered HTTP 400",
        ),
        (['x: bad "quoted" value'], "x: bad"),
        (["x: caf\u00e9 \u202eevil"], "x: caf"),
        (["x: line\nbreak"], "x: line"),
        ([], ""),
    ],
)
def test_each_reason_is_cut_at_the_first_unsafe_character(
    reasons: list[str], expected: str
) -> None:
    assert diagnosis(reasons) == expected


def test_the_whole_is_bounded() -> None:
    text = diagnosis([f"backend-{i}: " + "a" * 500 for i in range(1000)])
    assert len(text) <= UNSERVED_CHARS + 5
    assert text.endswith("...")
