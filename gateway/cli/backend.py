"""`owngate backend cert ca|issue`: certificates for authenticated private backends.

`ca --out DIR` makes a CA (ca.pem, ca-key.pem); `issue` signs a backend's server
certificate (its host, and the region/owner/retention facts as URI SANs for
`identity: certificate`) or, with `--client`, the gateway's client certificate for mutual
TLS. `issue` prints the certificate's `tls.pin_spki_sha256` entry. Files are never
overwritten; keys are written mode 0600. docs/backend-tls.md shows the same with
cert-manager and step-ca.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.cli._common import env_default, usage

__all__ = ["register"]

_MAX_PEM = 1024 * 1024  # a CA certificate or key is a few kB: a bound on a wrong path
# What `--name` may be besides an IP address: a host name (tls.server_name's pattern). It
# is also the files' name: no `/`, no `..` to climb out of --out, nothing invisible.
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")
_MAX_DAYS = 36500.0  # past this, dates leave what certificates (and datetime) can write


def _name(value: str) -> str:
    """`--name`: a host name or an IP address (without an IPv6 zone: `ipaddress` takes any
    text after `%`, spaces and control characters included, and a certificate's IP SAN
    has none)."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    zoned = isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None
    if zoned or (address is None and (not _HOST.match(value) or ".." in value)):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a host name (letters, digits, '.' and '-') or an IP address "
            "(without a zone)"
        )
    return value


def _days(value: str) -> float:
    """`--days`: a validity above zero, at most `_MAX_DAYS`."""
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of days") from None
    if not (math.isfinite(days) and 0 < days <= _MAX_DAYS):
        raise argparse.ArgumentTypeError(f"days must be above 0 and at most {_MAX_DAYS:g}")
    return days


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("backend", help="certificates for private backends (TLS)")
    nouns = parser.add_subparsers(dest="noun", metavar="NOUN")
    cert = nouns.add_parser(
        "cert",
        help="make a CA, and issue backend server and gateway client certificates",
        description="Exit codes: 0 written, 1 failed (unreadable CA, a file already there, "
        "a fact that breaks the owngate:<fact>:<value> grammar), 2 usage.",
    )
    verbs = cert.add_subparsers(dest="verb", metavar="VERB")
    ca = verbs.add_parser("ca", help="make a CA: DIR/ca.pem and DIR/ca-key.pem")
    ca.add_argument("--out", required=True, help="directory to write into")
    ca.add_argument("--name", default="owngate backend CA", help="the CA's common name")
    ca.add_argument("--days", type=_days, default=3650, help="validity (default 3650)")
    ca.set_defaults(handler=_ca)
    issue = verbs.add_parser(
        "issue",
        help="issue a server (or --client) certificate: DIR/NAME.pem and DIR/NAME-key.pem",
    )
    issue.add_argument(
        "--ca-cert", default=env_default("OWNGATE_CA_CERT", "ca.pem"), help="env OWNGATE_CA_CERT"
    )
    issue.add_argument(
        "--ca-key", default=env_default("OWNGATE_CA_KEY", "ca-key.pem"), help="env OWNGATE_CA_KEY"
    )
    issue.add_argument(
        "--name", required=True, type=_name, help="the backend's host name or IP (SAN)"
    )
    issue.add_argument("--region", help="owngate:region:<REGION>, e.g. eu-west-1")
    issue.add_argument("--owner", help="owngate:owner:<OWNER>")
    issue.add_argument(
        "--retention",
        help="owngate:retention:<none|Nd[+zdr]>[+training], e.g. none, 30d, 30d+zdr "
        "(+zdr: zero_data_retention with days kept)",
    )
    issue.add_argument(
        "--client", action="store_true", help="the gateway's client certificate (mutual TLS)"
    )
    issue.add_argument(
        "--days", type=_days, default=90, help="validity (default 90; within the CA's)"
    )
    issue.add_argument("--out", required=True, help="directory to write into")
    issue.set_defaults(handler=_issue)
    parser.set_defaults(handler=lambda _args: usage(parser))
    cert.set_defaults(handler=lambda _args: usage(cert))


def _ca(args: argparse.Namespace) -> int:
    from gateway.pki import make_ca

    ca = make_ca(args.name, now=datetime.now(UTC), days=args.days)
    return _write(Path(args.out), "ca", ca.cert_pem, ca.key_pem, None)  # pins name leaves


def _issue(args: argparse.Namespace) -> int:
    from gateway.pki import chain_above, fact_uris, issue, load_issued
    from gateway.small_files import read_small_file

    try:
        ca_file = read_small_file(Path(args.ca_cert), _MAX_PEM)
        ca = load_issued(ca_file, read_small_file(Path(args.ca_key), _MAX_PEM))
        chain = chain_above(ca_file)
    except OSError as exc:
        print(f"cannot read the CA: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        print(
            f"{args.ca_cert} and {args.ca_key}: not a usable CA certificate and key ({exc})",
            file=sys.stderr,
        )
        return 1
    try:
        uris = fact_uris(args.region, args.owner, args.retention)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.client and uris:
        print("--client certificates state no backend facts", file=sys.stderr)
        return 2
    now = datetime.now(UTC)
    expires = ca.certificate.not_valid_after_utc
    if now + timedelta(days=args.days) > expires:
        print(
            f"the CA expires {expires:%Y-%m-%d %H:%M} UTC, before --days {args.days:g} "
            "would end: a certificate cannot outlive its CA (ask for fewer days)",
            file=sys.stderr,
        )
        return 1
    made = issue(ca, args.name, now=now, days=args.days, client=args.client, uris=uris)
    # the issuing CA (and what lies between it and the root) after the leaf, as servers send it
    return _write(Path(args.out), args.name, made.cert_pem + chain, made.key_pem, made.pin)


def _write(out: Path, stem: str, cert: bytes, key: bytes, pin: str | None) -> int:
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}-key.pem"
    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # O_EXCL: no overwrite, no planted link
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Both names are taken before either is written: a certificate already there
        # leaves no new key behind (which would then block every retry).
        key_fd = os.open(key_path, new, 0o600)
        try:
            cert_fd = os.open(cert_path, new, 0o644)
        except OSError:
            os.close(key_fd)
            key_path.unlink()
            raise
        with os.fdopen(key_fd, "wb") as handle:
            handle.write(key)
        with os.fdopen(cert_fd, "wb") as handle:
            handle.write(cert)
    except OSError as exc:
        print(f"cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {cert_path} and {key_path}", file=sys.stderr)
    if pin is not None:
        print(f"pin_spki_sha256: {pin}")
    return 0
