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
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
