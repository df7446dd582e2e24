"""`owngate serve`: run the gateway from a config file, in one process or in N workers.

Signals: SIGTERM or SIGINT drains (new connections refused, `/readyz` not ready, running
requests and streams get `limits.drain_timeout_s` to finish, what remains is cut with an
error event, a final checkpoint is signed) and exits 0; SIGHUP reloads gateway.yaml and
the trust policies. `--workers N` runs N processes sharing the port (`gateway.workers`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli._common import env_default, load_or_report
from gateway.logs import configure_logging, get_logger

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.workers import WorkerIdentity

__all__ = ["register"]

# uvicorn's own deadline comes this long after the app's: the app ends what is still
# running cleanly at its deadline (error events, completion records) before uvicorn
# would cancel it.
_CUT_MARGIN_S = 5.0


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
    parser.add_argument(
        "--workers",
        type=int,
        default=int(env_default("OWNGATE_WORKERS", "1")),
        help="worker processes sharing the port, with a supervisor that restarts them "
        "(env OWNGATE_WORKERS, default 1: one process, no supervisor)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gateway.workers import for_worker, supervise, worker_identity

    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    config = load_or_report(args.config)
    if config is None:
        return 1
    configure_logging(config.logging.format, config.logging.level)
    host = args.host or config.listen.host
    port = args.port if args.port >= 0 else config.listen.port
    identity = worker_identity(os.environ)
    if identity is None and args.workers > 1:
        return supervise(args.config, args.workers, host, port, config)
    return _serve(args.config, for_worker(identity)(config), host, port, identity)


def _serve(
    path: str, config: GatewayConfig, host: str, port: int, identity: WorkerIdentity | None
) -> int:
    from gateway.api import create_app
    from gateway.api.fleet import FleetMetrics
    from gateway.api.reload import ConfigReloader
    from gateway.assembly import AssemblyError
    from gateway.serving import DrainingServer, bind_socket, uvicorn_config
    from gateway.workers import for_worker

    try:
        app = create_app(config, config_dir=Path(path).parent)
    except AssemblyError as exc:  # fail closed: no valid policies or keys, no traffic
        print(f"error: not starting; {len(exc.problems)} problem(s):", file=sys.stderr)
        print("\n".join(f"  {problem}" for problem in exc.problems), file=sys.stderr)
        return 1
    except ValueError as exc:  # other settings only checkable at startup (shared state)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app.reloader = ConfigReloader(app, Path(path), prepare=for_worker(identity))
    app.metrics.watch_config(app.reloader)
    if identity is not None:
        app.fleet = FleetMetrics(identity.runtime_dir, identity.index)
    try:
        sock = bind_socket(host, port, reuse_port=identity is not None)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    get_logger("owngate").info(
        "starting",
        host=host,
        port=port,
        backends=len(config.backends),
        tenants=len(config.tenants),
        worker=identity.index if identity is not None else None,
    )
    server = DrainingServer(
        uvicorn_config(
            app,
            config.listen,
            timeout_graceful_shutdown=config.limits.drain_timeout_s + _CUT_MARGIN_S,
        ),
        on_drain=app.begin_drain,
        drained=app.drained,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1
