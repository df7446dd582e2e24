"""Whether a request's API key still stands, asked again while the request is in flight.

A request is authenticated at its head and again once its body is in (gateway/api/openai.py);
then it may wait in a saturated pool's queue, connect, and fail over for seconds. A key
revoked meanwhile (the admin API, `owngate keys revoke`, another replica through Redis),
or removed, or given to another tenant, or a model taken from the tenant, by a config
reload, must stop what the request has not yet sent: the proxy asks `Standing.lapsed` as
each attempt's turn comes, right before its dispatch record, once that record is durable
(before anything is sent) and when a dispatched attempt fails (before its completion
record: the status the client gets is decided there, gateway/api/proxy.py).

The look is cheap while nothing changed: the parts active now are the ones last looked at
(a config reload swaps them whole) and the state's revocation count has not moved (it
only grows: `SharedState.revocations`); only then is the key looked up again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.errors import ErrorCode, GatewayError

if TYPE_CHECKING:
    from gateway.api.parts import Assembly
    from gateway.tenants import TenantEntry

__all__ = ["Standing"]


class Standing:
    """The request's tenant as the config and revocations active now say (see the module
    docstring). `tenant` was found by `digest` in the tenant index of `parts()` just before
    this was made, and the key was not revoked then."""

    __slots__ = ("_parts", "_revocations", "_seen", "digest", "tenant")

    def __init__(self, digest: str, tenant: TenantEntry, parts: Callable[[], Assembly]) -> None:
        self.digest = digest
        self.tenant = tenant
        self._parts = parts
        self._seen = parts()  # the parts `tenant` is from
        self._revocations = self._seen.state.revocations

    def lapsed(self, model: str) -> GatewayError | None:
        """Why the request may send nothing more (401 `invalid_api_key`: its key revoked,
        removed or given to another tenant; 404 `model_not_found`: `model` taken from the
        tenant), or None while the key stands as it did."""
        parts = self._parts()
        revocations = parts.state.revocations
        if parts is self._seen and revocations == self._revocations:
            return None  # nothing reloaded or revoked since the last look
        if parts.state.is_revoked(self.digest):
            return _refused("was revoked")
        tenant = parts.tenants.get(self.digest)
        if tenant is None:
            return _refused("was removed by a config reload")
        if tenant.id != self.tenant.id:  # its rate limits admitted it as the old tenant's
            return _refused("was given to another tenant by a config reload")
        if not tenant.may_use(model):
            return GatewayError(
                ErrorCode.model_not_found,
                f"The model `{model}` was taken from your access by a config reload while "
                "the request was in flight; nothing more was sent.",
                param="model",
            )
        self.tenant, self._seen, self._revocations = tenant, parts, revocations
        return None


def _refused(why: str) -> GatewayError:
    return GatewayError(
        ErrorCode.invalid_api_key,
        f"Incorrect API key provided: it {why} while the request was in flight; nothing "
        "more was sent.",
    )
