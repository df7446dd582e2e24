"""Tenant API keys (security): `GET`, `POST /admin/v1/keys` and
`DELETE /admin/v1/keys/{digest}`. A change is staged in the keys file under its lock
before its admin record (key_changes.py); a created key is shown once, and only when the
reloaded config holds it; a revocation says when the shared state did not take it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Response

from gateway.admin.control import Control, Security, act, reload_error
from gateway.admin.key_changes import adding, removing, staged_change, take_back, unavailable
from gateway.admin.models import CreatedKey, KeyCreate, KeyList, KeyRevoked, KeyRow
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.tenants import hash_api_key, new_api_key, read_keys_file

__all__ = ["router"]

router = APIRouter(prefix="/admin/v1")


@router.get("/keys", tags=["security"], summary="Tenant API keys, by digest prefix")
async def keys(control: Control, caller: Security) -> KeyList:
    state = control.runtime.state
    rows = [
        KeyRow(tenant=tenant.id, hash_prefix=digest[7:19], revoked=state.is_revoked(digest))
        for tenant in control.runtime.config.tenants
        for digest in tenant.api_key_hashes
    ]
    return KeyList(keys=rows)


@router.post(
    "/keys", tags=["security"], status_code=201, summary="Create a tenant API key (shown once)"
)
async def create_key(body: KeyCreate, control: Control, caller: Security) -> CreatedKey:
    runtime = control.runtime
    if body.tenant not in {t.id for t in runtime.config.tenants}:
        raise GatewayError(ErrorCode.invalid_request, f"no tenant {body.tenant!r}", param="tenant")
    path = _keys_file(runtime)
    key = new_api_key()
    digest = hash_api_key(key)
    async with staged_change(path, adding(body.tenant, digest)) as added:  # else 503
        await added.commit()
    await control.reload()
    # Shown only when it works: a config that did not reload (say, a broken gateway.yaml
    # beside the keys file) would leave it refused, so the key is taken back, the failed
    # attempt recorded and nothing shown.
    if not _holds_key(control.runtime, body.tenant, digest):
        error = reload_error(control.runtime) or "the key is not active after the reload"
        await take_back(path, digest)
        await act(control, caller, "key_create", body.tenant, {"error": error}, failed=True)
        raise GatewayError(
            ErrorCode.invalid_request, f"no key was created; the running config stays: {error}"
        )
    change = {"tenant": body.tenant, "hash": digest}
    try:
        done = await act(control, caller, "key_create", body.tenant, change, changed=True)
    except GatewayError:  # not logged: not taken
        await take_back(path, digest)
        await control.reload()
        raise
    return CreatedKey(**done.model_dump(), tenant=body.tenant, key=key, hash=digest)


def _holds_key(runtime: Runtime, tenant: str, key_hash: str) -> bool:
    """Whether the running config gives `tenant` the key `key_hash`."""
    return any(t.id == tenant and key_hash in t.api_key_hashes for t in runtime.config.tenants)


_NOT_PROPAGATED = (
    "revoked on this replica and in the keys file; the shared state (Redis) did not take "
    "it: other replicas accept the key until Redis is back (the revocation is queued and "
    "sent then) or they reload their config. Do not retry: it is revoked here"
)

_UNLISTED = (
    "this host's revoked keys list (state.revocations_file) could not take it (full, or "
    "not writable: the gateway's log says why; it retries): a gateway process started on "
    "this host while Redis is down, a restart included, accepts the key if gateway.yaml "
    "or a keys file still lists it"
)


@router.delete(
    "/keys/{digest}",
    tags=["security"],
    summary="Revoke a tenant API key by its SHA-256 digest",
    responses={202: {"model": KeyRevoked, "description": "revoked here, not yet shared"}},
)
async def revoke_key(
    digest: str, response: Response, control: Control, caller: Security
) -> KeyRevoked:
    runtime = control.runtime
    key_hash = "sha256:" + digest.removeprefix("sha256:")
    owners = [t.id for t in runtime.config.tenants if key_hash in t.api_key_hashes]
    keys_file = _keys_file(runtime) if runtime.config.keys_file is not None else None
    if not owners and keys_file is not None:
        owners = await _dormant_owner(keys_file, key_hash)
    if not owners:
        raise GatewayError(ErrorCode.not_found, "no tenant has this key")
    change = {"tenant": owners[0], "hash": key_hash}
    # staged under the file's lock before the record: failing, a 503 with nothing done
    async with staged_change(keys_file, removing(key_hash)) as removal:
        # The record comes before the revocation (a revocation is never unrecorded), so
        # it says what the state will do: with Redis away, refuse here and queue it.
        share = runtime.state.healthy
        done = await act(
            control, caller, "key_revoke", owners[0], change, changed=True, local=not share
        )
        shared = await runtime.state.revoke_key(key_hash, share=share)  # before the rename
        listed = runtime.state.status().unlisted_revocations == 0  # this host's list
        try:
            await removal.commit()
            unchanged = None
        except GatewayError as exc:  # the revocation above stands: never "nothing was done"
            unchanged = exc
    if keys_file is not None and unchanged is None:
        await control.reload()
    if shared and unchanged is None:
        if listed:
            return KeyRevoked(**done.model_dump(), propagated=True)
        response.status_code = 202
        return KeyRevoked(**done.model_dump(), propagated=True, listed=False, detail=_UNLISTED)
    detail = _NOT_PROPAGATED if listed else f"{_NOT_PROPAGATED}; {_UNLISTED}"
    if share and not shared:  # Redis failed during the call: a record says so after "done"
        try:
            done = await act(
                control, caller, "key_revoke", owners[0], change, changed=True, local=True
            )
        except GatewayError:  # the log failed too: the answer says it, the key stays revoked
            detail += "; the admin record of its staying local was not logged"
    if unchanged is not None:
        raise _file_unchanged(unchanged, shared=shared, logged=done.log_index)
    response.status_code = 202
    return KeyRevoked(**done.model_dump(), propagated=False, listed=listed, detail=detail)


def _file_unchanged(exc: GatewayError, *, shared: bool, logged: int | None) -> GatewayError:
    """The 503 for a keys file whose rename failed after the key was revoked in the state
    and its admin record logged: says that it is revoked, and that the file still lists it."""
    cause = exc.__cause__
    why = cause.strerror if isinstance(cause, OSError) and cause.strerror else "not renamed"
    where = "and in the shared state" if shared else "but not yet in the shared state (queued)"
    record = f"admin record at log index {logged}" if logged is not None else "no log kept"
    return GatewayError(
        ErrorCode.backend_unavailable,
        f"the key is revoked on this replica {where}; {record}; but the keys file could "
        f"not be changed ({why}): it still lists the key, so a restart or a replica that "
        "reads the file accepts it. Retry to remove it from the file",
    )


async def _dormant_owner(path: Path, key_hash: str) -> list[str]:
    """The tenant the keys file lists `key_hash` under when gateway.yaml has no such
    tenant (taken out of it: its digests authenticate no one, gateway/config/
    tenant_keys.py), or none. Such a digest was 404 here, only `owngate keys revoke`
    could remove it, and a tenant added again by that id was given it back."""
    try:
        stored = await asyncio.to_thread(read_keys_file, path)
    except (OSError, ValueError) as exc:  # 503, nothing changed: not "no tenant has it"
        raise unavailable(exc) from exc
    return [tenant for tenant, hashes in stored.items() if key_hash in hashes][:1]


def _keys_file(runtime: Runtime) -> Path:
    if runtime.config.keys_file is None:
        raise GatewayError(
            ErrorCode.invalid_request, "no keys_file in the config: keys cannot be stored"
        )
    return runtime.config_dir / runtime.config.keys_file
