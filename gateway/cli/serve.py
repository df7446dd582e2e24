"""`owngate serve`: run the gateway from a config file, in one process or in N workers.

Signals: SIGTERM or SIGINT drains (new connections refused, `/readyz` not ready, running
requests and streams get `limits.drain_timeout_s` to finish, what remains is cut with an
error event, a final checkpoint is signed) and exits 0; SIGINT once uvicorn's own
shutdown began forces it (what still runs is cut at once, the final checkpoint still
signed: `DrainingServer`); SIGHUP reloads gateway.yaml and the trust policies.
`--workers N` runs N processes sharing the port (`gateway.workers`).
Exit codes: `_EPILOG` below (printed by `owngate serve --help`; also in README and
docs/deploy.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli._common import env_default, load_file_or_report
from gateway.logs import bind_process, configure_logging, get_logger

if TYPE_CHECKING:
    from socket import socket

    from gateway.api.app import GatewayApp
    from gateway.config import GatewaySettings
    from gateway.serving import BesideServer
    from gateway.worker_identity import WorkerIdentity

__all__ = ["register"]

# uvicorn's own deadline comes this long after the app's: the app ends what is still
# running cleanly at its deadline (error events, completion records) before uvicorn
# would cancel it.
_CUT_MARGIN_S = 5.0

EXIT_OK = 0
EXIT_NOT_STARTED = 1
EXIT_USAGE = 2
EXIT_LOG_UNAVAILABLE = 3  # uvicorn's own code for a failed lifespan startup, kept
EXIT_FINAL_CHECKPOINT = 4
_EPILOG = """\
exit codes:
  0  stopped by SIGTERM/SIGINT after draining; the final checkpoint is signed
  1  did not start: invalid config, policies or key settings, or the port cannot be
     bound; with --workers N, also a worker that kept dying at start or did not exit 0
  2  usage: bad flags
  3  did not start: the app's startup failed, i.e. the provenance log could not be
     opened (signing key missing or invalid, directory not writable, disk full while
     recovering, damaged log, or another process holds it), or the log directory
     holds less than the log already signed under its origin (emptied, deleted or
     restored from an older copy: the high-water file says so; see --new-log-origin)
  4  stopped, but the final checkpoint could not be signed (e.g. a full disk): what was
     logged since the last checkpoint is in the write-ahead segment, and the next start
     recovers and signs it once the disk takes writes
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway. Refuses to start (exit 1) when the config is invalid.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.add_argument(
        "--new-log-origin",
        action="store_true",
        default=env_default("OWNGATE_NEW_LOG_ORIGIN", "").strip().lower() in ("1", "true", "yes"),
        help="start a new provenance log under provenance.origin although the high-water "
        "file records another origin's log (after a lost or retired log directory; never "
        "needed for a first start; env OWNGATE_NEW_LOG_ORIGIN=1)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gateway.worker_identity import for_worker, worker_identity
    from gateway.workers import supervise

    _ignore_sighup_until_served()
    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    read_at = time.time()  # before the files are read (`create_app`'s config_read_at)
    loaded = load_file_or_report(args.config)
    if loaded is None:
        return EXIT_NOT_STARTED
    config, text = loaded
    configure_logging(config.logging.format, config.logging.level)
    host = args.host or config.listen.host
    port = args.port if args.port >= 0 else config.listen.port
    identity = worker_identity(os.environ)
    if identity is not None:
        # Every line a worker logs says which worker (a failed reload, a log that cannot be
        # written or opened): before, a policy one worker failed to read was logged with no
        # hint which of the N it was, while the others enforced the new one. Not a
        # contextvar: uvicorn's lines (a refused startup) and threads' did not carry it.
        bind_process(worker=identity.index)
    if identity is None and args.workers > 1:
        once = ["--new-log-origin"] if args.new_log_origin else []  # each worker's first start
        return supervise(args.config, args.workers, host, port, config, first_start_flags=once)
    return _serve(
        args.config,
        for_worker(identity, Path(args.config).parent)(config),
        host,
        port,
        identity,
        read_at,
        new_log_origin=args.new_log_origin,
        text=text,
    )


def _ignore_sighup_until_served() -> None:
    """SIGHUP's default action ends the process: a reload asked for while the gateway
    starts (a deploy script's `kill -HUP` right after starting it) must not stop it. The
    app handles SIGHUP once it serves; its first look at the config file after start
    reloads it, so the request is not lost. (The supervisor of `--workers` sets its own.)"""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _serve(
    path: str,
    config: GatewaySettings,
    host: str,
    port: int,
    identity: WorkerIdentity | None,
    read_at: float | None = None,
    *,
    new_log_origin: bool = False,
    text: str = "",
) -> int:
    from gateway.api.fleet import FleetMetrics
    from gateway.api.recorder_log import NEW_LOG_ORIGIN_ENV
    from gateway.app import AssemblyError, create_app
    from gateway.config.env_refs import unquoted
    from gateway.serving import (
        STARTUP_FAILURE,
        DrainingServer,
        bind_socket,
        run_beside,
        settle_heap,
        uvicorn_config,
    )
    from gateway.worker_identity import for_worker

    try:
        app = create_app(
            config,
            environ={**os.environ, NEW_LOG_ORIGIN_ENV: "1"} if new_log_origin else None,
            config_dir=Path(path).parent,
            config_file=Path(path),
            prepare=for_worker(identity, Path(path).parent),
            config_read_at=read_at,
        )
    except AssemblyError as exc:  # fail closed: no valid policies or keys, no traffic
        problems = unquoted(list(exc.problems), text, os.environ)  # `text`: the config's
        print(f"error: not starting; {len(problems)} problem(s):", file=sys.stderr)
        print("\n".join(f"  {problem}" for problem in problems), file=sys.stderr)
        return EXIT_NOT_STARTED
    except ValueError as exc:  # other settings only checkable at startup (shared state)
        print(f"error: {unquoted([str(exc)], text, os.environ)[0]}", file=sys.stderr)
        return EXIT_NOT_STARTED
    if identity is not None:
        app.fleet = FleetMetrics(identity.runtime_dir, identity.index)
    try:
        # A worker's socket joins the port's group only once its app has started (uvicorn
        # listens when it starts serving): the kernel hands new connections to the
        # listening sockets at once, and those queued on a worker whose startup then
        # fails (its log cannot be opened: it keeps dying and is retried every 5 s) were
        # reset when it exited, while the other workers served.
        sock = bind_socket(host, port, reuse_port=identity is not None, listen=identity is None)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return EXIT_NOT_STARTED
    try:
        admin = _admin_server(app, config) if identity is None else None
    except OSError as exc:
        sock.close()
        listen = config.admin.listen
        where = f"{listen.host}:{listen.port}" if listen is not None else "?"
        print(f"error: cannot listen on {where} (admin.listen): {exc}", file=sys.stderr)
        return EXIT_NOT_STARTED
    get_logger("owngate").info(
        "starting",
        host=host,
        port=port,
        admin=None if admin is None else f"{admin[0].config.host}:{admin[1].getsockname()[1]}",
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
    settle_heap()  # after the app is built, before the first request
    try:
        if admin is None:
            run_beside(server, [sock])
        else:
            run_beside(server, [sock], admin[0], [admin[1]])
    except SystemExit as exc:
        if exc.code != STARTUP_FAILURE:
            raise
        # The app refused to start (its lifespan startup failed; uvicorn logged why).
        print("error: the gateway's startup failed (see the log above)", file=sys.stderr)
        return EXIT_LOG_UNAVAILABLE
    finally:
        sock.close()
        if admin is not None:
            admin[1].close()
    if not server.started:
        return EXIT_NOT_STARTED
    if app.shutdown_error is not None:
        print(f"error: {app.shutdown_error}", file=sys.stderr)
        return EXIT_FINAL_CHECKPOINT
    return EXIT_OK


def _admin_server(app: GatewayApp, config: GatewaySettings) -> tuple[BesideServer, socket] | None:
    """The admin API's server and its bound socket (raises OSError when the port cannot be
    bound), or None: `admin.listen` is null, or no admin access is configured (no
    `admin.tokens`, `admin.token_hashes` or `allow_loopback`: it would answer only 401).
    Under `serve --workers` no worker opens it (each holds its own state; docs/admin-api.md)."""
    from gateway.app import admin_server
    from gateway.serving import bind_socket

    settings = config.admin
    listen = settings.listen
    if listen is None or not (settings.tokens or settings.token_hashes or settings.allow_loopback):
        return None
    sock = bind_socket(listen.host, listen.port)
    return admin_server(app), sock
