"""The admin API's views for the console (gateway/admin/): who a token is, the
timelines sampled from a running `owngate serve` with a simulated backend, tenants,
the policy test cases, receipt verification, witness cosignatures and the audit report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.admin import Served, serve_admin
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-views"), sample_interval_s=0.2) as gateway:
        yield gateway


def test_whoami_names_the_role_and_what_it_may_use(served: Served) -> None:
    for role in ("operator", "security", "auditor"):
        assert served.get("/admin/v1/whoami", role).json() == {"role": role, "may": [role]}
    full = served.get("/admin/v1/whoami", "admin").json()
    assert full == {"role": "full", "may": ["operator", "security", "auditor"]}
    assert served.get("/admin/v1/whoami").status_code == 401


def _sum(samples: list[dict[str, Any]], after: float, value: Any) -> int:
    return sum(value(sample) for sample in samples if sample["t"] > after)


def test_the_timelines_show_the_requests_sent(served: Served) -> None:
    def newest(path: str, role: str) -> dict[str, Any]:
        answer: dict[str, Any] = served.get(f"/admin/v1/timeline/{path}", role).json()
        return answer

    first = newest("backends", "operator")
    assert first["interval_s"] == 0.2
    until(lambda: newest("backends", "operator")["samples"], "a first sample", timeout=20)
    start = newest("backends", "operator")["samples"][-1]["t"]  # what came before is in it
    for _ in range(3):
        assert served.chat().status_code == 200

    def requests() -> int:
        samples = newest("backends", "operator")["samples"]
        return _sum(samples, start, lambda s: s["backends"]["gpu"]["requests"])

    until(lambda: requests() >= 3, "3 requests in the backends timeline", timeout=20)
    assert requests() == 3
    samples = newest("backends", "operator")["samples"]
    served_in = [s["backends"]["gpu"] for s in samples if s["t"] > start]
    assert all(row["errors"] == 0 and row["breaker"] == "closed" for row in served_in)
    assert all(row["error_rate"] in (None, 0.0) for row in served_in)
    times = [s["t"] for s in samples]
    assert times == sorted(times)

    def decisions() -> int:
        samples = newest("policies", "security")["samples"]
        return _sum(samples, start, lambda s: sum(s["decisions"].values()))

    until(lambda: decisions() >= 3, "the decisions in the policies timeline", timeout=20)
    rules = {r for s in newest("policies", "security")["samples"] for r in s["decisions"]}
    assert rules and all(rule.startswith("builtin") or "/" in rule for rule in rules)

    def logged() -> int:
        return newest("log", "auditor")["samples"][-1]["checkpoint_size"] or 0

    until(lambda: logged() >= 6, "the 6 records in the log timeline", timeout=20)
    last = newest("log", "auditor")["samples"][-1]
    assert last["entries"] >= last["checkpoint_size"] and last["cosigned_size"] is None
