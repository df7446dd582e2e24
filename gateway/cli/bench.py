"""`owngate bench VERB`: the benchmarks under `gateway.bench`, wired into the CLI.

Each verb's module has the work, its own flags (`add_arguments`) and `run`; its
docstring is the verb's description. Modules are imported only when `bench` is used.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

__all__ = ["register"]

# verb -> (module under gateway.bench, one-line help)
_VERBS: dict[str, tuple[str, str]] = {
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
    "provenance": (
        "provenance_overhead",
        "owngate with the provenance log off vs on, side by side, over a zero-latency "
        "and an LLM-shaped simulator (req/s, TTFT, CPU per request, ratios)",
    ),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="run benchmarks")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in _VERBS.items():
        # Light: nothing starts at import; the simulators and gateways start in `run`.
        module = importlib.import_module(f"gateway.bench.{module_name}")
        sub = verbs.add_parser(
            verb,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
