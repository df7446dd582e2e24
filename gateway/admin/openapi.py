"""The admin API's OpenAPI schema as the API answers.

FastAPI lists a `422` with its own `HTTPValidationError` body for every operation that
takes a body or parameters, but the admin app answers a request that does not validate
with 400 and an OpenAI error object (errors.py `_invalid`), like every owngate error. The
schema says so instead: each `422` becomes a `400` whose body is `ErrorResponse`, and
FastAPI's validation schemas, then unused, are dropped.
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

_INVALID = {
    "description": "The request does not validate (code invalid_request)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
}


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
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses["400"] = _INVALID
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["ErrorResponse"] = ERROR_RESPONSE
