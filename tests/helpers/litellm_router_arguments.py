"""The request arguments the installed LiteLLM's Router reads: what a LiteLLM proxy's
request body becomes (tests/unit/test_control_fields.py checks each is refused or listed).

A LiteLLM proxy calls its Router with the JSON body as keyword arguments
(`router.acompletion(**data)`), so the Router's arguments are read from the body in two
ways, both found here without regexes:

- the named parameters of every Router method that takes `**kwargs` (`inspect`): the
  method is called with the body, so `specific_deployment=` or `is_fallback=` in it binds;
- the string keys the Router and its helper packages (`router_utils`, `router_strategy`)
  read from a mapping of keyword arguments (`ast`): `kwargs.pop("x")`, `.get("x")`,
  `.setdefault("x")`, `kwargs["x"]`, `"x" in kwargs`, where the mapping's variable name
  holds `kwargs` (`kwargs`, `request_kwargs`, `hop_kwargs`, ...).

Run as `python -m tests.helpers.litellm_router_arguments` (it prints the names as JSON):
LiteLLM is imported as the gateway does (`load_litellm`), in a child process of the test.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path
from typing import Any

__all__ = ["router_arguments"]

# Mapping methods that read a key given as their first argument.
_READS = frozenset({"get", "pop", "setdefault"})


def _text(node: ast.expr) -> str | None:
    """The string a constant node holds, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _kwargs_key(node: ast.AST) -> str | None:
    """The key `node` reads from a keyword-argument mapping (`*kwargs*`), else None."""
    mapping: ast.expr | None = None
    key: str | None = None
    match node:
        case ast.Call(func=ast.Attribute(value=value, attr=attr), args=[first, *_]):
            if attr in _READS:
                mapping, key = value, _text(first)
        case ast.Subscript(value=value, slice=index, ctx=ast.Load()):
            mapping, key = value, _text(index)
        case ast.Compare(left=left, ops=[ast.In() | ast.NotIn()], comparators=[value]):
            mapping, key = value, _text(left)
    if isinstance(mapping, ast.Name) and "kwargs" in mapping.id:
        return key
    return None


def _sources(litellm: Any) -> list[Path]:
    """router.py and the modules of the packages its Router calls with its kwargs."""
    package = Path(inspect.getfile(litellm)).parent
    helpers = [p for d in ("router_utils", "router_strategy") for p in (package / d).rglob("*.py")]
    return [package / "router.py", *sorted(helpers)]


def router_arguments() -> dict[str, list[str]]:
    """Each argument name the installed Router reads from a call's keyword arguments,
    with where it is read (`Router.<method>` for a parameter, a file name for a key)."""
    from gateway.upstream.litellm_runtime import load_litellm

    litellm = load_litellm()
    found: dict[str, set[str]] = {}
    for attr, method in inspect.getmembers(litellm.Router, inspect.isfunction):
        params = inspect.signature(method).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            continue  # not called with a request's keyword arguments
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                found.setdefault(p.name, set()).add(f"Router.{attr}")
    for source in _sources(litellm):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            key = _kwargs_key(node)
            if key is not None:
                found.setdefault(key, set()).add(source.name)
    return {name: sorted(where) for name, where in sorted(found.items())}


if __name__ == "__main__":
    print(json.dumps(router_arguments()))
