"""The LiteLLM comparison's virtualenv installs from a lock with hashes: the lock pins the
vetted LiteLLM (never a compromised release) and hashes every distribution, and the
installer names the lock with --require-hashes (bench/owngate_bench/litellm_proxy.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from owngate_bench import litellm_proxy
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.bench

COMPROMISED = {"1.82.7", "1.82.8"}
BENCH = REPO_ROOT / "bench" / "owngate_bench"
# A pin at the margin, then its hashes, then uv's `# via` comments.
ENTRY = re.compile(
    r"^(\S+)==(\S+)(?: ;[^\\\n]*)? \\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n)+)", re.M
)


def test_the_install_command_installs_the_lock_by_hash_and_nothing_else() -> None:
    python = Path("/venv/bin/python")
    command = litellm_proxy.install_command(python)
    assert command[:5] == [str(python), "-I", "-m", "pip", "install"]
    assert {"--require-hashes", "--no-deps", "--no-input"} <= set(command)
    assert command[command.index("--only-binary") + 1] == ":all:"  # no unhashed build deps
    assert command[command.index("-r") + 1] == str(litellm_proxy.LOCK)
    assert litellm_proxy.LOCK == BENCH / "litellm-proxy.lock"
    # the lock's path is the only requirement: no `litellm[proxy]==...` resolved beside it
    assert not [word for word in command if "litellm" in word and word != str(litellm_proxy.LOCK)]


def test_the_lock_pins_the_vetted_litellm_and_hashes_every_distribution() -> None:
    text = litellm_proxy.LOCK.read_text(encoding="utf-8")
    constraints = (REPO_ROOT / "requirements" / "constraints.txt").read_text(encoding="utf-8")
    vetted = re.search(r"^litellm==(\S+)$", constraints, re.M)
    assert vetted is not None and vetted.group(1) == litellm_proxy.DEFAULT_VERSION
    pins = litellm_proxy.read_lock()
    hashed = ENTRY.findall(text)
    assert len(hashed) == len(pins) > 50  # every pin has sha256 hashes (litellm[proxy] is big)
    assert [(name, version) for name, version, _ in hashed] == [
        (pin.name, pin.version) for pin in pins
    ]
    (litellm,) = [pin for pin in pins if pin.name == "litellm"]
    assert (litellm.version, litellm.marker) == (litellm_proxy.DEFAULT_VERSION, None)
    assert not [v for v in COMPROMISED if re.search(rf"=={re.escape(v)}\b", text)]
    # the venv's installers are locked too, so every distribution in it is one the lock names
    assert {"pip", "setuptools", "litellm-proxy-extras"} <= {pin.name for pin in pins}


def test_the_lock_says_how_to_regenerate_it_and_make_lock_does_so() -> None:
    header = litellm_proxy.LOCK.read_text(encoding="utf-8").splitlines()[1]
    command = header.removeprefix("#    ")
    assert command.startswith("cd bench/owngate_bench && uv pip compile litellm-proxy.in ")
    assert "--generate-hashes" in command and "-c ../../requirements/constraints.txt" in command
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n\t", "")
    assert command.split("&& ", 1)[1] in makefile
    assert (BENCH / "litellm-proxy.in").read_text(encoding="utf-8").count("litellm[proxy]") == 1


def test_the_lock_ships_with_the_bench_distribution() -> None:
    with (REPO_ROOT / "bench" / "pyproject.toml").open("rb") as file:
        package_data = tomllib.load(file)["tool"]["setuptools"]["package-data"]
    assert "litellm-proxy.lock" in package_data["owngate_bench"]


def test_a_lock_line_that_is_not_a_pin_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("--extra-index-url https://example.invalid/simple\nlitellm==1 \\\n")
    with pytest.raises(ValueError, match="not a pinned requirement"):
        litellm_proxy.read_lock(lock)


def test_a_version_the_lock_does_not_pin_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    locked = re.escape(litellm_proxy.DEFAULT_VERSION)
    with pytest.raises(RuntimeError, match=rf"pins litellm {locked}, not 1\.82\.8"):
        litellm_proxy.ensure_venv(venv, "1.82.8", log=lambda _: None)
    assert not venv.exists()
