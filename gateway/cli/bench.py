"""`owngate bench VERB`: the benchmarks, which are not part of the runtime wheel.

They live in their own distribution, `owngate-bench` (the `bench/` directory of the
source tree, import package `owngate_bench`), so that the server installs no benchmark
code and nothing that installs packages. When it is installed, its verbs are added here;
when it is not, `owngate bench ...` says how to install it and exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

__all__ = ["INSTALL_HINT", "register"]

INSTALL_HINT = (
    "owngate bench: the benchmarks are not installed. They are a separate distribution, "
    "owngate-bench, in the bench/ directory of owngate's source tree; from a checkout, "
    "after owngate itself: pip install -e ./bench (make test and make bench install it)."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="run benchmarks (the owngate-bench distribution)")
    try:
        # Light: nothing starts at import; the simulators and gateways start in `run`.
        verbs = importlib.import_module("owngate_bench.cli")
    except ModuleNotFoundError as exc:
        if exc.name != "owngate_bench":
            raise  # installed but broken: say what is missing, not that it is absent
        parser.description = INSTALL_HINT
        parser.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        parser.set_defaults(handler=_not_installed)
        return
    verbs.add_verbs(parser)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _not_installed(_args: argparse.Namespace) -> int:
    print(INSTALL_HINT, file=sys.stderr)
    return 1


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
