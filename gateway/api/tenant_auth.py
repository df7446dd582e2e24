"""A tenant's authentication on the public listener: the API key a request carries
(`Authorization: Bearer KEY`), looked up by its digest in the key index of the config
active now (`gateway.tenants`) and refused when revoked; looked up again once a body is
in; and every tenant request refused (503) by a worker whose config may be stale, or
while this host's revoked keys list cannot be read (it may revoke any key)."""

from __future__ import annotations

import hashlib

from gateway.api.runtime import Runtime
from gateway.asgi import Scope, header_values
from gateway.errors import ErrorCode, GatewayError
from gateway.policy_set import STALE_POLICIES
from gateway.tenants import TenantEntry

__all__ = ["TenantAuth", "key_digest"]

_RETRY_SOON = ((b"retry-after", b"1"),)
# What a request gets from a stale worker (`ConfigReloader.stale`): 503, retry at once
STALE_CONFIG = (
    "this gateway could not read its config files (gateway.yaml, keys file) whole "
    "(unreadable, or changing while read), so the config it holds may not be what they "
    "say now; retry shortly"
)
# While this host's revoked keys list cannot be read (`SharedState.revocations_unknown`)
UNKNOWN_REVOCATIONS = (
    "this gateway cannot read its host's list of revoked API keys, so it cannot tell "
    "whether a key was revoked; requests are refused until it can read it again"
)


class TenantAuth:
    """Who a request's key belongs to, reading `runtime` on each request."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def authenticate(self, scope: Scope) -> TenantEntry:
        """The tenant whose API key the request carries (raises 401 `GatewayError`; 503
        in a worker whose config is stale: `refuse_if_stale`)."""
        self.refuse_if_stale()
        return self.tenant_of(key_digest(scope))

    def refuse_if_stale(self) -> None:
        """503 (retry after 1 s) in a worker of `serve --workers N` that could not read
        its changed config files (`ConfigReloader.stale`): its keys may be older than its
        siblings' (a revoked key still valid here); or its changed policy files
        (`TrustPolicies.stale`), before the tenant's limits are charged for a request it
        will not serve and before `/v1/models` lists what an older set allowed. And in
        any process while this host's revoked keys list cannot be read
        (`SharedState.revocations_unknown`): any key may be one it revokes."""
        reloader = self._runtime.reloader
        if reloader is not None and reloader.stale:
            raise GatewayError(ErrorCode.not_ready, STALE_CONFIG, headers=_RETRY_SOON)
        if self._runtime.parts.policies.stale:
            raise GatewayError(ErrorCode.not_ready, STALE_POLICIES, headers=_RETRY_SOON)
        if self._runtime.parts.state.revocations_unknown is not None:  # fail closed, said
            raise GatewayError(ErrorCode.not_ready, UNKNOWN_REVOCATIONS, headers=_RETRY_SOON)

    def tenant_of(self, digest: str) -> TenantEntry:
        """The tenant of the key whose digest is `digest`, as the config and revocations
        active now say (raises 401 `GatewayError` for a key unknown or revoked)."""
        parts = self._runtime.parts
        tenant = parts.tenants.get(digest)
        if tenant is None or parts.state.is_revoked(digest):
            raise GatewayError(ErrorCode.invalid_api_key, "Incorrect API key provided.")
        return tenant

    def reauthenticated(self, digest: str, admitted: TenantEntry) -> TenantEntry:
        """The request's tenant as the config and revocations active now say, once its body
        is in (`admitted`: as they said at its head). A body may take
        `listen.body_timeout_s` to arrive: a key removed or revoked meanwhile is refused
        (401), and the tenant's models are those of the config that decides. A key moved
        to another tenant is refused too: the rate limits admitted the old one. `digest`
        is the key's, taken from the head once: the header is not parsed or hashed again
        (it cannot change), the look-ups are."""
        tenant = self.tenant_of(digest)
        if tenant.id != admitted.id:
            raise GatewayError(
                ErrorCode.invalid_api_key,
                "The API key was given to another tenant while the request arrived; send "
                "the request again.",
            )
        return tenant


def key_digest(scope: Scope) -> str:
    """The digest of the API key the request carries, as the key index holds it
    (raises 401 `GatewayError` when there is no well-formed one)."""
    values = header_values(scope, b"authorization")
    if not values:
        raise GatewayError(
            ErrorCode.missing_api_key,
            "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
        )
    if len(values) > 1:  # which copy a proxy in front read is unknowable: none counts
        raise GatewayError(ErrorCode.invalid_api_key, "Send one Authorization header, not several.")
    value = values[0]
    scheme, _, key = value.partition(b" ")
    key = key.strip()
    if scheme.lower() != b"bearer" or not key:
        raise GatewayError(
            ErrorCode.invalid_api_key, "Malformed Authorization header; use 'Bearer KEY'."
        )
    return "sha256:" + hashlib.sha256(key).hexdigest()
