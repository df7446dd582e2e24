"""Client-supplied names on the request path: read strictly, logged only when known.

The data-class label comes from a request header, so it fails closed: a header that is
present but empty or blank, or several copies (or comma-separated values, as HTTP joins
repeated headers) that do not all name the same class, and the header's name spelled
with `_` for `-`, are refused with `unknown_data_class` (`label_refused`), never read as
"no label" and never "first copy wins". Labels compare as the policy engine compares
them (`normalized`): surrounding spaces and tabs stripped, ASCII lower case; a latin-1
NBSP or NEL byte around a class name is a look-alike, refused.

What a client sends as a label or a model name is not logged: only a declared class or
a configured model name is, and anything else is `UNKNOWN`. Error messages quote at most
`excerpt`: a bounded, printable prefix.
"""

from __future__ import annotations

from gateway.asgi import Scope
from gateway.errors import ErrorCode, GatewayError
from gateway.policy import PolicySet, UnknownDataClass
from gateway.policy.labels import InvalidLabel, one_label

__all__ = [
    "EXCERPT_CHARS",
    "UNKNOWN",
    "InvalidLabel",
    "excerpt",
    "label_refused",
    "read_label",
]

# Stands for a client-supplied name that is not a declared data class or configured model.
# Neither can be spelled this way (class names are [a-z0-9_-]), so the logs stay unambiguous.
UNKNOWN = "<unknown>"
EXCERPT_CHARS = 64


def read_label(scope: Scope, header: bytes) -> str | None:
    """The one label the request's `header` copies name (stripped, lower case), or None
    when the request has no such header. `header` is the lower-case name (ASGI servers
    lower-case header names). Raises `InvalidLabel` for an empty or blank value and for
    copies or comma-separated values that name different labels (`one_label`), and for
    a header whose name is `header` with `_` for some `-` (`x_data_class`): proxies and
    frameworks (CGI, WSGI, nginx with underscores on) read the two as one header, so a
    label sent that way is meant as a label, and is refused, never read as "no label"."""
    values: list[str] = []
    for key, value in scope["headers"]:
        if key == header:
            values.append(value.decode("latin-1"))
        # `find`, not `in`: a bytes `in` first tries its operand as an int, and the
        # TypeError it makes and clears costs ~2,000 instructions, for every header
        elif key.find(b"_") >= 0 and key.replace(b"_", b"-") == header:
            raise InvalidLabel("is spelled with `_` for `-` in its name")
    return one_label(values)


def label_refused(
    policy: PolicySet, tenant: str, problem: InvalidLabel | UnknownDataClass
) -> GatewayError:
    """The 400 for a label the tenant's policy cannot take. The message names the rule
    first (`policy <id>/data_classes: ...`, as refusals do) and quotes at most an
    `excerpt` of what the client sent."""
    header = policy.data_class_header
    policy_id = policy.policy_for(tenant)
    rule = f"{policy_id}/data_classes" if policy_id is not None else policy.default_deny_rule
    if isinstance(problem, InvalidLabel):
        reason = f"the {header} header {problem}"
    else:
        defined = ", ".join(problem.known) or "none"
        reason = (
            f"data class `{excerpt(problem.label)}` in the {header} header is not defined for "
            f"tenant {tenant!r} (defined: {defined}); an unknown label is refused, not ignored"
        )
    message = f"policy {rule}: {reason}; send a defined class, or no {header} header"
    return GatewayError(ErrorCode.unknown_data_class, message, param=header)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of client-supplied `text` with non-printable characters
    escaped as `repr` escapes them (controls, bidi overrides, other invisibles), and
    "..." when cut, for error messages (never for logs)."""
    return repr(text[:limit])[1:-1] + ("..." if len(text) > limit else "")
