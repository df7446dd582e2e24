"""`owngate serve`: run the gateway from a config file."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

import uvicorn

from gateway.cli._common import env_default, load_or_report
from gateway.logs import configure_logging, get_logger

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway. Refuses to start (exit 1) when the config is invalid.",
    )
    parser.add_argument(
        "--config",
        default=env_default("OWNGATE_CONFIG", "gateway.yaml"),
        help="path to gateway.yaml (env OWNGATE_CONFIG, default ./gateway.yaml)",
    )
    parser.add_argument(
        "--host",
        default=env_default("OWNGATE_HOST", ""),
        help="override listen.host (env OWNGATE_HOST)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env_default("OWNGATE_PORT", "-1")),
        help="override listen.port (env OWNGATE_PORT)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gateway.api import create_app
    from gateway.policy import PolicyError
    from gateway.serving import uvicorn_config

    config = load_or_report(args.config)
    if config is None:
        return 1
    configure_logging(config.logging.format, config.logging.level)
    host = args.host or config.listen.host
    port = args.port if args.port >= 0 else config.listen.port
    try:
        app = create_app(config, config_dir=Path(args.config).parent)
    except PolicyError as exc:  # fail closed: no valid policies, no traffic
        print(f"error: the trust policies are invalid; not starting:\n{exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # settings only checkable at startup (env keys, key hashes)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    get_logger("owngate").info(
        "starting", host=host, port=port, backends=len(config.backends), tenants=len(config.tenants)
    )
    server = uvicorn.Server(
        uvicorn_config(
            app,
            host=host,
            port=port,
            # Streams get this long to finish; the final checkpoint is signed after.
            timeout_graceful_shutdown=config.limits.drain_timeout_s,
        )
    )
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled
        server.run()
    return 0
