"""What the admin API's routes are given and share: the `AdminControl` the composition root
binds (gateway/app.py `admin_app`), the dependencies that hand it and the caller's role to a
route, and `act`, which writes an admin action's record to the provenance log."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request

from gateway.admin.auth import Caller, require
from gateway.admin.models import ActionResult
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.formats.records import admin_record

__all__ = ["AdminControl", "Control", "Operator", "Reader", "Security", "act", "reload_error"]


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


async def _control(request: Request) -> AdminControl:
    return request.app.state.control  # type: ignore[no-any-return]


Operator = Annotated[Caller, Depends(require("operator"))]
Security = Annotated[Caller, Depends(require("security"))]
Reader = Annotated[Caller, Depends(require("operator", "security"))]
Control = Annotated[AdminControl, Depends(_control)]


def reload_error(runtime: Runtime) -> str | None:
    """Why the last reload of the config or the policy files failed (None: it did not)."""
    reloader = runtime.reloader
    error = reloader.last_error if reloader is not None else None
    return error or runtime.policies.last_error


async def act(
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
            # unknown to every tenant: one whose inclusion proof holds this record's leaf
            # hash as a neighbour confirms no guess of it (which key was revoked, when)
            blind=secrets.token_hex(32),
        )
        try:
            index = (await recorder.log.append(record)).index
        except Exception as exc:
            raise GatewayError(
                ErrorCode.provenance_unavailable, f"the admin record was not logged: {exc}"
            ) from exc
    return ActionResult(action=action, changed=changed, change_digest=digest, log_index=index)
