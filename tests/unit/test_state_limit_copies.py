"""`limit_copies`: how many workers of `serve --workers N` hold a ledger of their own
(with `state: memory` they split every tenant limit: `limit_parts` in the status and
/metrics), read from the supervisor's variables."""

from __future__ import annotations

import pytest

from gateway.state import WORKERS_ENV, MemoryState, create_state, limit_copies
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV


@pytest.mark.parametrize(
    ("value", "copies"),
    [(None, 1), ("2", 2), ("16", 16), ("0", 1), ("-3", 1), ("two", 1), ("", 1), ("٣", 1)],
)
def test_limit_copies_reads_the_supervisors_variable(value: str | None, copies: int) -> None:
    environ = dict(_WORKER) if value is None else {**_WORKER, WORKERS_ENV: value}
    assert limit_copies(environ) == copies


# What the supervisor sets beside OWNGATE_WORKERS in each worker's environment.
_WORKER = {INDEX_ENV: "0", RUNTIME_ENV: "/run/owngate/workers"}


@pytest.mark.parametrize("value", ["4", "0004", "9" * 5000, "1" + "0" * 12])
def test_a_process_that_is_no_worker_is_one_copy_whatever_the_variable_says(value: str) -> None:
    # `OWNGATE_WORKERS=4 owngate serve --workers 1` (or an environment left over from a
    # supervised run) is one process: it counted itself as 4 replicas, so on Redis each
    # tenant got a quarter of its limits for good (max(workers, live replicas)), and a
    # value past Python's int digit limit raised at assembly.
    assert limit_copies({WORKERS_ENV: value}) == 1
    state = create_state(
        "redis", "redis://127.0.0.1:1/0", workers=limit_copies({WORKERS_ENV: value})
    )
    assert state._health.replicas == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["9" * 5000, "1" + "0" * 12])
def test_a_workers_absurd_count_is_refused_not_raised(value: str) -> None:
    assert limit_copies({**_WORKER, WORKERS_ENV: value}) == 1


def test_a_workers_memory_state_says_it_holds_one_part_of_n() -> None:
    # Each worker enforces its part of every limit (test_state_limit_parts.py): no
    # process holds a whole limit of its own any more.
    state = create_state("memory", workers=limit_copies({**_WORKER, WORKERS_ENV: "3"}))
    assert state.status().limit_parts == 3
    assert state.status().limit_copies == 1
    assert state.status().detail()["limit_copies"] == 1
    assert MemoryState().status().limit_parts == 1


def test_the_worker_variables_read_are_the_supervisors() -> None:
    from gateway.state import memory

    assert memory._WORKER_ENVS == (INDEX_ENV, RUNTIME_ENV)
