"""LiteLLM is pinned to a vetted release and stays off the private-backend path; the
runtime wheel ships neither benchmarks nor code that installs packages, and does ship the
web console's assets."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from gateway.admin.console_routes import ASSETS
from tests.helpers.paths import REPO_ROOT

COMPROMISED = {"1.82.7", "1.82.8"}
# Code that makes a virtualenv or installs packages: pip, venv, ensurepip or uv named as a
# command word or imported (a message that tells a person to run pip is not code).
INSTALLS = re.compile(
    r"""["'](?:pip3?|venv|virtualenv|ensurepip|uv)["']"""
    r"|\b(?:import|from)\s+(?:pip|venv|virtualenv|ensurepip)\b|EnvBuilder"
)


def test_litellm_is_a_vetted_release_without_startup_hooks() -> None:
    dist = metadata.distribution("litellm")
    assert dist.version not in COMPROMISED
    # The 2026 compromise shipped a .pth file that runs code at every interpreter start.
    files = [str(f) for f in dist.files or []]
    assert files, "litellm's RECORD is missing: cannot vet what it installed"
    assert not [f for f in files if f.endswith(".pth")]


def test_the_locks_pin_the_vetted_litellm_by_hash_and_the_range_leaves_out_the_compromised() -> (
    None
):
    """What `make` and the image install, not only this venv: both locks pin LiteLLM, with
    hashes, to the version constraints.txt vetted, and pyproject's range (what a re-lock
    resolves within) admits neither compromised release."""
    constraints = (REPO_ROOT / "requirements" / "constraints.txt").read_text(encoding="utf-8")
    vetted = re.search(r"^litellm==(\S+)$", constraints, re.M)
    assert vetted is not None and vetted.group(1) not in COMPROMISED
    for lock in ("runtime.lock", "dev.lock"):
        text = (REPO_ROOT / "requirements" / lock).read_text(encoding="utf-8")
        entry = re.search(
            r"^litellm==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n)+)", text, re.M
        )
        assert entry is not None, f"{lock}: no hashed litellm entry"
        assert entry.group(1) == vetted.group(1), lock
    with (REPO_ROOT / "pyproject.toml").open("rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    (litellm,) = [Requirement(d) for d in dependencies if Requirement(d).name == "litellm"]
    assert not [v for v in COMPROMISED if litellm.specifier.contains(v, prereleases=True)]


def test_private_path_never_imports_litellm() -> None:
    script = """
import sys
import httpx
from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.tenants import hash_api_key
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app

sim_settings = SimSettings.for_kind("vllm", models=("m",), zero_latency=True)
with ServerThread(create_sim_app(sim_settings)) as sim:
    private = {"id": "b", "kind": "vllm", "base_url": sim.url, "models": [{"name": "m"}],
               "region": "eu", "owner": "o"}
    hosted = {"id": "h", "kind": "hosted", "provider": "openai", "region": "us",
              "owner": "openai", "models": [{"name": "g", "provider_model": "openai/g"}]}
    tenant = {"id": "t", "api_key_hashes": [hash_api_key("og-k")], "models": ["*"]}
    config = GatewaySettings.model_validate({"backends": [private, hosted], "tenants": [tenant]})
    with ServerThread(create_app(config, environ={})) as gw:
        for stream in (False, True):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "stream": stream}
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10,
                           headers={"authorization": "Bearer og-k"})
            assert r.status_code == 200, r.text
print("litellm" in sys.modules, any(m.startswith("litellm") for m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False False"


def test_the_runtime_wheel_ships_no_benchmarks_and_installs_nothing(tmp_path: Path) -> None:
    """The wheel built from this tree (as `pip wheel --no-build-isolation` builds it) holds
    the `gateway` package alone: the benchmarks are the owngate-bench distribution in
    bench/, only the CLI's lazy `owngate bench` lookup names it, and no module creates a
    virtualenv or runs pip (the LiteLLM comparison's installer lives with the benchmarks)."""
    source = tmp_path / "source"
    # Untracked trees other tests write to (a parallel worker may be adding and removing
    # files in them while this copies): the llama.cpp install (setup.sh's .tmp-* folders,
    # ~400 MB), hypothesis's example database, the browser tests' screenshots.
    skip = (".git", ".venv", ".bench", "build", "dist", "*.egg-info", "__pycache__", ".*cache")
    untracked = (".real-backend", ".hypothesis", "test-artifacts")
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(*skip, *untracked))
    out = tmp_path / "wheel"
    build = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(out / done.stdout.splitlines()[-1]) as wheel:
        names = wheel.namelist()
        sources = {name: wheel.read(name).decode() for name in names if name.endswith(".py")}

    assert {name.split("/")[0] for name in names} == {"gateway", "owngate-0.1.0.dist-info"}
    assert "gateway/cli/main.py" in sources  # the build did put the package in
    console = {f"gateway/admin/console/{name}" for name in ASSETS}
    assert console <= set(names), console - set(names)  # the web console ships in the wheel
    benchmarks = [n for n in names if "bench" in n.rsplit("/", 1)[-1] or "/bench/" in n]
    assert benchmarks == ["gateway/cli/bench.py"]  # the front end that says how to install
    naming_bench = sorted(name for name, text in sources.items() if "owngate_bench" in text)
    assert naming_bench == ["gateway/cli/bench.py"]
    installers = {name: INSTALLS.findall(text) for name, text in sources.items()}
    assert {name: found for name, found in installers.items() if found} == {}
