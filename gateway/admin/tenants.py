"""Tenants, their limits and their current use (operator, security):
`GET /admin/v1/tenants`. The limits are the running config's; the use is what the
shared state keeps (docs/state.md): with `state: memory` this process's, with
`state: redis` this replica's ledger (the totals across replicas live in Redis)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from gateway.admin.auth import Caller, require
from gateway.api.runtime import Runtime
from gateway.tenants import tenant_limits

__all__ = ["router"]

router = APIRouter(prefix="/admin/v1", tags=["operator", "security"])


class Limits(BaseModel):
    """A tenant's `limits` in gateway.yaml (null: unlimited)."""

    requests_per_minute: int | None
    tokens_per_minute: int | None
    concurrent_requests: int | None
    reserved_tokens_per_answer: int | None = None
    reserved_tokens_per_media: int | None = None


class Use(BaseModel):
    """What the tenant uses of its limits now (null: that limit is not set, so no use
    is kept of it)."""

    inflight: int | None = Field(description="requests holding a concurrency slot")
    requests: int | None = Field(description="requests within the last minute's window")
    tokens: int | None = Field(
        description="tokens within the last minute's window, reservations included"
    )
    reserved: int | None = Field(
        default=None, description="tokens reserved by requests in flight (settled when they end)"
    )
    scope: Literal["process", "replica"] = Field(
        description="process: state memory; replica: this replica's part (state redis)"
    )


class Tenant(BaseModel):
    id: str
    models: list[str] = Field(description="model names or aliases it may use; '*': all")
    keys: int = Field(description="API keys it has (their digests: GET /admin/v1/keys)")
    limits: Limits
    use: Use


class TenantList(BaseModel):
    tenants: list[Tenant]


@router.get("/tenants", summary="Tenants, their limits and current use")
async def tenants(
    request: Request, caller: Annotated[Caller, Depends(require("operator", "security"))]
) -> TenantList:
    runtime: Runtime = request.app.state.control.runtime
    state = runtime.state
    scope: Literal["process", "replica"] = (
        "replica" if state.status().backend == "redis" else "process"
    )
    rows = []
    for tenant in runtime.config.tenants:
        use = state.tenant_use(tenant.id, tenant_limits(tenant))
        rows.append(
            Tenant(
                id=tenant.id,
                models=list(tenant.models),
                keys=len(tenant.api_key_hashes),
                limits=Limits.model_validate(tenant.limits.model_dump()),
                use=Use(
                    inflight=use.inflight,
                    requests=use.requests,
                    tokens=use.tokens,
                    reserved=use.reserved,
                    scope=scope,
                ),
            )
        )
    return TenantList(tenants=rows)
