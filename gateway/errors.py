"""The one error type of owngate and its mapping to HTTP status and the OpenAI error envelope.

Every failure a client can see is a `GatewayError` with a code from the closed set
`ErrorCode`. The code fixes the HTTP status and the OpenAI `type`; the message is for
humans and must never carry prompt content, keys or backend URLs.
"""

from __future__ import annotations

import enum
from typing import Final

import orjson

__all__ = ["ErrorCode", "GatewayError", "error_body"]


class ErrorCode(enum.Enum):
    """Closed set of error codes: value is (http status, OpenAI error type)."""

    invalid_api_key = (401, "invalid_request_error")
    missing_api_key = (401, "invalid_request_error")
    permission_denied = (403, "permission_error")
    invalid_json = (400, "invalid_request_error")
    invalid_request = (400, "invalid_request_error")
    missing_model = (400, "invalid_request_error")
    model_not_found = (404, "invalid_request_error")
    not_found = (404, "invalid_request_error")
    method_not_allowed = (405, "invalid_request_error")
    request_too_large = (413, "invalid_request_error")
    unsupported_media_type = (415, "invalid_request_error")
    upstream_bad_request = (400, "invalid_request_error")
    upstream_error = (502, "api_error")
    backend_unavailable = (503, "service_unavailable")
    upstream_timeout = (504, "timeout")
    not_ready = (503, "service_unavailable")
    internal_error = (500, "api_error")

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def type(self) -> str:
        return self.value[1]


class GatewayError(Exception):
    """A failure with a code from `ErrorCode`, rendered as an OpenAI error object."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code: Final = code
        self.message: Final = message
        self.param: Final = param
        self.status: Final = status if status is not None else code.status
        self.headers: Final = headers

    def body(self) -> bytes:
        return error_body(self.code, self.message, self.param)

    def __repr__(self) -> str:
        return f"GatewayError({self.code.name}, {self.message!r})"


def error_body(code: ErrorCode, message: str, param: str | None = None) -> bytes:
    """Encode the OpenAI error envelope `{"error": {message, type, param, code}}`."""
    return orjson.dumps(
        {"error": {"message": message, "type": code.type, "param": param, "code": code.name}}
    )
