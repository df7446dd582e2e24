"""`owngate audit report`: a verified log as an auditor's report (HTML and/or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gateway.cli.audit_flags import (
    env,
    env_list,
    guarded,
    key_flag,
    local_log,
    saved_checkpoint,
    token_flag,
    trusted_keys,
    witness_key,
)
from gateway.provenance.audit.reader import read_settled
from gateway.provenance.audit.report import Invocation, audit_report
from gateway.provenance.audit.report_html import render_html
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown

__all__ = ["add_report"]


def add_report(verbs: Any) -> None:
    report = verbs.add_parser(
        "report",
        help="verify a log and write an auditor's report (self-contained HTML and/or JSON)",
        description="Run the checks of `owngate audit verify` (same flags), then write "
        "dispatches per backend and region, requests per tenant over time, fallback and "
        "refusal rates, checkpoints and cosignatures, each with the command that reproduces "
        "it. A log that fails verification gets a report that says so, without figures, "
        "and exit code 1. LOGDIR may be a URL serving the log as C2SP tlog-tiles, as for "
        "verify.",
    )
    report.add_argument("logdir", help="the log directory, or its http(s) URL (as for verify)")
    token_flag(report)
    _verify_flags(report)
    report.add_argument(
        "--html",
        metavar="FILE",
        help="write the report as one self-contained HTML file ('-': standard output)",
    )
    report.add_argument(
        "--json", metavar="FILE", help="write the same numbers as JSON ('-': standard output)"
    )
    report.set_defaults(
        handler=guarded(_report),
        _checkpoint_defaults=env_list("CHECKPOINT"),
        _witness_defaults=env_list("WITNESS_KEY"),
    )


def _write(name: str, text: str) -> None:
    """Write a report to file `name`, or to standard output for '-'."""
    if name == "-":
        sys.stdout.write(text)
    else:
        Path(name).write_text(text, encoding="utf-8")


def _verify_flags(parser: argparse.ArgumentParser) -> None:
    """The trust flags of `verify`, with the same meaning and environment defaults."""
    key_flag(parser, required=True)
    same = "as for `owngate audit verify`"
    parser.add_argument("--origin", default=env("ORIGIN"), help=f"expected origin, {same}")
    for flag in ("--checkpoint", "--witness-key"):
        parser.add_argument(flag, action="append", default=None, help=same)
    parser.add_argument(
        "--min-witnesses",
        type=int,
        default=int(env("MIN_WITNESSES", "1") or "1"),
        metavar="K",
        help=same,
    )
    parser.add_argument(
        "--accept-earlier-keys",
        action="store_true",
        default=env("ACCEPT_EARLIER_KEYS", "") in ("1", "true", "yes"),
        help=same,
    )


def _report(args: argparse.Namespace) -> int:
    if args.html is None and args.json is None:
        print("error: give --html FILE and/or --json FILE", file=sys.stderr)
        return 2
    witness_texts = args.witness_key or args._witness_defaults
    flags = [arg for key in args.key or args._key_defaults for arg in ("--key", key)]
    flags += [arg for text in witness_texts for arg in ("--witness-key", text)]
    checkpoints = args.checkpoint or args._checkpoint_defaults
    flags += [arg for name in checkpoints for arg in ("--checkpoint", name)]
    if args.origin is not None:
        flags += ["--origin", args.origin]
    if witness_texts:
        flags += ["--min-witnesses", str(args.min_witnesses)]
    if args.accept_earlier_keys:
        flags.append("--accept-earlier-keys")
    # Not verified while copying: a checkpoint the keys do not sign is the report's finding.
    with local_log(args.logdir, args) as logdir:
        result = read_settled(  # a live gateway's log may take a checkpoint meanwhile
            logdir,
            lambda: audit_report(
                logdir,
                trusted_keys(args),
                Invocation(args.logdir, tuple(flags)),
                origin=args.origin,
                trusted_checkpoints=[saved_checkpoint(name) for name in checkpoints],
                witnesses=[witness_key(text) for text in witness_texts],
                min_witnesses=args.min_witnesses,
                accept_earlier_keys=args.accept_earlier_keys,
                now=time.time(),
            ),
            failed=lambda found: not found["verification"]["ok"],
        )
    if args.json is not None:
        _write(args.json, json.dumps(result, indent=2) + "\n")
    if args.html is not None:
        _write(args.html, render_html(result))
    verification = result["verification"]
    if not verification["ok"]:
        failure = shown(verification["error"], MAX_SHOWN_MESSAGE)
        print(f"FAILED: {failure} (the report says so)", file=sys.stderr)
        return 1
    return 0
