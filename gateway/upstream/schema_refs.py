"""How far the JSON Schema `$ref`s of a hosted request would expand: bounded before LiteLLM
inlines them.

LiteLLM 1.108.7 replaces every `$ref` of a tool's `parameters` with a deep copy of the
definition it names before the request leaves for Gemini and Vertex AI
(`_build_vertex_schema`) or Bedrock (`_bedrock_tools_pt`), and walks the copy for more,
with no bound (`unpack_defs` without `max_inlined_bytes`: only its Anthropic path has
one). Definitions that each refer to the next one twice expand to 2**n copies: a body of
2 KB holding 30 of them would hold the gateway's CPU and take its memory until it died,
for every tenant, and the provider was then sent the expansion (16 of them: 5 s of CPU
and 100 MB, measured). `check_schema_refs` walks what LiteLLM would inline, counting
instead of copying, and refuses the request (`InvalidField`, 400, not sent) once that is
past `MAX_INLINED` values, or once references nest past `MAX_REF_DEPTH`. It reads every
`tools`, `functions` and `response_format` object, for every provider (a schema a
provider's adapter inlines today may reach another's tomorrow), and counts generously: a
reference to a name defined in several places (`$defs`, `definitions` or OpenAPI's
`components.schemas`, at any depth) counts every one of them, and inside a copy the
siblings of a `$ref` count too (copied with the definition that holds them, then
dropped). A definition that refers back to one being inlined is left as a reference, as
LiteLLM leaves it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from gateway.upstream.invalid_field import InvalidField

__all__ = ["MAX_INLINED", "MAX_REF_DEPTH", "check_schema_refs"]

MAX_INLINED: Final = 50_000
"""JSON values (objects, arrays, scalars) a request's references may inline in all: far past
a generated schema's (hundreds to a few thousand), some 0.5 s of LiteLLM's time at most."""
MAX_REF_DEPTH: Final = 32
"""References inlined one inside another's copy (each step of the walk keeps the chain)."""

_FIELDS: Final = ("tools", "functions", "response_format")
_DEFINITIONS: Final = ("$defs", "definitions")
_EXPECTED: Final = (
    f"a schema whose `$ref`s inline at most {MAX_INLINED} values, nested at most "
    f"{MAX_REF_DEPTH} deep (the provider's adapter copies each referenced definition in)"
)


def check_schema_refs(params: Mapping[str, Any]) -> None:
    """Raise `InvalidField` naming the field (`tools`, `functions`, `response_format`)
    whose `$ref`s would inline more than `MAX_INLINED` values or nest past
    `MAX_REF_DEPTH`."""
    for field in _FIELDS:
        value = params.get(field)
        if value is not None and not _within_bounds(value):
            raise InvalidField(field, _EXPECTED)


def _within_bounds(value: Any) -> bool:
    definitions: dict[str, list[Any]] = {}
    for node in _nodes(value):
        components = node.get("components")
        places = [node.get(key) for key in _DEFINITIONS]
        if isinstance(components, dict):  # OpenAPI's: inlined for Anthropic and Fireworks
            places.append(components.get("schemas"))
        for found in places:
            if isinstance(found, dict):
                for name, target in found.items():
                    definitions.setdefault(name, []).append(target)
    if not definitions:
        return True  # nothing to inline: the walk would only count what the body holds
    inlined = 0
    # (value, the references whose copies hold it, whether its `$ref`s are followed)
    stack: list[tuple[Any, tuple[str, ...], bool]] = [(value, (), True)]
    while stack:
        node, chain, follow = stack.pop()
        if chain:
            inlined += 1
            if inlined > MAX_INLINED:
                return False
        if isinstance(node, dict):
            ref = node.get("$ref")
            if follow and isinstance(ref, str):  # replaced by its target's copy
                if chain:
                    # Inside a copy its siblings were copied too (a definition is copied
                    # whole, then its references replaced): counted, never followed.
                    # Uncounted, 10,000 values beside a reference in a definition
                    # referred to 1,000 times (a 61 KB body) held LiteLLM's CPU 2 s.
                    stack.extend((v, chain, False) for k, v in node.items() if k != "$ref")
                name = ref.rsplit("/", 1)[-1]
                if name in chain:
                    continue  # a cycle: LiteLLM leaves the reference as it is
                if len(chain) >= MAX_REF_DEPTH and name in definitions:
                    return False
                stack.extend((target, (*chain, name), True) for target in definitions.get(name, ()))
                continue
            stack.extend((item, chain, follow) for item in node.values())
        elif isinstance(node, list):
            stack.extend((item, chain, follow) for item in node)
    return True


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every object in `value`, at any depth (as written: no reference followed)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
