"""`owngate attest`: run the countersigning sidecar beside a private inference server.

Every flag has an environment default `OWNGATE_ATTEST_<FLAG>`. Exit codes: 0 after a
clean shutdown, 1 when the key, log or TLS files cannot be used, 2 on bad flags, 4 when it
stopped without its final checkpoint or with countersignatures it handed out not in its log.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import math
import os
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.cli._logging import add_logging_flags, start_logging

__all__ = ["register", "run"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"OWNGATE_ATTEST_{name}", default)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "attest",
        help="run the sidecar that countersigns what a private backend served",
        description="Relay requests to one inference server and countersign, for each, "
        "the request id, the commitments to the request and response bodies, a counter "
        "and the key id, with the backend host's Ed25519 key (`owngate keys new --signing "
        "NAME --key-file FILE` makes one); keep the statements in an append-only log "
        "(C2SP tlog, its own origin). Point the gateway's backend base_url at it and set "
        "the backend's `attest: {key: VKEY}` (docs/provenance.md). With --tls-cert and "
        "--tls-key it serves TLS, and with --client-ca it is the backend's mutual-TLS "
        "endpoint: only a client certificate chaining to that CA (the gateway's) gets an "
        "answer (docs/backend-tls.md).",
        epilog="Exit codes: 0 after a clean shutdown, 1 key, log or TLS files not usable, 2 bad "
        "flags, 4 stopped without its final checkpoint or with countersignatures it handed out "
        "not in its log.",
    )
    add = parser.add_argument
    # Number defaults are the environment's strings: argparse converts them with `type`,
    # so a bad OWNGATE_ATTEST_* value is a usage error (exit 2) like a bad flag, and never
    # a traceback in every `owngate` command that builds this parser.
    add("--listen", default=_env("LISTEN", "127.0.0.1:8101"), help="HOST:PORT to listen on")
    add("--backend", default=_env("BACKEND"), help="the inference server's root URL")
    add("--key", default=_env("KEY"), help="the backend host's signing key file (0600)")
    add("--log", default=_env("LOG"), help="directory of the sidecar's statement log")
    add("--origin", default=_env("ORIGIN"), help="the log's origin line (default: key name)")
    add(
        "--max-body-bytes",
        type=int,
        default=_env("MAX_BODY_BYTES", str(16 * 1024 * 1024)),
        help="largest request or whole response relayed (16 MiB)",
    )
    add(
        "--max-held-body-bytes",
        type=int,
        default=_env("MAX_HELD_BODY_BYTES", str(256 * 1024 * 1024)),
        help="request bodies held at once by all connections together (256 MiB, at least "
        "--max-body-bytes): past it a request is refused 429 with retry-after: 1",
    )
    add(
        "--max-held-answer-bytes",
        type=int,
        default=_env("MAX_HELD_ANSWER_BYTES", str(256 * 1024 * 1024)),
        help="whole (not streamed) answers held at once by all connections together (256 "
        "MiB, at least --max-body-bytes): past it a request is refused 429 with "
        "retry-after: 1, its answer dropped and not countersigned",
    )
    add(
        "--flush-ms",
        type=float,
        default=_env("FLUSH_MS", "200"),
        help="write statements to the log at least this often (200): a crash loses at most "
        "this much of the log, which the audit's cross-check reports",
    )
    add(
        "--checkpoint-ms",
        type=float,
        default=_env("CHECKPOINT_MS", "5000"),
        help="sign a log checkpoint this often while statements come in (5000)",
    )
    add("--tls-cert", default=_env("TLS_CERT"), help="serve TLS with this certificate (PEM)")
    add("--tls-key", default=_env("TLS_KEY"), help="the certificate's unencrypted key (PEM)")
    add(
        "--client-ca",
        default=_env("CLIENT_CA"),
        help="require a client certificate chaining to this CA (PEM): mutual TLS",
    )
    add(
        "--client-pin",
        action="append",
        default=None,
        metavar="sha256//BASE64",
        help="with --client-ca, also require the client certificate's key to be this one "
        "(repeat for several; env OWNGATE_ATTEST_CLIENT_PIN, comma-separated): only the "
        "gateway's certificate, not any other of the CA",
    )
    add(
        "--allow-any-client",
        action="store_true",
        default=_env("ALLOW_ANY_CLIENT", "") in ("1", "true", "yes"),
        help="listen on an address that is not loopback without --client-ca: whoever "
        "reaches it gets countersignatures, each one traffic that bypassed the gateway to "
        "the audit (env OWNGATE_ATTEST_ALLOW_ANY_CLIENT=1); without it that is refused",
    )
    add(
        "--allow-remote-backend",
        action="store_true",
        default=_env("ALLOW_REMOTE_BACKEND", "") in ("1", "true", "yes"),
        help="relay to a --backend that is not on loopback: the sidecar countersigns what "
        "comes back over a hop it does not authenticate, from a server that need not be on "
        "its host (env OWNGATE_ATTEST_ALLOW_REMOTE_BACKEND=1); without it that is refused",
    )
    add_logging_flags(parser, "OWNGATE_ATTEST_")
    parser.set_defaults(handler=run)


def _pins(args: argparse.Namespace) -> frozenset[str] | None:
    """The `--client-pin` values, or None when one is not `sha256//` + base64 of 32 bytes."""
    given = args.client_pin or [p for p in (_env("CLIENT_PIN") or "").split(",") if p.strip()]
    pins = frozenset(pin.strip() for pin in given)
    for pin in pins:
        digest = pin.removeprefix("sha256//")
        try:
            raw = base64.b64decode(digest, validate=True)
        except ValueError:
            return None
        if (
            not pin.startswith("sha256//")
            or len(raw) != 32
            or base64.b64encode(raw).decode() != digest
        ):
            return None
    return pins


def _loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`): only this host reaches it."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _url_host(url: str) -> str:
    """The host of a URL (`--backend`), "" when it has none or does not parse."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return ""


def run(args: argparse.Namespace) -> int:
    from gateway.attest import AttestSettings, listener_context, serve
    from gateway.provenance.audit.shown import shown
    from gateway.serving import bind_socket

    missing = [f"--{n}" for n in ("backend", "key", "log") if not getattr(args, n)]
    host, _, port = args.listen.rpartition(":")
    bad_numbers = (
        args.max_body_bytes <= 0
        or args.max_held_body_bytes < args.max_body_bytes
        or args.max_held_answer_bytes < args.max_body_bytes
        or not (math.isfinite(args.flush_ms) and args.flush_ms >= 0)
        or not (math.isfinite(args.checkpoint_ms) and args.checkpoint_ms > 0)
    )
    if missing or not host or not port.isdigit() or bad_numbers:
        print(
            f"owngate attest: need --listen HOST:PORT, --backend, --key and --log "
            f"({', '.join(missing) or 'a bad --listen or number'})",
            file=sys.stderr,
        )
        return 2
    if bool(args.tls_cert) != bool(args.tls_key) or (args.client_ca and not args.tls_cert):
        print(
            "owngate attest: --tls-cert and --tls-key go together, and --client-ca needs them",
            file=sys.stderr,
        )
        return 2
    if not (args.client_ca or args.allow_any_client or _loopback(host.strip("[]"))):
        print(
            f"owngate attest: --listen {shown(host)} is not a loopback address: without "
            "--client-ca (mutual TLS) anyone who reaches it gets countersignatures, which "
            "the audit reports as traffic that bypassed the gateway; give --client-ca, or "
            "--allow-any-client to serve any client on purpose",
            file=sys.stderr,
        )
        return 2
    backend_host = _url_host(args.backend)
    if not (args.allow_remote_backend or _loopback(backend_host)):
        print(
            f"owngate attest: --backend {shown(backend_host or args.backend)} is not a loopback "
            "address: the sidecar would countersign, as its host's, answers from a server "
            "that need not run on its host, reached over a hop nothing authenticates (a "
            "DNS or network attacker there serves what it likes, and reads every prompt); "
            "run the server beside it on loopback (or in its pod or network namespace), or "
            "give --allow-remote-backend to relay elsewhere on purpose",
            file=sys.stderr,
        )
        return 2
    pins = _pins(args)
    if pins is None or (pins and not args.client_ca):
        print(
            "owngate attest: --client-pin is sha256// and the base64 of a key's SHA-256 "
            "(as pin_spki_sha256), and needs --client-ca",
            file=sys.stderr,
        )
        return 2
    context: ssl.SSLContext | None = None
    if args.tls_cert:
        client_ca = Path(args.client_ca) if args.client_ca else None
        try:
            context = listener_context(Path(args.tls_cert), Path(args.tls_key), client_ca)
        except (OSError, ssl.SSLError) as exc:
            print(f"owngate attest: TLS files not usable: {exc}", file=sys.stderr)
            return 1
        except ValueError as exc:  # a --client-ca whose anchors contradict (tls_anchors)
            print(f"owngate attest: --client-ca {args.client_ca}: {exc}", file=sys.stderr)
            return 2
    settings = AttestSettings(
        backend=args.backend,
        key_file=Path(args.key),
        log_dir=Path(args.log),
        origin=args.origin,
        max_body=args.max_body_bytes,
        max_held_body=args.max_held_body_bytes,
        max_held_answer=args.max_held_answer_bytes,
        flush_ms=args.flush_ms,
        checkpoint_ms=args.checkpoint_ms,
        client_pins=pins,
    )
    host = host.strip("[]")
    start_logging(args)
    try:
        sock = bind_socket(host, int(port))
    except OSError as exc:
        print(f"owngate attest: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    scheme = "https" if context is not None else "http"
    mutual = " (mutual TLS)" if args.client_ca else ""
    mutual += f", {len(pins)} client key(s) pinned" if pins else ""
    # Said once the key and the log are open: before, a sidecar whose key or log could
    # not be used said it was countersigning, then exited 1.
    ready = f"owngate attest: countersigning {args.backend} on {scheme}://{args.listen}{mutual}"
    # SIGTERM/SIGINT: stop listening, let running requests finish, sign the log's final
    # checkpoint, exit 0 (4 when that or a statement's write failed for good).
    failure = serve(settings, sock, context, on_ready=lambda: print(ready, file=sys.stderr))
    if failure is not None:
        status, why = failure
        print(why, file=sys.stderr)
        return status
    return 0
