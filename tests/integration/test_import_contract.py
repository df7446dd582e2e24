"""The import rules (issue 13, item 7) are live: `ruff check` (part of `make test`) fails
when the policy core or the provenance package imports the server, routing, upstream,
state, gateway.yaml's types, a web framework, Redis or LiteLLM, when routing imports
the HTTP surface, or when the HTTP surface imports the composition root. Each probe is
checked as if it were a module in that package, through the package's own ruff.toml (for
provenance's wings, the closest one: the package's).

Inside `gateway.provenance`, the wings import each other only as its docstring says:
`formats` imports no other wing, `audit` and `witness` only `formats`, `writer` `formats`
and `witness.client`; read from the source here, since ruff has no rule per subpackage."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT

RUFF = Path(sys.executable).parent / "ruff"


def banned(package: str, source: str) -> str:
    """ruff's TID251 findings for `source` as a module of `package` (empty: allowed)."""
    done = subprocess.run(
        [str(RUFF), "check", "--select", "TID251", "--stdin-filename", f"{package}/_probe.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout if "TID251" in done.stdout else ""


@pytest.mark.parametrize(
    ("package", "source"),
    [
        ("gateway/provenance", "import redis\n"),
        ("gateway/provenance", "from gateway.api.app import GatewayApp\n"),
        ("gateway/provenance", "from gateway.routing.registry import Registry\n"),
        ("gateway/provenance", "import litellm\n"),
        ("gateway/provenance", "from starlette.requests import Request\n"),
        ("gateway/provenance/formats", "import redis\n"),
        ("gateway/provenance/writer", "from gateway.state import SharedState\n"),
        ("gateway/provenance/audit", "from gateway.config.schema import BackendSettings\n"),
        ("gateway/provenance/witness", "import uvicorn\n"),
        ("gateway/provenance/witness", "from gateway.listener import serve_listener\n"),
        ("gateway/provenance/writer", "from gateway.tenants import index_keys\n"),
        ("gateway/provenance/audit", "from gateway import admin\n"),
        ("gateway/policy", "from gateway.workers import Workers\n"),
        ("gateway/policy", "from ..demo import main\n"),
        ("gateway/policy", "from gateway.config.schema import BackendSettings\n"),
        ("gateway/policy", "from gateway.upstream.hosted import HostedClient\n"),
        ("gateway/policy", "from gateway.state import SharedState\n"),
        ("gateway/policy", "import uvicorn\n"),
        ("gateway/routing", "from gateway.api.proxy import Proxy\n"),
        ("gateway/routing", "import fastapi\n"),
        ("gateway/api", "from gateway.app import assemble\n"),
        ("gateway/api", "import fastapi\n"),
        ("gateway/api", "from starlette.requests import Request\n"),
    ],
)
def test_a_forbidden_import_fails_the_lint(package: str, source: str) -> None:
    assert banned(package, source), f"{package} may import: {source.strip()}"


@pytest.mark.parametrize(
    ("package", "source"),
    [
        ("gateway/provenance", "from gateway.canonical import canonical_json\n"),
        ("gateway/provenance/formats", "from gateway.canonical import canonical_json\n"),
        ("gateway/policy", "from gateway.policy.types import BackendFacts\n"),
        ("gateway/routing", "from gateway.policy import Decision\n"),
        ("gateway/api", "from gateway.routing.registry import Registry\n"),
        ("gateway/provenance", "from gateway.asgi import read_body, respond\n"),
    ],
)
def test_the_allowed_direction_passes(package: str, source: str) -> None:
    assert banned(package, source) == ""


PROVENANCE = REPO_ROOT / "gateway" / "provenance"
SHARED = {"errors", "files", "keys"}  # beside the wings; `testing` and the API are not
WINGS: dict[str, tuple[str, ...]] = {  # a wing's modules may import these (and SHARED)
    "formats": ("formats",),
    "audit": ("audit", "formats"),
    "witness": ("witness", "formats"),
    "writer": ("writer", "formats", "witness.client"),
}


def provenance_imports(path: Path, package: tuple[str, ...] | None = None) -> set[str]:
    """What `path` imports of gateway.provenance, relative to it ('' for the package);
    `package`: the package `path` is a module of (default: where it lies in the tree), from
    which its relative imports are resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:  # relative: resolved from `package`
            package = package or path.relative_to(REPO_ROOT).parent.parts
            base = ".".join(package[: len(package) - node.level + 1])
            names = [f"{base}.{node.module}" if node.module else base]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name == "gateway.provenance" or name.startswith("gateway.provenance."):
                found.add(name.removeprefix("gateway.provenance").removeprefix("."))
    return found


def test_every_provenance_module_is_in_a_wing_or_shared() -> None:
    top = {path.stem for path in PROVENANCE.glob("*.py")} - {"__init__", "testing"}
    assert top == SHARED
    assert {path.name for path in PROVENANCE.iterdir() if (path / "__init__.py").exists()} == set(
        WINGS
    )


def wing_may_import(wing: str, name: str) -> bool:
    """Whether a module of `wing` may import gateway.provenance's `name` ('' the package)."""
    if name.split(".")[0] in SHARED:
        return True
    return any(name == prefix or name.startswith(prefix + ".") for prefix in WINGS[wing])


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_a_wing_imports_only_what_the_wing_rules_allow(wing: str) -> None:
    for path in sorted((PROVENANCE / wing).glob("*.py")):
        for name in provenance_imports(path):
            assert wing_may_import(wing, name), f"{path.relative_to(REPO_ROOT)} imports {name!r}"


def test_the_wing_check_refuses_a_forbidden_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from gateway.provenance.writer.log import ProvenanceLog\n"
        "import gateway.provenance\n"
        "from gateway.provenance.errors import ProofError\n"
    )
    assert provenance_imports(probe) == {"writer.log", "", "errors"}
    # Relative imports are resolved from the module's place (the lint above does too).
    probe.write_text("from ..writer.log import ProvenanceLog\nfrom .. import audit\n")
    assert provenance_imports(probe, ("gateway", "provenance", "formats")) == {"writer.log", ""}
    assert not wing_may_import("formats", "writer.log")
    assert not wing_may_import("audit", "")  # the package API imports every wing
    assert not wing_may_import("writer", "audit.verify")
    assert not wing_may_import("writer", "witness.witness")
    assert wing_may_import("writer", "witness.client")
    assert wing_may_import("formats", "errors")


# ruff's TID251 sees a module's own imports only: `gateway.provenance` importing an allowed
# gateway module that imports uvicorn, gateway.config or shared state (gateway.listener,
# gateway.tenants, gateway.pki, ...) passes the lint. What each package's modules load,
# through anything, is checked here by importing every one of them in a fresh interpreter.
_SERVER = (
    *("gateway.api", "gateway.app", "gateway.serving", "gateway.listener", "gateway.workers"),
    *("gateway.admin", "gateway.attest", "gateway.demo", "gateway.routing", "gateway.upstream"),
    *("gateway.state", "gateway.config", "gateway.tenants"),
    *("uvicorn", "httptools", "fastapi", "starlette", "redis", "litellm"),
)
NEVER_LOADED: dict[str, tuple[str, ...]] = {
    "gateway.provenance": (*_SERVER, "gateway.policy"),
    "gateway.policy": (*_SERVER, "gateway.provenance"),
    "gateway.routing": ("gateway.api", "gateway.app", "gateway.admin", "fastapi", "starlette"),
}

_LOADED = """
import importlib, json, pkgutil, sys
package, never = sys.argv[1], tuple(sys.argv[2:])
def forbidden():
    return {n for n in never for m in list(sys.modules) if m == n or m.startswith(n + ".")}
top = importlib.import_module(package)
names = [package, *(i.name for i in pkgutil.walk_packages(getattr(top, "__path__", []),
                                                         package + "."))]
found, seen = {}, set()
for name in names:
    importlib.import_module(name)
    now = forbidden()
    if now - seen:
        found[name] = sorted(now - seen)
    seen = now
print(json.dumps({"modules": len(names), "found": found}))
"""


def loaded_through_anything(package: str, never: tuple[str, ...]) -> dict[str, object]:
    """Which of `package`'s modules load a module of `never` (transitively), and how many
    modules it has; each module imported in turn, in one fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, package, *never],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("package", sorted(NEVER_LOADED))
def test_no_module_loads_a_forbidden_layer_through_another(package: str) -> None:
    result = loaded_through_anything(package, NEVER_LOADED[package])
    assert result["found"] == {}
    assert isinstance(result["modules"], int) and result["modules"] > 5  # the walk found them


def test_the_transitive_check_sees_a_layer_loaded_through_an_allowed_module() -> None:
    # gateway.pki passes the lint as an import of gateway.provenance or gateway.policy, and
    # loads gateway.config and gateway.upstream.
    result = loaded_through_anything("gateway.pki", ("gateway.config", "gateway.upstream"))
    assert result["found"] == {"gateway.pki": ["gateway.config", "gateway.upstream"]}


def imports_of_test_modules(tests: Path) -> list[str]:
    """Each import of a test module (`test_*`) by a module under `tests`, as "path: name"
    (a relative import's name keeps its leading dots)."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [
                f"{path.relative_to(tests.parent)}: {name}"
                for name in names
                if (name.startswith(("tests.", ".")))
                and any(part.startswith("test_") for part in name.split("."))
            ]
    return sorted(set(found))


def test_no_test_module_imports_another(tmp_path: Path) -> None:
    # What tests share lives in tests/helpers/ (issue 13, item 6), never in a test module.
    assert imports_of_test_modules(REPO_ROOT / "tests") == []
    probe = tmp_path / "tests" / "unit" / "test_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from tests.unit.test_x import y\nfrom .test_z import w\nimport tests.helpers\n"
    )
    assert imports_of_test_modules(tmp_path / "tests") == [
        "tests/unit/test_probe.py: .test_z",
        "tests/unit/test_probe.py: .test_z.w",
        "tests/unit/test_probe.py: tests.unit.test_x",
        "tests/unit/test_probe.py: tests.unit.test_x.y",
    ]
