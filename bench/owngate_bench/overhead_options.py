"""The overhead benchmark's flags (`add_arguments`) and the run they resolve to (`Plan`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from owngate_bench import litellm_proxy
from owngate_bench.overhead_points import POINTS, Point, select_points
from owngate_bench.overhead_targets import TARGETS
from owngate_bench.services import env_flag

__all__ = ["Plan", "add_arguments", "plan_from"]


def _flag(name: str) -> bool:
    return env_flag(name, "").strip().lower() in {"1", "true", "yes", "on"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, each with an OWNGATE_BENCH_* environment default."""
    add = parser.add_argument
    add(
        "--duration",
        type=float,
        default=env_flag("DURATION", "5"),
        help="measured seconds per load point, target and repetition (env "
        "OWNGATE_BENCH_DURATION, 5)",
    )
    add(
        "--reps",
        type=int,
        default=env_flag("REPS", "0"),
        help="interleaved repetitions per point, medians reported; 0 = 3 (1 with --quick) "
        "(env OWNGATE_BENCH_REPS)",
    )
    add(
        "--requests",
        type=int,
        default=env_flag("REQUESTS", "0"),
        help="cap on measured requests per point, 0 = none (env OWNGATE_BENCH_REQUESTS)",
    )
    add(
        "--json",
        type=Path,
        default=env_flag("JSON", ".bench/overhead.json"),
        help="where to write the results (env OWNGATE_BENCH_JSON, .bench/overhead.json)",
    )
    add(
        "--targets",
        default=env_flag("TARGETS", ",".join(TARGETS)),
        help=f"comma-separated targets to run, of {', '.join(TARGETS)} (env OWNGATE_BENCH_TARGETS)",
    )
    add(
        "--points",
        default=env_flag("POINTS", ""),
        help="comma-separated load points to run (default all), of "
        f"{', '.join(p.name for p in POINTS)} (env OWNGATE_BENCH_POINTS)",
    )
    add(
        "--skip-litellm",
        action="store_true",
        default=_flag("SKIP_LITELLM"),
        help="leave LiteLLM out (env OWNGATE_BENCH_SKIP_LITELLM=1)",
    )
    add(
        "--litellm-version",
        default=env_flag("LITELLM_VERSION", litellm_proxy.DEFAULT_VERSION),
        help="litellm[proxy] release; only the one litellm-proxy.lock pins is installed "
        f"(env OWNGATE_BENCH_LITELLM_VERSION, {litellm_proxy.DEFAULT_VERSION})",
    )
    add(
        "--litellm-venv",
        type=Path,
        default=env_flag("LITELLM_VENV", ".bench/litellm-venv"),
        help="virtualenv for LiteLLM, made from litellm-proxy.lock (hashes) on first use "
        "(env OWNGATE_BENCH_LITELLM_VENV)",
    )
    add(
        "--quick",
        action="store_true",
        default=_flag("QUICK"),
        help="a very short run for CI smoke tests, numbers mean little (env OWNGATE_BENCH_QUICK=1)",
    )
    add(
        "--check",
        action="store_true",
        default=_flag("CHECK"),
        help="exit 1 unless every verdict is met: one not met or not measured (a point "
        "not run, a target failed, nginx missing) fails (env OWNGATE_BENCH_CHECK=1)",
    )
    add(
        "--policy-calls",
        type=int,
        default=env_flag("POLICY_CALLS", "0"),
        help="timed policy decisions per mode, 0 = 200,000 (20,000 with --quick) "
        "(env OWNGATE_BENCH_POLICY_CALLS)",
    )


@dataclasses.dataclass
class Plan:
    """Resolved options of one run."""

    targets: tuple[str, ...]
    points: tuple[Point, ...]
    reps: int
    duration_s: float
    warmup_s: float
    max_requests: int | None
    json_path: Path
    litellm_version: str
    litellm_venv: Path
    check: bool
    quick: bool
    policy_calls: int


def plan_from(args: argparse.Namespace) -> Plan:
    targets = tuple(t.strip() for t in str(args.targets).split(",") if t.strip())
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(f"--targets takes names of {', '.join(TARGETS)}, got {args.targets!r}")
    if args.skip_litellm:
        targets = tuple(t for t in targets if t != "litellm")
    if args.duration <= 0 or args.requests < 0 or args.policy_calls < 0 or args.reps < 0:
        raise ValueError("--duration must be > 0, --requests, --reps, --policy-calls >= 0")
    duration = min(args.duration, 0.4) if args.quick else args.duration
    return Plan(
        targets=tuple(t for t in TARGETS if t in targets),
        points=select_points(str(args.points)),
        reps=args.reps or (1 if args.quick else 3),
        duration_s=duration,
        warmup_s=0.1 if args.quick else min(1.0, max(0.2, duration / 5)),
        max_requests=(args.requests or 300) if args.quick else (args.requests or None),
        json_path=args.json,
        litellm_version=args.litellm_version,
        litellm_venv=args.litellm_venv,
        check=args.check,
        quick=args.quick,
        policy_calls=args.policy_calls or (20_000 if args.quick else 200_000),
    )
