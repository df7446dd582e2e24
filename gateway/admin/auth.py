"""Who is calling the admin API, and whether their role may: Bearer admin tokens, stored
as SHA-256 digests with a role (`admin.tokens`), full access (`admin.token_hashes`), or
reads only: a loopback client without a token under `admin.allow_loopback`, the demo's
setting, unless a web page of another origin sent the request
(`gateway.api.admin.loopback_admitted`).

Roles: `operator` (status, reload, drain), `security` (policies, keys), `auditor` (the
log, receipts, proofs: read-only). A request without a token or with an unknown one is
401; a known token whose role may not use the endpoint is 403.

The tokenless loopback client (`LOOPBACK_READS`) may use every role's GET and HEAD
endpoints and nothing else: every other method, on any route, present or future, needs a
token. A loopback address is not a credential: any local user or process (a local SSRF,
a browser tab that got a request past the page checks) is one, and minting a tenant key,
revoking one, reloading or draining must name the token that did it in the admin record.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from gateway.api.admin import LOOPBACK_REFUSED, is_loopback, loopback_admitted
from gateway.config.schema import AdminSettings
from gateway.errors import ErrorCode, GatewayError

__all__ = ["FULL_ACCESS", "LOOPBACK_READS", "Caller", "authenticated", "identify", "require"]

FULL_ACCESS = "admin"  # admin.token_hashes: every role's endpoints
LOOPBACK_READS = "loopback"  # allow_loopback without a token: every role's reads, no write
_READS = frozenset(("GET", "HEAD"))
_LOOPBACK_WRITE_REFUSED = (
    "a loopback client without a token may only read (GET): send the admin token of a role "
    "that may use this endpoint as 'Authorization: Bearer TOKEN' (`owngate demo` prints one "
    "per role)"
)


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated admin: the role it acts in, and `token`, the first 12 hex digits
    of its token's digest ("loopback" for a tokenless loopback client, which only reads):
    what the admin records in the provenance log name as who acted."""

    role: str
    token: str


def identify(request: Request, settings: AdminSettings) -> Caller:
    """The caller of `request`, or `GatewayError` 401 (no token, a wrong one)."""
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        raise GatewayError(ErrorCode.invalid_api_key, "Send one Authorization header.")
    if values:
        scheme, _, token = values[0].partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            found = _lookup(token.encode(), settings)
            if found is not None:
                return found
        raise GatewayError(ErrorCode.invalid_api_key, "Incorrect admin token.")
    if settings.allow_loopback and loopback_admitted(request.scope):
        if request.method not in _READS:
            raise GatewayError(ErrorCode.missing_api_key, _LOOPBACK_WRITE_REFUSED)
        return Caller(LOOPBACK_READS, "loopback")
    if settings.allow_loopback and is_loopback(request.scope):  # a web page sent it
        raise GatewayError(ErrorCode.missing_api_key, LOOPBACK_REFUSED)
    raise GatewayError(
        ErrorCode.missing_api_key, "send the admin token as 'Authorization: Bearer TOKEN'"
    )


def _lookup(token: bytes, settings: AdminSettings) -> Caller | None:
    """The caller whose stored digest `token` hashes to; every digest is compared, in
    constant time, so the time taken does not say which one matched."""
    digest = "sha256:" + hashlib.sha256(token).hexdigest()
    found: Caller | None = None
    for stored in settings.token_hashes:
        if hmac.compare_digest(digest.encode(), stored.encode()):
            found = Caller(FULL_ACCESS, digest[7:19])
    for entry in settings.tokens:
        if hmac.compare_digest(digest.encode(), entry.hash.encode()) and found is None:
            found = Caller(entry.role, digest[7:19])
    return found


async def authenticated(request: Request) -> Caller:
    """A FastAPI dependency: the caller, whatever its role (401 without a valid token)."""
    settings: AdminSettings = request.app.state.control.runtime.config.admin
    return identify(request, settings)


def require(*roles: str) -> Callable[[Request], Awaitable[Caller]]:
    """A FastAPI dependency: the caller, if its role is one of `roles` (or full access, or
    a read by the tokenless loopback client); 401 or 403 otherwise. The settings are the
    running config's (a reload applies)."""
    allowed = frozenset(roles)

    async def check(request: Request) -> Caller:  # async: on the loop, not a thread
        caller = await authenticated(request)
        if caller.role == LOOPBACK_READS and request.method in _READS:  # `identify` checked
            return caller
        if caller.role != FULL_ACCESS and caller.role not in allowed:
            raise GatewayError(
                ErrorCode.permission_denied,
                f"the {caller.role} role may not use this endpoint (needs: "
                f"{', '.join(sorted(allowed))})",
            )
        return caller

    return check
