"""`owngate status`: a running gateway's view of its backends, as a table or JSON.

Reads `GET /admin/status` with the admin token (`--token`, env OWNGATE_ADMIN_TOKEN; see
gateway/api/admin.py). Exit codes: 0 the status was printed, 1 the gateway could not be
reached or refused, 2 usage.

The token goes to `--url` and nowhere else: redirects are not followed (urllib would
resend the `Authorization` header to wherever one points) and no proxy from the
environment is used. Over https the server's certificate is checked against the
system's roots or `--cacert`, in a context hardened as every owngate client's
(gateway/tls_options.py: TLS 1.2 or later, no renegotiation). The answer is read up to
`MAX_STATUS_BYTES`; a longer one is refused. What the answer says (backend ids, health
and breaker errors, an error answer's excerpt, a malformed status line) is printed through
`shown` (gateway/provenance/audit/shown.py): control and format characters escaped as
`\\x1b`, each value bounded, so a backend or a server on the way cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any

from gateway.cli._common import env_default
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown
from gateway.tls_options import harden

__all__ = ["MAX_STATUS_BYTES", "format_table", "register", "tls_context"]

MAX_STATUS_BYTES = 8 * 1024 * 1024
_EXCERPT_BYTES = 300

_COLUMNS = (
    "BACKEND",
    "KIND",
    "HEALTH",
    "BREAKER",
    "INFLIGHT",
    "PREFILL",
    "SLOTS",
    "RUNNING",
    "WAITING",
    "KV",
    "AGE",
    "SCORE",
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a running gateway's backends",
        description="Show each backend's health, circuit breaker, in-flight requests "
        "(this replica / all replicas), slots, scraped queue, KV-cache use, metrics age and "
        "routing score, and whether it is ready, from the gateway's GET /admin/status "
        "(admins only: send the admin token). Exit 0 ok, 1 unreachable or refused.",
    )
    parser.add_argument(
        "--url",
        default=env_default("OWNGATE_STATUS_URL", "http://127.0.0.1:8080"),
        help="the gateway's base URL (env OWNGATE_STATUS_URL; default %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=env_default("OWNGATE_ADMIN_TOKEN", ""),
        help="the admin token (env OWNGATE_ADMIN_TOKEN, preferred: a flag shows in the process "
        "list); none: only a gateway with admin.allow_loopback answers",
    )
    parser.add_argument(
        "--cacert",
        default=env_default("OWNGATE_STATUS_CACERT", "") or None,
        help="PEM file of the CA that signed the gateway's certificate, for an https --url "
        "(env OWNGATE_STATUS_CACERT; default: the system's roots)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=env_default("OWNGATE_STATUS_JSON", "") not in ("", "0"),
        help="print the endpoint's JSON as it is (env OWNGATE_STATUS_JSON=1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(env_default("OWNGATE_STATUS_TIMEOUT", "5")),
        help="seconds to wait for the gateway (env OWNGATE_STATUS_TIMEOUT; default %(default)s)",
    )
    parser.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/") + "/admin/status"
    request = urllib.request.Request(url)  # noqa: S310 - an operator's URL
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),  # the token goes to --url, not to a proxy
            urllib.request.HTTPSHandler(context=tls_context(args.cacert)),
            _NoRedirects,
        )
        with opener.open(request, timeout=args.timeout) as response:
            data = response.read(MAX_STATUS_BYTES + 1)
        if len(data) > MAX_STATUS_BYTES:
            raise ValueError(f"the answer is larger than {MAX_STATUS_BYTES} bytes")
        report = json.loads(data)
    except urllib.error.HTTPError as exc:
        detail = shown(exc.read(_EXCERPT_BYTES).decode("utf-8", "replace"), None)
        exc.close()
        redirect = " (redirects are not followed)" if 300 <= exc.code < 400 else ""
        answered = f"{url} answered HTTP {exc.code}{redirect}"
        print(f"owngate status: {answered}: {detail}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        # An HTTPException (BadStatusLine) quotes what the server sent.
        problem = shown(exc, MAX_SHOWN_MESSAGE)
        print(f"owngate status: cannot read {shown(url)}: {problem}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(format_table(report))
    return 0


def tls_context(cafile: str | None) -> ssl.SSLContext:
    """The client context for an https gateway: `cafile`'s CA (or the system's roots),
    the name checked, TLS 1.2 or later, no renegotiation."""
    return harden(ssl.create_default_context(cafile=cafile))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would send the admin token elsewhere."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def format_table(report: dict[str, Any]) -> str:
    """The report as aligned text: one row per backend, then the pools' wait queues, then
    the gateway's readiness when it is not ready, and which worker answered under
    `serve --workers` (each has its own view)."""
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for backend in report.get("backends", []):
        rows.append(tuple(shown(cell) for cell in _row(backend)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    problems = _problems(report.get("backends", []))
    if problems:
        lines += ["", "problems:", *problems]
    queues = {name: q for name, q in report.get("queues", {}).items() if q.get("waiting")}
    if queues:
        lines += ["", "waiting in gateway queues:"]
        lines += [
            f"  {shown(name)}: {shown(q['waiting'])}/{shown(q['size'])}"
            for name, q in sorted(queues.items())
        ]
    readiness = report.get("readiness") or {}
    if readiness.get("status", "ready") != "ready":
        draining = " (draining)" if readiness.get("draining") else ""
        lines += ["", f"gateway: {shown(readiness['status'])}{draining}"]
    if readiness.get("worker") is not None:  # `serve --workers N`: one worker's own view
        lines += [
            "",
            f"answered by worker {shown(readiness['worker'])} of `serve --workers`: its own "
            "breakers, health, counts and config (run again for another worker)",
        ]
    return "\n".join(lines)


def _row(backend: dict[str, Any]) -> tuple[str, ...]:
    breaker = backend.get("breaker") or {}
    state = str(breaker.get("state", "-"))
    if breaker.get("retry_in_s") is not None:
        state += f" ({breaker['retry_in_s']:.1f}s)"
    kv = backend.get("kv_usage")
    age = backend.get("metrics_age_s")
    scores = backend.get("scores") or {}
    return (
        str(backend["id"]),
        str(backend.get("kind", "-")),
        str(backend.get("health", "-")),
        state,
        f"{backend.get('inflight', 0)}/{backend.get('inflight_global', 0)}",
        _number(backend.get("prefilling_tokens")),
        _number(backend.get("slots")),
        _number(backend.get("running")),
        _number(backend.get("waiting")),
        "-" if kv is None else f"{kv:.0%}",
        "-" if age is None else f"{age:.1f}s" + (" stale" if backend.get("metrics_stale") else ""),
        " ".join(f"{v:.2f}" for v in sorted(set(scores.values()), reverse=True)) or "-",
    )


def _problems(backends: list[dict[str, Any]]) -> list[str]:
    """A line for each backend that is down or whose breaker is not closed, and for each
    tenant a backend's breaker is open for."""
    lines = []
    for backend in backends:
        breaker = backend.get("breaker") or {}
        name = shown(backend["id"])
        if backend.get("health_error") or breaker.get("state") != "closed":
            lines.append(
                f"  {name}: {_error(backend.get('health_error') or breaker.get('last_error'))}"
            )
    for backend in backends:
        for tenant in (backend.get("breaker") or {}).get("tenants") or ():
            if tenant.get("state") != "closed":
                lines.append(
                    f"  {shown(backend['id'])}: open for tenant {shown(tenant.get('tenant'))} "
                    f"only: {_error(tenant.get('last_error'))}"
                )
    return lines


def _error(value: object) -> str:
    """A health or breaker error as the report gives it, one bounded printable line."""
    return shown(value, MAX_SHOWN_MESSAGE)


def _number(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
