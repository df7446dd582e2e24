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
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from gateway.admin.console_routes import docs_router
from gateway.admin.console_routes import router as console_router
from gateway.admin.control import (
    AdminControl,
    Control,
    Operator,
    Reader,
    Security,
    act,
    reload_error,
)
from gateway.admin.cosignatures import router as cosignatures_router
from gateway.admin.errors import _gateway_error, _http_error, _internal, _invalid
from gateway.admin.headers import ApiHeaders, HeadAsGet
from gateway.admin.keys import router as keys_router
from gateway.admin.limits import BodyLimit
from gateway.admin.models import (
    MAX_CANDIDATE_BYTES,
    ActionResult,
    ConfigCandidate,
    ConfigStatus,
    ConfigValidation,
    Explained,
    ExplainRequest,
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
from gateway.admin.work import (
    LOG_READS,
    LOG_READS_PER_CALLER,
    AdminWork,
    in_thread,
    log_read_line,
)
from gateway.api.admin import status_report
from gateway.config.schema import GatewaySettings
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.labels import InvalidLabel, one_label
from gateway.policy.types import UnknownDataClass

__all__ = ["config_digest", "create_admin_app", "openapi_schema"]


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
    app.state.work = AdminWork()  # the heavy work's own threads, bounded (work.py)
    # The log's tiles and checkpoint (tiles.py): threads of their own, bounded the same way.
    # Past their bounds, they wait their turn in a short line, fair across tokens.
    app.state.log_reads = AdminWork(
        LOG_READS, LOG_READS_PER_CALLER, "tile or checkpoint reads", log_read_line()
    )
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
        app.state.work.shutdown()
        app.state.log_reads.shutdown()


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
    app.include_router(keys_router)
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


# --- the v1 endpoints --------------------------------------------------------------------

_v1 = APIRouter(prefix="/admin/v1")


@_v1.get("/status", tags=["operator"], summary="Readiness and every backend's routing state")
async def status(control: Control, caller: Operator) -> Status:
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
async def policies(control: Control, caller: Security) -> PolicyStatus:
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
async def explain(body: ExplainRequest, control: Control, caller: Security) -> Explained:
    try:
        label = None if body.data_class is None else one_label([body.data_class])
        decision = control.runtime.policies.current.decide(body.tenant, body.model, label)
    except (InvalidLabel, UnknownDataClass) as exc:
        raise GatewayError(ErrorCode.unknown_data_class, str(exc), param="data_class") from exc
    return Explained.model_validate(decision.as_dict())


@_v1.get("/config", tags=["operator", "security"], summary="The running config's digest")
async def config(control: Control, caller: Reader) -> ConfigStatus:
    runtime = control.runtime
    reloader = runtime.reloader
    reloads = reloader.status() if reloader is not None else {}
    return ConfigStatus(
        digest=config_digest(runtime.config),
        source=reloads.get("path"),
        loaded_at=reloads.get("loaded_at"),
        last_reload_error=reloads.get("last_reload_error"),
        reload_failures=reloads.get("reload_failures", 0),
        needs_restart=reloads.get("needs_restart", []),
    )


@_v1.post(
    "/config/validate",
    tags=["operator", "security"],
    summary="Every problem a candidate gateway.yaml would be refused for (nothing changes)",
)
async def validate_config(
    body: ConfigCandidate, request: Request, control: Control, caller: Reader
) -> ConfigValidation:
    if len(body.yaml.encode()) > MAX_CANDIDATE_BYTES:
        raise GatewayError(
            ErrorCode.invalid_request, f"yaml is over {MAX_CANDIDATE_BYTES} bytes", param="yaml"
        )
    async with request.app.state.parse_lock:
        problems = await in_thread(request, caller, control.validate, body.yaml)
    return ConfigValidation(valid=not problems, problems=problems)


@_v1.post("/reload", tags=["operator"], summary="Reload gateway.yaml and the policy files")
async def reload(control: Control, caller: Operator) -> ActionResult:
    changed = await control.reload()
    runtime = control.runtime
    error = reload_error(runtime)
    if error:  # nothing changed, and the record says why (the digest of the error)
        await act(control, caller, "reload", "config", {"error": error}, failed=True)
        raise GatewayError(
            ErrorCode.invalid_request, f"reload failed; the running config stays: {error}"
        )
    change = {"config": config_digest(runtime.config), "policy": runtime.policies.current.digest}
    return await act(control, caller, "reload", "config", change, changed=changed)


@_v1.post("/drain", tags=["operator"], summary="Stop taking requests; finish running ones")
async def drain(control: Control, caller: Operator) -> ActionResult:
    change = {"draining": True, "running": len(control.runtime.serving)}
    started = not control.runtime.draining  # a second drain changes nothing
    result = await act(control, caller, "drain", "gateway", change, changed=started)
    control.drain()
    return result
