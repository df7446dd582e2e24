"""`limit_copies`: how many processes each hold every tenant limit in full with
`state: memory` (the workers of `serve --workers N`), in the status and /metrics."""

from __future__ import annotations

import pytest

from gateway.state import WORKERS_ENV, MemoryState, create_state, limit_copies


@pytest.mark.parametrize(
    ("value", "copies"),
    [(None, 1), ("2", 2), ("16", 16), ("0", 1), ("-3", 1), ("two", 1), ("", 1), ("٣", 1)],
)
def test_limit_copies_reads_the_supervisors_variable(value: str | None, copies: int) -> None:
    environ = {} if value is None else {WORKERS_ENV: value}
    assert limit_copies(environ) == copies


def test_a_workers_memory_state_says_its_limits_are_one_of_n() -> None:
    state = create_state("memory", workers=limit_copies({WORKERS_ENV: "3"}))
    assert state.status().limit_copies == 3
    assert state.status().detail()["limit_copies"] == 3
    assert MemoryState().status().limit_copies == 1
