"""`owngate demo`: run the embedded demo (gateway + simulated backends)."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli._common import env_default

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the gateway with simulated backends (no GPU, Redis or network)",
        description="Start the gateway with its bundled example config, two simulated private "
        "backends (vLLM-like, llama.cpp-like) and a simulated hosted provider, all in this "
        "process. Prints a working curl and Python snippet with a fresh demo key. Ctrl-C stops.",
    )
    parser.add_argument(
        "--host",
        default=env_default("OWNGATE_DEMO_HOST", "127.0.0.1"),
        help="listen address (env OWNGATE_DEMO_HOST, default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env_default("OWNGATE_DEMO_PORT", "8080")),
        help="listen port, 0 for any free port (env OWNGATE_DEMO_PORT, default 8080)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(args.host, args.port)
