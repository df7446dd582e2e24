"""`owngate bench overhead`: the gateway's added latency and throughput, next to LiteLLM.

The work is in `gateway.bench.overhead`; this module only wires its flags into the CLI.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    from gateway.bench import overhead  # light: nothing starts at import

    parser = subparsers.add_parser("bench", help="run benchmarks")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    bench = verbs.add_parser(
        "overhead",
        help="owngate (built-in and configured trust policies) vs the bare simulator vs "
        "LiteLLM proxy, same load side by side",
        description=overhead.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    overhead.add_arguments(bench)
    bench.set_defaults(handler=overhead.run)
    _register_routing(verbs)
    _register_scale(verbs)
    _register_provenance(verbs)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _register_routing(verbs: Any) -> None:
    """`owngate bench routing`: round robin vs least in-flight vs owngate's scorer."""
    from gateway.bench import routing  # light: the simulator and router load when it runs

    verb = verbs.add_parser(
        "routing",
        help="round robin vs least in-flight vs owngate's scorer on simulated pools, the "
        "same seeded open-loop traces (TTFT, latency, queueing, decision cost)",
        description=routing.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    routing.add_arguments(verb)
    verb.set_defaults(handler=routing.run)


def _register_provenance(verbs: Any) -> None:
    """`owngate bench provenance`: the gateway with the signed log off vs on."""
    from gateway.bench import provenance_overhead  # light: nothing starts at import

    verb = verbs.add_parser(
        "provenance",
        help="owngate with the provenance log off vs on, side by side, over a zero-latency "
        "and an LLM-shaped simulator (req/s, TTFT, CPU per request, ratios)",
        description=provenance_overhead.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    provenance_overhead.add_arguments(verb)
    verb.set_defaults(handler=provenance_overhead.run)


def _register_scale(verbs: Any) -> None:
    """`owngate bench scale`: req/s and CPU per request with 1, 2 and 4 workers."""
    from gateway.bench import scale  # light: nothing starts at import

    verb = verbs.add_parser(
        "scale",
        help="owngate serve --workers 1/2/4 against the zero-latency simulator: req/s, "
        "CPU per request and where the cores went",
        description=scale.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scale.add_arguments(verb)
    verb.set_defaults(handler=scale.run)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
