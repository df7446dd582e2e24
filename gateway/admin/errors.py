"""The admin API's error format: every error it answers (its own `GatewayError`s, a 404
or 405 of the router, a body FastAPI refuses, a fault of the app itself) is an OpenAI
error object, like everywhere else in owngate. `app.py` installs these handlers.
"""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from gateway.admin.headers import API_HEADERS
from gateway.api.labels import excerpt
from gateway.errors import ErrorCode, GatewayError, error_body

__all__ = ["_gateway_error", "_http_error", "_internal", "_invalid"]


def _json_error(
    code: ErrorCode, message: str, status: int | None = None, param: str | None = None
) -> Response:
    return Response(
        error_body(code, message, param),
        status_code=status or code.status,
        media_type="application/json",
    )


async def _gateway_error(request: Request, error: GatewayError) -> Response:
    response = _json_error(error.code, error.message, error.status, error.param)
    for name, value in error.headers:  # such as a 503's `retry-after`
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    return response


async def _http_error(request: Request, error: HTTPException) -> Response:
    cause = error.__cause__  # FastAPI wraps what reading the body raised (limits.py)
    if isinstance(cause, GatewayError):
        return await _gateway_error(request, cause)
    if error.status_code == 404:
        return _json_error(ErrorCode.not_found, "Unknown admin path.")
    if error.status_code == 405:
        return _json_error(ErrorCode.method_not_allowed, "Method not allowed on this path.")
    return _json_error(ErrorCode.invalid_request, str(error.detail), error.status_code)


async def _internal(request: Request, error: Exception) -> Response:
    """A fault of the admin API itself: the error object, never Starlette's plain text.
    Starlette answers it from outside every middleware (its `ServerErrorMiddleware`), so
    `ApiHeaders` never sees it: it carries the security headers itself."""
    response = _json_error(ErrorCode.internal_error, "internal error of the admin API")
    for name, value in API_HEADERS:
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    return response


async def _invalid(request: Request, error: RequestValidationError) -> Response:
    """400 naming where the body went wrong. The location can hold a key the caller chose
    (an unknown field's name) and the message a value it sent: each is quoted as a
    bounded, escaped `excerpt`."""
    first = error.errors()[0] if error.errors() else {}
    where = excerpt(".".join(str(part) for part in first.get("loc", ())))
    reason = excerpt(str(first.get("msg", "invalid")), 200)
    return _json_error(ErrorCode.invalid_request, f"{where}: {reason}")
