"""The import rules (issue 13, item 7) are live: `ruff check` (part of `make test`) fails
when the policy core or the provenance package imports the server, routing, upstream,
state, gateway.yaml's types, a web framework, Redis or LiteLLM, when routing imports
the HTTP surface, or when the HTTP surface imports the composition root. Each probe is
checked as if it were a module in that package, through the package's own ruff.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def banned(package: str, source: str) -> str:
    """ruff's TID251 findings for `source` as a module of `package` (empty: allowed)."""
    done = subprocess.run(
        [str(RUFF), "check", "--select", "TID251", "--stdin-filename", f"{package}/_probe.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
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
        ("gateway/policy", "from gateway.config.schema import Backend\n"),
        ("gateway/policy", "from gateway.upstream.hosted import HostedClient\n"),
        ("gateway/policy", "from gateway.state import SharedState\n"),
        ("gateway/policy", "import uvicorn\n"),
        ("gateway/routing", "from gateway.api.proxy import Proxy\n"),
        ("gateway/routing", "import fastapi\n"),
        ("gateway/api", "from gateway.app import assemble\n"),
    ],
)
def test_a_forbidden_import_fails_the_lint(package: str, source: str) -> None:
    assert banned(package, source), f"{package} may import: {source.strip()}"


@pytest.mark.parametrize(
    ("package", "source"),
    [
        ("gateway/provenance", "from gateway.canonical import canonical_json\n"),
        ("gateway/policy", "from gateway.policy.types import BackendFacts\n"),
        ("gateway/routing", "from gateway.policy import Decision\n"),
        ("gateway/api", "from gateway.routing.registry import Registry\n"),
        ("gateway/provenance", "from gateway.asgi import read_body, respond\n"),
    ],
)
def test_the_allowed_direction_passes(package: str, source: str) -> None:
    assert banned(package, source) == ""
