"""`owngate audit`: verify a provenance log offline, prove, check receipts, open commitments.

Needs only `gateway.provenance` (standard library + cryptography): no server, no Redis.
Exit codes: 0 ok, 1 a check failed (the reason is printed), 2 usage error.
Every flag has an environment default `OWNGATE_AUDIT_<FLAG>`; keys and checkpoints given
through the environment are separated by whitespace or commas.
"""

from __future__ import annotations

from typing import Any

from gateway.cli.audit_flags import usage
from gateway.cli.audit_open import add_open
from gateway.cli.audit_proof import add_proof
from gateway.cli.audit_prove import add_prove
from gateway.cli.audit_receipt import add_receipt
from gateway.cli.audit_report import add_report
from gateway.cli.audit_show import add_show
from gateway.cli.audit_verify import add_verify

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="verify a provenance log offline",
        description="Verify a provenance log with nothing but its public key(s).",
        epilog="Exit codes: 0 ok, 1 a check failed, 2 usage error.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    add_verify(verbs)
    add_prove(verbs)
    add_proof(verbs)
    add_receipt(verbs)
    add_open(verbs)
    add_show(verbs)
    add_report(verbs)
    parser.set_defaults(handler=lambda _args: usage(parser))
