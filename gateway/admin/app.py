"""The admin API app (FastAPI): its routes and what it is given.

`create_admin_app(control)` builds it from an `AdminControl`: the gateway's `Runtime`
(read on every request, so a reload shows at once) and the actions the composition root
binds (gateway/app.py `admin_app`). Errors are OpenAI error objects (errors.py); a path it
lacks is a 404, never Starlette's trailing-slash redirect (to the client's `Host`).
`/openapi.json` is the schema (docs/admin-openapi.json). FastAPI's docs are off: its
Swagger UI loads assets from a CDN; `/docs` redirects to the console's API page instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from gateway.admin.auth import Caller, require
from gateway.admin.console_routes import docs_router
from gateway.admin.console_routes import router as console_router
from gateway.admin.cosignatures import router as cosignatures_router
from gateway.admin.errors import _gateway_error, _http_error, _internal, _invalid
from gateway.admin.headers import ApiHeaders, HeadAsGet
from gateway.admin.key_changes import adding, removing, staged_change, take_back
from gateway.admin.limits import BodyLimit
from gateway.admin.models import (
    MAX_CANDIDATE_BYTES,
    ActionResult,
    ConfigCandidate,
    ConfigStatus,
    ConfigValidation,
    CreatedKey,
    Explained,
    ExplainRequest,
    KeyCreate,
    KeyList,
    KeyRevoked,
    KeyRow,
    PolicyStatus,
    PolicySummary,
    Status,
)
from gateway.admin.openapi import with_error_objects
from gateway.admin.policy_tests import router as policy_tests_router
from gateway.admin.receipts import router as receipts_router
from gateway.admin.report import router as report_router
from gateway.admin.requests import router as requests_router
from gateway.admin.tenants import router as tenants_router
from gateway.admin.tiles import router as log_router
from gateway.admin.timeline import Timeline
from gateway.admin.timelines import router as timelines_router
from gateway.api.admin import status_report
from gateway.api.runtime import Runtime
from gateway.config.schema import GatewaySettings
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.labels import InvalidLabel, one_label
from gateway.policy.types import UnknownDataClass
from gateway.provenance.formats.records import admin_record
from gateway.tenants import hash_api_key, new_api_key

__all__ = ["AdminControl", "config_digest", "create_admin_app", "openapi_schema"]


@dataclass(frozen=True, slots=True)
class AdminControl:
    """What the admin API reads and does: the running gateway, its readiness detail
    (api/operations.py), and the actions (reload: True when a changed config or policy
    set became active; drain: turn not-ready and let running requests finish; validate:
    every problem `owngate serve` would refuse a candidate config for)."""

    runtime: Runtime
    readiness: Callable[[], dict[str, Any]]
    reload: Callable[[], Awaitable[bool]]
    drain: Callable[[], None]
    validate: Callable[[str], list[str]]  # a candidate gateway.yaml's text -> its problems


def config_digest(config: GatewaySettings) -> str:
    """SHA-256 of a config (its JSON with sorted keys): which config is running."""
    data = orjson.dumps(config.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()


def create_admin_app(control: AdminControl) -> FastAPI:
    """The admin API app acting on `control`; its lifespan runs the timelines' sampler
    (admin.sample_interval_s and admin.history_s as the app is built)."""
    app = _routes(lifespan=_sampling)
    app.state.control = control
    app.state.report_lock = asyncio.Lock()  # one log scan (report, request lookup) at a time
    app.state.report_waiting = 0  # and at most report.MAX_WAITING_REPORTS waiting for it
    # One client YAML parsed at a time (config/validate, policies/test): seconds of CPU
    # each in a worker thread, which takes the GIL from the loop serving tenants.
    app.state.parse_lock = asyncio.Lock()
    settings = control.runtime.config.admin
    app.state.timeline = Timeline(
        control.runtime, interval_s=settings.sample_interval_s, history_s=settings.history_s
    )
    return app


@contextlib.asynccontextmanager
async def _sampling(app: FastAPI) -> AsyncIterator[None]:
    timeline: Timeline = app.state.timeline
    task = asyncio.create_task(timeline.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def openapi_schema() -> dict[str, Any]:
    """The admin API's schema (docs/admin-openapi.json holds it), built without a gateway."""
    return _routes().openapi()


def _routes(
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    app = FastAPI(
        lifespan=lifespan,
        title="owngate admin API",
        version="1",
        description="The control plane of an owngate gateway, on its own listener "
        "(admin.listen). See docs/admin-api.md.",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        redirect_slashes=False,  # `/x/` redirected to the client's `Host` (docstring)
    )
    app.add_middleware(BodyLimit)
    app.add_middleware(ApiHeaders)  # outside BodyLimit: its refusals get the headers too
    app.add_middleware(HeadAsGet)  # outermost: HEAD is a GET for every check inside
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal)  # Starlette still logs and re-raises it
    app.include_router(_v1)
    app.include_router(timelines_router)
    app.include_router(tenants_router)
    app.include_router(policy_tests_router)
    app.include_router(receipts_router)
    app.include_router(cosignatures_router)
    app.include_router(report_router)
    app.include_router(requests_router)
    app.include_router(log_router)
    app.include_router(console_router)
    app.include_router(docs_router)
    with_error_objects(app)
    return app


async def _control(request: Request) -> AdminControl:
    return request.app.state.control  # type: ignore[no-any-return]


# --- the v1 endpoints --------------------------------------------------------------------

_v1 = APIRouter(prefix="/admin/v1")
_Operator = Annotated[Caller, Depends(require("operator"))]
_Security = Annotated[Caller, Depends(require("security"))]
_Reader = Annotated[Caller, Depends(require("operator", "security"))]
_Control = Annotated[AdminControl, Depends(_control)]


@_v1.get("/status", tags=["operator"], summary="Readiness and every backend's routing state")
async def status(control: _Control, caller: _Operator) -> Status:
    parts = control.runtime.parts
    report = status_report(parts.registry, parts.scraper, parts.proxy)
    ready = control.readiness()
    return Status.model_validate(
        {
            **report,
            "status": ready["status"],
            "draining": ready["draining"],
            "provenance": ready["provenance"],
            "witnesses": ready["witnesses"],
            "state": ready["state"],
        }
    )


@_v1.get("/policies", tags=["security"], summary="The active policy set and its reload status")
async def policies(control: _Control, caller: _Security) -> PolicyStatus:
    active = control.runtime.policies.current
    summaries = [
        PolicySummary(
            id=policy.id,
            version=policy.version,
            tenants=sorted(policy.tenants),
            data_classes=sorted(policy.classes),
            rules=sorted(policy.rules),
        )
        for policy in map(active.compiled, active.policy_ids())
    ]
    return PolicyStatus.model_validate(
        {
            **control.runtime.policies.status(),
            "policies": summaries,
            "rules": sorted(active.rules),
        }
    )


@_v1.post("/policies/explain", tags=["security"], summary="The decision and trace for a request")
async def explain(body: ExplainRequest, control: _Control, caller: _Security) -> Explained:
    try:
        label = None if body.data_class is None else one_label([body.data_class])
        decision = control.runtime.policies.current.decide(body.tenant, body.model, label)
    except (InvalidLabel, UnknownDataClass) as exc:
        raise GatewayError(ErrorCode.unknown_data_class, str(exc), param="data_class") from exc
    return Explained.model_validate(decision.as_dict())


@_v1.get("/config", tags=["operator", "security"], summary="The running config's digest")
async def config(control: _Control, caller: _Reader) -> ConfigStatus:
    runtime = control.runtime
    reloader = runtime.reloader
    reloads = reloader.status() if reloader is not None else {}
    return ConfigStatus(
        digest=config_digest(runtime.config),
        source=reloads.get("path"),
        loaded_at=reloads.get("loaded_at"),
        last_reload_error=reloads.get("last_reload_error"),
        reload_failures=reloads.get("reload_failures", 0),
    )


@_v1.post(
    "/config/validate",
    tags=["operator", "security"],
    summary="Every problem a candidate gateway.yaml would be refused for (nothing changes)",
)
async def validate_config(
    body: ConfigCandidate, request: Request, control: _Control, caller: _Reader
) -> ConfigValidation:
    if len(body.yaml.encode()) > MAX_CANDIDATE_BYTES:
        raise GatewayError(
            ErrorCode.invalid_request, f"yaml is over {MAX_CANDIDATE_BYTES} bytes", param="yaml"
        )
    async with request.app.state.parse_lock:
        problems = await asyncio.to_thread(control.validate, body.yaml)
    return ConfigValidation(valid=not problems, problems=problems)


@_v1.post("/reload", tags=["operator"], summary="Reload gateway.yaml and the policy files")
async def reload(control: _Control, caller: _Operator) -> ActionResult:
    changed = await control.reload()
    runtime = control.runtime
    error = _reload_error(runtime)
    if error:  # nothing changed, and the record says why (the digest of the error)
        await _act(control, caller, "reload", "config", {"error": error}, failed=True)
        raise GatewayError(
            ErrorCode.invalid_request, f"reload failed; the running config stays: {error}"
        )
    change = {"config": config_digest(runtime.config), "policy": runtime.policies.current.digest}
    return await _act(control, caller, "reload", "config", change, changed=changed)


@_v1.post("/drain", tags=["operator"], summary="Stop taking requests; finish running ones")
async def drain(control: _Control, caller: _Operator) -> ActionResult:
    change = {"draining": True, "running": len(control.runtime.serving)}
    started = not control.runtime.draining  # a second drain changes nothing
    result = await _act(control, caller, "drain", "gateway", change, changed=started)
    control.drain()
    return result


@_v1.get("/keys", tags=["security"], summary="Tenant API keys, by digest prefix")
async def keys(control: _Control, caller: _Security) -> KeyList:
    state = control.runtime.state
    rows = [
        KeyRow(tenant=tenant.id, hash_prefix=digest[7:19], revoked=state.is_revoked(digest))
        for tenant in control.runtime.config.tenants
        for digest in tenant.api_key_hashes
    ]
    return KeyList(keys=rows)


@_v1.post(
    "/keys", tags=["security"], status_code=201, summary="Create a tenant API key (shown once)"
)
async def create_key(body: KeyCreate, control: _Control, caller: _Security) -> CreatedKey:
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
        error = _reload_error(control.runtime) or "the key is not active after the reload"
        await take_back(path, digest)
        await _act(control, caller, "key_create", body.tenant, {"error": error}, failed=True)
        raise GatewayError(
            ErrorCode.invalid_request, f"no key was created; the running config stays: {error}"
        )
    change = {"tenant": body.tenant, "hash": digest}
    try:
        done = await _act(control, caller, "key_create", body.tenant, change, changed=True)
    except GatewayError:  # not logged: not taken
        await take_back(path, digest)
        await control.reload()
        raise
    return CreatedKey(**done.model_dump(), tenant=body.tenant, key=key, hash=digest)


def _holds_key(runtime: Runtime, tenant: str, key_hash: str) -> bool:
    """Whether the running config gives `tenant` the key `key_hash`."""
    return any(t.id == tenant and key_hash in t.api_key_hashes for t in runtime.config.tenants)


def _reload_error(runtime: Runtime) -> str | None:
    """Why the last reload of the config or the policy files failed (None: it did not)."""
    reloader = runtime.reloader
    error = reloader.last_error if reloader is not None else None
    return error or runtime.policies.last_error


_NOT_PROPAGATED = (
    "revoked on this replica and in the keys file; the shared state (Redis) did not take "
    "it: other replicas accept the key until Redis is back (the revocation is queued and "
    "sent then) or they reload their config. Do not retry: it is revoked here"
)


@_v1.delete(
    "/keys/{digest}",
    tags=["security"],
    summary="Revoke a tenant API key by its SHA-256 digest",
    responses={202: {"model": KeyRevoked, "description": "revoked here, not yet shared"}},
)
async def revoke_key(
    digest: str, response: Response, control: _Control, caller: _Security
) -> KeyRevoked:
    runtime = control.runtime
    key_hash = "sha256:" + digest.removeprefix("sha256:")
    owners = [t.id for t in runtime.config.tenants if key_hash in t.api_key_hashes]
    if not owners:
        raise GatewayError(ErrorCode.not_found, "no tenant has this key")
    change = {"tenant": owners[0], "hash": key_hash}
    # staged under the file's lock before the record: failing, a 503 with nothing done
    keys_file = _keys_file(runtime) if runtime.config.keys_file is not None else None
    async with staged_change(keys_file, removing(key_hash)) as removal:
        # The record comes before the revocation (a revocation is never unrecorded), so
        # it says what the state will do: with Redis away, refuse here and queue it.
        share = runtime.state.healthy
        done = await _act(
            control, caller, "key_revoke", owners[0], change, changed=True, local=not share
        )
        shared = await runtime.state.revoke_key(key_hash, share=share)  # before the rename
        try:
            await removal.commit()
            unchanged = None
        except GatewayError as exc:  # the revocation above stands: never "nothing was done"
            unchanged = exc
    if keys_file is not None and unchanged is None:
        await control.reload()
    if shared and unchanged is None:
        return KeyRevoked(**done.model_dump(), propagated=True)
    detail = _NOT_PROPAGATED
    if share and not shared:  # Redis failed during the call: a record says so after "done"
        try:
            done = await _act(
                control, caller, "key_revoke", owners[0], change, changed=True, local=True
            )
        except GatewayError:  # the log failed too: the answer says it, the key stays revoked
            detail += "; the admin record of its staying local was not logged"
    if unchanged is not None:
        raise _file_unchanged(unchanged, shared=shared, logged=done.log_index)
    response.status_code = 202
    return KeyRevoked(**done.model_dump(), propagated=False, detail=detail)


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


def _keys_file(runtime: Runtime) -> Path:
    if runtime.config.keys_file is None:
        raise GatewayError(
            ErrorCode.invalid_request, "no keys_file in the config: keys cannot be stored"
        )
    return runtime.config_dir / runtime.config.keys_file


async def _act(
    control: AdminControl,
    caller: Caller,
    action: str,
    subject: str,
    change: dict[str, Any],
    *,
    changed: bool = False,
    failed: bool = False,
    local: bool = False,
) -> ActionResult:
    """Write the admin record of an action to the provenance log (when the gateway keeps
    one): who (role, token digest prefix), what, the SHA-256 of `change`, and its outcome
    ("failed": an attempt refused with nothing changed, `change` then `{"error": why}`;
    its record must not read as the action taken; "local": taken on this replica alone,
    the shared state not told yet). Raises
    (503 provenance_unavailable) when the log cannot take it: the action is then not
    taken, except a reload, whose record names what it made active."""
    digest = hashlib.sha256(orjson.dumps(change, option=orjson.OPT_SORT_KEYS)).hexdigest()
    recorder = control.runtime.parts.recorder
    index = None
    if recorder is not None and recorder.opened:
        record = admin_record(
            request_id="adm_" + os.urandom(12).hex(),
            time=datetime.now(UTC),
            role=caller.role,
            token=caller.token,
            action=action,
            subject=subject,
            change_digest=digest,
            outcome="failed" if failed else "local" if local else "done",
        )
        try:
            index = (await recorder.log.append(record)).index
        except Exception as exc:
            raise GatewayError(
                ErrorCode.provenance_unavailable, f"the admin record was not logged: {exc}"
            ) from exc
    return ActionResult(action=action, changed=changed, change_digest=digest, log_index=index)
