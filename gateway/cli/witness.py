"""`owngate witness`: run a C2SP tlog-witness that cosigns provenance-log checkpoints.

    owngate witness init --state FILE
    owngate witness serve --key WITNESS_KEY_FILE --log VKEY [--log VKEY] --state FILE [--workers N]
    owngate witness vkey --key WITNESS_KEY_FILE

The witness key is an ordinary Ed25519 signing key file (`owngate keys new --signing
NAME --key-file F`, NAME being the witness's name, e.g. `witness.example.com/w1`); `vkey`
prints the cosignature verifier key (algorithm 0x04) that auditors and the gateway use.
Each `--log` is a log's verifier key (or a file of them) whose name is the log's origin;
`--workers N` also takes the logs `<origin>/worker-1` .. `<origin>/worker-N` that `owngate
serve --workers N` writes and signs with that key.
`init` creates a new witness's empty state file; `serve` never does: a state file gone
missing (a wiped volume, a typo in the path) would make a witness that cosigns a rollback
or a fork. Exit codes: 0 ok (serve: clean shutdown), 1 runtime failure (unreadable key,
state missing, in use or corrupt; init: the file exists), 2 usage error. Every flag has
an environment default `OWNGATE_WITNESS_<FLAG>`; `OWNGATE_WITNESS_LOG` lists keys
separated by commas or spaces. uvicorn is imported only when `serve` runs. What it prints
of the key files (the witness's verifier key, the origins it witnesses, a file's problem)
goes through `shown` (gateway/provenance/audit/shown.py): a key name is any text without
space or '+', ESC too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from gateway.cli._logging import add_logging_flags, start_logging
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown
from gateway.provenance.errors import ProvenanceError
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.keys import load_signer, load_verifiers
from gateway.provenance.witness.app import MAX_HELD_BODY, PEER_SHARE, create_witness_app
from gateway.provenance.witness.state import WitnessState
from gateway.provenance.witness.witness import MAX_WORKERS, Witness

__all__ = ["register"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"OWNGATE_WITNESS_{name}", default)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _key_flag(parser: argparse.ArgumentParser) -> None:
    default = _env("KEY")
    parser.add_argument(
        "--key",
        default=default,
        required=default is None,
        metavar="FILE",
        help="the witness's signing key file, mode 0600 (env OWNGATE_WITNESS_KEY)",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "witness",
        help="run a transparency-log witness (C2SP tlog-witness) for provenance logs",
        description="A cosigner an auditor runs: it remembers the latest checkpoint of each "
        "trusted log, cosigns a new one only when a consistency proof shows the log grew "
        "append-only, and never cosigns a rollback or a fork, across restarts too.",
        epilog="Exit codes: 0 ok, 1 runtime failure, 2 usage error.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    _add_init(verbs)
    _add_serve(verbs)
    _add_vkey(verbs)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _add_serve(verbs: Any) -> None:
    serve = verbs.add_parser(
        "serve",
        help="serve POST /add-checkpoint",
        description="Serve the tlog-witness add-checkpoint endpoint. Answers 200 with a "
        "timestamped Ed25519 cosignature, 409 (text/x.tlog.size) with the size it last "
        "cosigned, 400 malformed, 403 untrusted signature, 404 unknown log, 422 bad proof.",
    )
    _key_flag(serve)
    logs = [item for item in (_env("LOG") or "").replace(",", " ").split() if item]
    serve.add_argument(
        "--log",
        action="append",
        default=None,
        required=not logs,
        metavar="VKEY",
        help="verifier key of a log to witness (its name is the log's origin), or a file "
        "of them; repeat for more logs or rotated keys (env OWNGATE_WITNESS_LOG)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=int(_env("WORKERS", "0") or "0"),
        metavar="N",
        help="also witness each --log key's `owngate serve --workers N` logs, the origins "
        f"<its name>/worker-1 .. <its name>/worker-N (0..{MAX_WORKERS}; env "
        "OWNGATE_WITNESS_WORKERS, default 0: none)",
    )
    _state_flag(
        serve,
        "JSON file of the latest cosigned tree per log (`witness init` creates it), "
        "locked while serving; refused when missing (env OWNGATE_WITNESS_STATE)",
    )
    serve.add_argument(
        "--host",
        default=_env("HOST", "127.0.0.1"),
        help="listen address (env OWNGATE_WITNESS_HOST, default 127.0.0.1)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=int(_env("PORT", "7380") or "7380"),
        help="listen port (env OWNGATE_WITNESS_PORT, default 7380)",
    )
    serve.add_argument(
        "--prefix",
        default=_env("PREFIX", ""),
        help="submission prefix: serve <prefix>/add-checkpoint (env OWNGATE_WITNESS_PREFIX)",
    )
    serve.add_argument(
        "--max-held-body-bytes",
        type=int,
        default=int(_env("MAX_HELD_BODY_BYTES", str(MAX_HELD_BODY)) or MAX_HELD_BODY),
        metavar="BYTES",
        help="request bodies all connections may hold at once; past it 429 with "
        "retry-after: 1 (env OWNGATE_WITNESS_MAX_HELD_BODY_BYTES, default 32 MiB)",
    )
    serve.add_argument(
        "--max-held-body-bytes-per-peer",
        type=int,
        default=int(_env("MAX_HELD_BODY_BYTES_PER_PEER", "0") or "0") or None,
        metavar="BYTES",
        help="request bodies one peer's connections (one address; an IPv6 /64) may hold at "
        "once; past it 429 with retry-after: 1 (env OWNGATE_WITNESS_MAX_HELD_BODY_BYTES_"
        f"PER_PEER, default a {PEER_SHARE}th of --max-held-body-bytes)",
    )
    add_logging_flags(serve, "OWNGATE_WITNESS_")
    serve.set_defaults(handler=_serve, _log_defaults=logs)


def _state_flag(parser: argparse.ArgumentParser, text: str) -> None:
    state = _env("STATE")
    parser.add_argument("--state", default=state, required=state is None, metavar="FILE", help=text)


def _add_init(verbs: Any) -> None:
    init = verbs.add_parser(
        "init",
        help="create a new witness's empty state file",
        description="Create the state file of a new witness, empty. `serve` refuses a "
        "missing state file, so that a lost one is noticed rather than silently replaced: "
        "a witness that forgot what it cosigned would cosign a rollback or a fork. Run it "
        "once, for a new witness; a witness whose state is lost needs a new key too.",
    )
    _state_flag(init, "the state file to create; it must not exist (env OWNGATE_WITNESS_STATE)")
    init.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    try:
        WitnessState.open(args.state, new=True).close()
    except (ProvenanceError, OSError) as exc:
        print(f"error: {shown(exc, MAX_SHOWN_MESSAGE)}", file=sys.stderr)
        return 1
    print(f"created an empty witness state: {shown(args.state)}", file=sys.stderr)
    return 0


def _add_vkey(verbs: Any) -> None:
    vkey = verbs.add_parser(
        "vkey",
        help="print the witness's cosignature verifier key",
        description="Print the verifier key (name+hexid+base64(0x04 || public key)) to give "
        "to the gateway and to auditors who check this witness's cosignatures.",
    )
    _key_flag(vkey)
    vkey.set_defaults(handler=_vkey)


def _vkey(args: argparse.Namespace) -> int:
    try:
        cosigner = Cosigner(load_signer(args.key))
    except (ProvenanceError, OSError) as exc:
        print(f"error: {shown(exc, MAX_SHOWN_MESSAGE)}", file=sys.stderr)
        return 1
    print(shown(cosigner.vkey, None))  # the whole key: the file holding it is bounded
    return 0


def _serve(args: argparse.Namespace) -> int:
    if not 0 <= args.workers <= MAX_WORKERS:
        print(f"error: --workers is 0..{MAX_WORKERS}, not {args.workers}", file=sys.stderr)
        return 2
    try:
        cosigner = Cosigner(load_signer(args.key))
        logs = load_verifiers(args.log or args._log_defaults)
        if not logs:
            print("error: --log names no log verifier key; nothing to witness", file=sys.stderr)
            return 2
        witness = Witness.open(args.state, cosigner, logs, workers=args.workers)
    except (ProvenanceError, OSError) as exc:
        print(f"error: {shown(exc, MAX_SHOWN_MESSAGE)}", file=sys.stderr)
        return 1
    with witness:
        start_logging(args)
        import uvicorn  # only here: the provenance package and auditors never need it

        from gateway.serving import uvicorn_config

        try:
            app = create_witness_app(
                witness,
                prefix=args.prefix,
                max_held_body=args.max_held_body_bytes,
                max_held_body_per_peer=args.max_held_body_bytes_per_peer,
            )
        except ValueError as exc:  # a per-peer part too small for one body
            print(f"error: --max-held-body-bytes-per-peer: {exc}", file=sys.stderr)
            return 2
        origins = ", ".join(shown(origin) for origin in witness.origins)
        if witness.workers:
            origins += f" (each with its logs /worker-1 .. /worker-{witness.workers})"
        print(
            f"witness {shown(cosigner.vkey, None)}\ncosigning for: {origins}\n"
            f"listening on {args.host}:{args.port}{args.prefix.rstrip('/')}/add-checkpoint",
            file=sys.stderr,
            flush=True,
        )
        server = uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port))
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled
            server.run()
    return 0
