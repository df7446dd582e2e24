"""The admin API's OpenAPI schema as the API answers.

FastAPI lists a `422` with its own `HTTPValidationError` body for every operation that
takes a body or parameters, but the admin app answers a request that does not validate
with 400 and an OpenAI error object (errors.py `_invalid`), like every owngate error. The
schema says so instead: each `422` becomes a `400` whose body is `ErrorResponse`, and
FastAPI's validation schemas, then unused, are dropped.

FastAPI knows nothing of the admin token (auth.py reads the header itself), so the
schema also declares what a client holding only it must know: every operation under
`/admin/` and `/log/` needs the bearer token (`security: adminToken`), answers 401
without a valid one and 403 to a role it does not serve (all but the "any role" ones),
and any other error (404, 413, 429, 503, ...) as an `ErrorResponse` (`default`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

__all__ = ["ERROR_RESPONSE", "with_error_objects"]

ERROR_RESPONSE: dict[str, Any] = {
    "title": "ErrorResponse",
    "description": "An OpenAI error object, as every owngate error is.",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"type": "string"},
            },
        }
    },
}

_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
_INVALID = {
    "description": "The request does not validate (code invalid_request)",
    "content": _ERROR_BODY,
}
_UNAUTHENTICATED = {
    "description": "No admin token, or not a valid one (missing_api_key, invalid_api_key)",
    "content": _ERROR_BODY,
}
_FORBIDDEN = {
    "description": "The token's role may not use this operation (permission_denied)",
    "content": _ERROR_BODY,
}
_OTHER_ERROR = {"description": "Any other error, as an OpenAI error object", "content": _ERROR_BODY}
_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "An admin token (admin.tokens: operator, security or auditor role; "
    "admin.token_hashes: every role), as 'Authorization: Bearer TOKEN'",
}
_PROTECTED = ("/admin/", "/log/")  # every other path (openapi.json, console) is open


def with_error_objects(app: FastAPI) -> None:
    """Make `app.openapi()` describe invalid requests as the app answers them."""
    build = app.openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            _rewrite(build())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]


def _rewrite(doc: dict[str, Any]) -> None:
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if responses.pop("422", None) is not None:
                responses["400"] = _INVALID
            for status, response in responses.items():
                if status >= "400" and "content" not in response:  # an error has a body
                    response["content"] = _ERROR_BODY
            if path.startswith(_PROTECTED):
                operation["security"] = [{"adminToken": []}]
                responses["401"] = _UNAUTHENTICATED
                if "any role" not in operation.get("tags", ()):
                    responses["403"] = _FORBIDDEN
            responses["default"] = _OTHER_ERROR
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["ErrorResponse"] = ERROR_RESPONSE
    components["securitySchemes"] = {"adminToken": _BEARER}
