"""Who the caller is, and the timelines the console charts (`gateway/admin/timeline.py`
samples them): `GET /admin/v1/whoami` (any token), `/admin/v1/timeline/backends`
(operator), `/timeline/policies` (security), `/timeline/log` (auditor)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from gateway.admin.auth import FULL_ACCESS, LOOPBACK_READS, Caller, authenticated, require
from gateway.admin.timeline import Timeline

__all__ = ["router"]

router = APIRouter(prefix="/admin/v1")
_ROLES = ("operator", "security", "auditor")


class WhoAmI(BaseModel):
    role: Literal["operator", "security", "auditor", "full", "loopback"] = Field(
        description="loopback: a loopback client without a token (admin.allow_loopback), "
        "which may read every role's endpoints (GET) and change nothing"
    )
    may: list[str] = Field(description="the roles whose endpoints (and console pages) it may use")


class BackendSample(BaseModel):
    waiting: int | None = Field(description="scraped queue (null: no fresh reading)")
    running: int | None
    inflight: int
    breaker: Literal["closed", "open", "half_open"]
    requests: int = Field(description="answered in the interval, any status")
    errors: int = Field(description="answered with a status >= 500 in the interval")
    error_rate: float | None = Field(description="errors / requests; null when no request")
    ttft_p50_s: float | None = Field(description="estimated from the TTFT histogram's buckets")
    ttft_p99_s: float | None


class BackendsAt(BaseModel):
    t: float = Field(description="Unix time of the sample")
    backends: dict[str, BackendSample]


class BackendTimeline(BaseModel):
    interval_s: float
    samples: list[BackendsAt] = Field(description="oldest first")


class PoliciesAt(BaseModel):
    t: float
    decisions: dict[str, int] = Field(description="declared rule id -> decisions it took part in")
    refusals: dict[str, int] = Field(description="declared rule id -> requests it refused")


class PolicyTimeline(BaseModel):
    interval_s: float
    samples: list[PoliciesAt]


class LogAt(BaseModel):
    t: float
    entries: int | None = Field(description="entries made durable (null: no log open)")
    checkpoint_size: int | None = Field(description="tree size of the newest checkpoint")
    cosigned_size: int | None = Field(description="the size every witness cosigned")


class LogTimeline(BaseModel):
    interval_s: float
    samples: list[LogAt]


def _timeline(request: Request) -> Timeline:
    timeline: Timeline = request.app.state.timeline
    return timeline


_Timeline = Annotated[Timeline, Depends(_timeline)]
_Since = Annotated[
    float | None, Query(description="only the samples taken after this Unix time (polling)")
]


@router.get("/whoami", tags=["any role"], summary="The caller's role and what it may use")
async def whoami(caller: Annotated[Caller, Depends(authenticated)]) -> WhoAmI:
    if caller.role == FULL_ACCESS:
        return WhoAmI(role="full", may=list(_ROLES))
    if caller.role == LOOPBACK_READS:
        return WhoAmI(role="loopback", may=list(_ROLES))
    return WhoAmI.model_validate({"role": caller.role, "may": [caller.role]})


@router.get("/timeline/backends", tags=["operator"], summary="Per-backend samples over time")
async def backends(
    timeline: _Timeline,
    caller: Annotated[Caller, Depends(require("operator"))],
    since: _Since = None,
) -> BackendTimeline:
    return BackendTimeline.model_validate(
        {"interval_s": timeline.interval_s, "samples": timeline.backends(since)}
    )


@router.get("/timeline/policies", tags=["security"], summary="Decisions and refusals per rule")
async def policies(
    timeline: _Timeline,
    caller: Annotated[Caller, Depends(require("security"))],
    since: _Since = None,
) -> PolicyTimeline:
    return PolicyTimeline.model_validate(
        {"interval_s": timeline.interval_s, "samples": timeline.policies(since)}
    )


@router.get("/timeline/log", tags=["auditor"], summary="Log size, checkpoints and cosignatures")
async def log(
    timeline: _Timeline,
    caller: Annotated[Caller, Depends(require("auditor"))],
    since: _Since = None,
) -> LogTimeline:
    return LogTimeline.model_validate(
        {"interval_s": timeline.interval_s, "samples": timeline.log(since)}
    )
