"""Running policy test cases against the running policy set (security):
`POST /admin/v1/policies/test`, what `owngate policy test` does.

With an empty body the cases are the running set's own (`tests/` in each policy
directory, as `owngate policy test` finds them); with `cases_yaml`, the cases given
(at most `MAX_CASES_BYTES`). Cases that cannot be read, parsed or validated are a 400
naming every problem, never a 500. Run in a worker thread: the files are read and the
cases decided off the event loop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.admin.auth import Caller, require
from gateway.admin.work import in_thread
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.cases import TestReport, default_case_paths, load_cases, parse_cases, run_cases

__all__ = ["MAX_CASES_BYTES", "router"]

MAX_CASES_BYTES = 256 * 1024
router = APIRouter(prefix="/admin/v1", tags=["security"])


class CasesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cases_yaml: str | None = Field(
        default=None,
        max_length=MAX_CASES_BYTES,
        description="a case file's text (kind: PolicyTest); absent: the policy set's own",
    )


class CaseOutcome(BaseModel):
    name: str = Field(description="the suite's metadata.id and the case's name")
    passed: bool
    problems: list[str]


class CasesReport(BaseModel):
    passed: bool
    total: int
    failed: int
    coverage: float = Field(description="rules exercised over rules defined, 0..1")
    cases: list[CaseOutcome]


@router.post("/policies/test", summary="Run policy test cases against the running set")
async def test_policies(
    body: CasesRequest, request: Request, caller: Annotated[Caller, Depends(require("security"))]
) -> CasesReport:
    runtime: Runtime = request.app.state.control.runtime
    text = body.cases_yaml
    if text is not None and len(text.encode()) > MAX_CASES_BYTES:
        raise GatewayError(
            ErrorCode.invalid_request,
            f"cases_yaml is over {MAX_CASES_BYTES} bytes",
            param="cases_yaml",
        )
    async with request.app.state.parse_lock:  # one at a time (gateway/admin/app.py)
        report = await in_thread(request, caller, _run, runtime, text)
    return CasesReport(
        passed=not report.failed,
        total=len(report.results),
        failed=report.failed,
        coverage=report.coverage,
        cases=[
            CaseOutcome(name=f"{r.suite}: {r.name}", passed=r.passed, problems=list(r.failures))
            for r in report.results
        ],
    )


def _run(runtime: Runtime, text: str | None) -> TestReport:
    trust = runtime.policies
    policy_set = trust.current  # one read: the cases see one set
    if text is None:
        suites, errors = load_cases(default_case_paths(trust.paths))
    else:
        suites, errors = parse_cases("cases_yaml", text)
    if errors:
        problems = "; ".join(str(issue) for issue in errors[:20])
        raise GatewayError(ErrorCode.invalid_request, f"invalid test cases: {problems}")
    if not suites:
        where = "in cases_yaml" if text is not None else "in the policy directories' tests/"
        raise GatewayError(ErrorCode.invalid_request, f"no test cases found {where}")
    return run_cases(policy_set, suites)
