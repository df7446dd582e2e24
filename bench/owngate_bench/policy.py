"""Policy decision cost: `owngate bench policy` prints p50/p99 of cached and uncached decisions.

Two policy sets: the shipped examples (policies/ against deploy/gateway.example.yaml of
this source tree) and a synthetic large one (64 backends, 32 policies with 3 data classes
each). Each call is timed on its own with `perf_counter_ns` over every (tenant, model,
data class) key in turn (`time_decisions`, also the method of the overhead benchmark's
`owngate_bench.overhead_policy.decision_cost`); "cached" is `PolicySet.decide` after one
warm-up pass, "uncached" is `PolicySet.decide_uncached` (what a cache miss costs). The
target is p99 <= 20 us.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.policy import BackendFacts, Decision, PolicySet, load_policies
from gateway.policy.loader import parse_policies

__all__ = [
    "BUDGET_US",
    "Row",
    "add_arguments",
    "decision_keys",
    "example_set",
    "large_set",
    "measure",
    "run",
    "time_decisions",
]

Key = tuple[str, str, str | None]
BUDGET_US = 20
ROOT = Path(__file__).resolve().parents[2]  # the source tree: deploy/ and policies/


def example_set() -> tuple[PolicySet, list[Key]]:
    """The shipped example policies against the example gateway.yaml, and their keys."""
    from gateway.config import load_config  # here: the CLI imports this module at start
    from gateway.config.facts import backend_facts

    config = load_config(ROOT / "deploy" / "gateway.example.yaml", env={})
    facts = backend_facts(config)
    policy_set = load_policies([ROOT / "policies"], facts)
    return policy_set, decision_keys(policy_set, {m for b in facts for m in b.models})


def large_set() -> tuple[PolicySet, list[Key]]:
    """A synthetic set: 64 backends, 32 policies with three data classes each."""
    regions = ["eu-west-1", "westeurope", "us-east-1", "europe-west3", "uksouth", "fr"]
    backends = [
        BackendFacts(
            id=f"b{i}",
            tier="private" if i % 2 else "hosted",
            kind="vllm" if i % 2 else "hosted",
            provider=f"p{i % 5}",
            region=regions[i % len(regions)],
            owner=f"p{i % 5}",
            retention_days=(i % 4) * 10,
            zero_data_retention=i % 4 == 0,
            training=i % 7 == 0,
            models=frozenset({f"m{i % 8}", f"m{(i + 3) % 8}"}),
        )
        for i in range(64)
    ]
    sources = [(f"p{i}.yaml", _policy(i)) for i in range(32)]
    policy_set = parse_policies(sources, backends)
    return policy_set, decision_keys(policy_set, {m for b in backends for m in b.models})


def _policy(i: int) -> str:
    return f"""
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: pol-{i}}}
spec:
  tenants: [t{i}]
  residency: {{allow: [eu, "us-*"], deny: [uk]}}
  retention: {{max_days: {10 * (i % 4)}, training: false}}
  providers: {{deny: [p{i % 5}]}}
  models: {{allow: ["m*"], deny: [m{i % 8}]}}
  fallback:
    mode: when_private_saturated
    saturation_threshold: 2
    to: [{{provider: p1}}, {{backend: "b1*"}}, {{provider: "*"}}]
  data_classes:
    a: {{residency: {{allow: [de, ie]}}}}
    b: {{retention: {{max_days: zero}}, fallback: {{mode: never}}}}
    c: {{backends: {{deny: ["b2*"]}}, fallback: {{mode: when_private_unavailable}}}}
"""


def decision_keys(policy_set: PolicySet, models: Iterable[str]) -> list[Key]:
    """Every (tenant, model, data class) key: each tenant the set binds, each model, and
    no label or one of the tenant's data classes."""
    keys: list[Key] = []
    for tenant in sorted(policy_set.tenants()):
        labels: list[str | None] = [None, *sorted(policy_set.data_classes(tenant))]
        keys += itertools.product([tenant], sorted(models), labels)
    return keys


def time_decisions(
    decide: Callable[[str, str, str | None], Decision], keys: list[Key], calls: int
) -> dict[str, float]:
    """p50/p99/max µs of `calls` calls of `decide`, cycling over `keys` after one warm-up
    pass (which, for `PolicySet.decide`, fills the cache), each call timed on its own with
    the garbage collector off."""
    for key in keys:
        decide(*key)
    samples: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for tenant, model, label in itertools.islice(itertools.cycle(keys), calls):
            start = clock()
            decide(tenant, model, label)
            samples.append(clock() - start)
    finally:
        gc.enable()
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "max_us": samples[-1] / 1000,
    }


@dataclass(frozen=True)
class Row:
    """The decision cost of one policy set, cached or uncached."""

    set: str
    keys: int
    mode: str  # "cached" or "uncached"
    p50_us: float
    p99_us: float
    max_us: float


def measure(name: str, policy_set: PolicySet, keys: list[Key], calls: int, cached: bool) -> Row:
    """One row: the decisions of `policy_set`, cached or not, timed by `time_decisions`."""
    decide = policy_set.decide if cached else policy_set.decide_uncached
    timing = time_decisions(decide, keys, calls)
    return Row(
        set=name,
        keys=len(keys),
        mode="cached" if cached else "uncached",
        p50_us=timing["p50_us"],
        p99_us=timing["p99_us"],
        max_us=timing["max_us"],
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=200_000, help="timed calls per row")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    rows = []
    for name, build in (("examples", example_set), ("large", large_set)):
        policy_set, keys = build()
        for cached in (True, False):
            rows.append(measure(name, policy_set, keys, args.calls, cached))
    if args.json:
        report = {"python": platform.python_version(), "rows": [asdict(r) for r in rows]}
        print(json.dumps(report, indent=2))
        return 0
    print(f"policy decision cost, python {platform.python_version()}, {args.calls} calls/row")
    print(f"{'set':<10}{'keys':>6}  {'mode':<9}{'p50 us':>9}{'p99 us':>9}{'max us':>9}")
    for row in rows:
        print(
            f"{row.set:<10}{row.keys:>6}  {row.mode:<9}{row.p50_us:>9.2f}"
            f"{row.p99_us:>9.2f}{row.max_us:>9.1f}"
        )
    for mode in ("cached", "uncached"):
        worst = max(row.p99_us for row in rows if row.mode == mode)
        verdict = "within" if worst <= BUDGET_US else "OVER"
        print(f"{mode} p99 {verdict} the {BUDGET_US} us budget (worst {worst:.2f} us)")
    return 0
