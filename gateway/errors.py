"""The one error type of owngate and its mapping to HTTP status and the OpenAI error envelope.

Every failure a client can see is a `GatewayError` with a code from the closed set
`ErrorCode`. The code fixes the HTTP status and the OpenAI `type` (one exception: a rate
limit's `type` names the limit, `requests` or `tokens`, as OpenAI's does); the message is
for humans and must never carry prompt content, keys or backend URLs.
"""

from __future__ import annotations

import enum
from typing import Final

import orjson

__all__ = ["ErrorCode", "GatewayError", "error_body"]


class ErrorCode(enum.Enum):
    """Closed set of error codes; each fixes an HTTP status and an OpenAI error type."""

    invalid_api_key = "invalid_api_key"
    missing_api_key = "missing_api_key"
    permission_denied = "permission_denied"
    policy_denied = "policy_denied"
    unknown_data_class = "unknown_data_class"
    no_compliant_backend = "no_compliant_backend"
    invalid_json = "invalid_json"
    invalid_request = "invalid_request"
    missing_model = "missing_model"
    model_not_found = "model_not_found"
    not_found = "not_found"
    method_not_allowed = "method_not_allowed"
    request_too_large = "request_too_large"
    unsupported_media_type = "unsupported_media_type"
    request_timeout = "request_timeout"
    headers_too_large = "headers_too_large"
    upstream_bad_request = "upstream_bad_request"
    upstream_error = "upstream_error"
    backend_unavailable = "backend_unavailable"
    upstream_timeout = "upstream_timeout"
    not_ready = "not_ready"
    rate_limit_exceeded = "rate_limit_exceeded"
    provenance_unavailable = "provenance_unavailable"
    internal_error = "internal_error"

    @property
    def status(self) -> int:
        return _SPEC[self][0]

    @property
    def type(self) -> str:
        return _SPEC[self][1]


_INVALID = "invalid_request_error"
_SPEC: Final[dict[ErrorCode, tuple[int, str]]] = {
    ErrorCode.invalid_api_key: (401, _INVALID),
    ErrorCode.missing_api_key: (401, _INVALID),
    ErrorCode.permission_denied: (403, "permission_error"),
    ErrorCode.policy_denied: (403, "permission_error"),
    ErrorCode.unknown_data_class: (400, _INVALID),
    ErrorCode.no_compliant_backend: (503, "service_unavailable"),
    ErrorCode.invalid_json: (400, _INVALID),
    ErrorCode.invalid_request: (400, _INVALID),
    ErrorCode.missing_model: (400, _INVALID),
    ErrorCode.model_not_found: (404, _INVALID),
    ErrorCode.not_found: (404, _INVALID),
    ErrorCode.method_not_allowed: (405, _INVALID),
    ErrorCode.request_too_large: (413, _INVALID),
    ErrorCode.unsupported_media_type: (415, _INVALID),
    ErrorCode.request_timeout: (408, _INVALID),
    ErrorCode.headers_too_large: (431, _INVALID),
    ErrorCode.upstream_bad_request: (400, _INVALID),
    ErrorCode.upstream_error: (502, "api_error"),
    ErrorCode.backend_unavailable: (503, "service_unavailable"),
    ErrorCode.upstream_timeout: (504, "timeout"),
    ErrorCode.not_ready: (503, "service_unavailable"),
    ErrorCode.rate_limit_exceeded: (429, "requests"),
    ErrorCode.provenance_unavailable: (503, "service_unavailable"),
    ErrorCode.internal_error: (500, "api_error"),
}


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
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code: Final = code
        self.message: Final = message
        self.param: Final = param
        self.status: Final = status if status is not None else code.status
        self.headers: Final = headers
        self.error_type: Final = error_type if error_type is not None else code.type

    def body(self) -> bytes:
        return error_body(self.code, self.message, self.param, error_type=self.error_type)

    def detached(self) -> GatewayError:
        """The same error as a new object, never raised: one to keep on an object that the
        frames this one was raised through hold (kept there, the raised one would hold them
        in a reference cycle through its traceback, the request's body among their locals,
        until the cyclic collector ran)."""
        return GatewayError(
            self.code,
            self.message,
            param=self.param,
            status=self.status,
            headers=self.headers,
            error_type=self.error_type,
        )

    def __repr__(self) -> str:
        return f"GatewayError({self.code.name}, {self.message!r})"


def error_body(
    code: ErrorCode, message: str, param: str | None = None, *, error_type: str | None = None
) -> bytes:
    """Encode the OpenAI error envelope `{"error": {message, type, param, code}}`.

    `type` is the code's own unless `error_type` names another (a rate limit's kind)."""
    kind = error_type if error_type is not None else code.type
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": code.value}}
    )
