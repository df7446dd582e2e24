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


def provenance_imports(path: Path) -> set[str]:
    """What `path` imports of gateway.provenance, relative to it ('' for the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
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
    assert not wing_may_import("formats", "writer.log")
    assert not wing_may_import("audit", "")  # the package API imports every wing
    assert not wing_may_import("writer", "audit.verify")
    assert not wing_may_import("writer", "witness.witness")
    assert wing_may_import("writer", "witness.client")
    assert wing_may_import("formats", "errors")
