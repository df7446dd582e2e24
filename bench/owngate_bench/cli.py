"""The benchmark verbs: `owngate bench VERB` and `python -m owngate_bench VERB`.

`add_verbs` is what `gateway.cli.bench` calls when this distribution is installed; `main`
is the same command line without the `owngate` front end. Verb modules are imported only
when the parser is built, and nothing starts at import: servers start in `run`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

__all__ = ["VERBS", "add_verbs", "main"]

VERBS: dict[str, tuple[str, str]] = {
    "overhead": (
        "overhead",
        "owngate (built-in and configured trust policies) vs the bare simulator vs "
        "LiteLLM proxy, same load side by side",
    ),
    "routing": (
        "routing",
        "round robin vs least in-flight vs owngate's scorer on simulated pools, the "
        "same seeded open-loop traces (TTFT, latency, queueing, decision cost)",
    ),
    "scale": (
        "scale",
        "owngate serve --workers 1/2/4 against the zero-latency simulator: req/s, "
        "CPU per request and where the cores went",
    ),
    "seed-load": (
        "seedload",
        "the seeds' GH200 (200 streams/s, ~23,000 paced tokens/s, one write per token) "
        "through direct / nginx / owngate / owngate+production, side by side: cores, TTFT, "
        "ITL, verdicts",
    ),
    "provenance": (
        "provenance_overhead",
        "owngate with the provenance log off vs on, side by side, over a zero-latency "
        "and an LLM-shaped simulator (req/s, TTFT, CPU per request, ratios)",
    ),
    "receipts": (
        "receipts",
        "provenance receipts signed per request (v1) vs per committed batch (v2), side "
        "by side over a zero-latency simulator (req/s, CPU per request at c=1 and 16)",
    ),
    "attest": (
        "attest",
        "what the owngate attest sidecar adds: direct vs via sidecar vs via gateway vs "
        "via gateway + sidecar (p50 latency, sidecar CPU per request)",
    ),
    "instructions": (
        "instructions",
        "instructions per request (and per chunk) of owngate plain vs the production "
        "configuration, counted by valgrind's callgrind: steady on a shared machine",
    ),
    "provenance-log": (
        "provenance_log",
        "the provenance log alone: fsync latency, append throughput with group commit, "
        "checkpoint signing, verify speed",
    ),
    "policy": (
        "policy",
        "p50/p99 of a trust-policy decision, cached and uncached, on the shipped "
        "examples and a large synthetic set",
    ),
    "workloads": (
        "workloads",
        "the seeds' workload suites (chat, RAG, office, long context, rate sweep) on a "
        "real llama-server or a GH200-class simulator: direct vs owngate plain vs "
        "production, interleaved repetitions, ratios and verdicts; real-server routing",
    ),
    "state": (
        "state",
        "what shared state (memory, and Redis when given a URL) adds to each request's "
        "admission and release",
    ),
}
"""verb -> (module under owngate_bench, one-line help)"""


def add_verbs(parser: argparse.ArgumentParser) -> None:
    """Add every verb to `parser` (the `bench` command's), each with `handler=run`."""
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        module: Any = importlib.import_module(f"owngate_bench.{module_name}")
        sub = verbs.add_parser(
            verb,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m owngate_bench VERB ...`: exit code of the verb, 2 without one."""
    parser = argparse.ArgumentParser(
        prog="python -m owngate_bench", description="owngate's benchmarks, as `owngate bench`."
    )
    add_verbs(parser)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = handler(args)
    return code
