"""`ensure_venv` builds the LiteLLM comparison's virtualenv from its lock alone, offline:
a stand-in `litellm` wheel made here and the venv's own pip and setuptools (the wheels
`python -m venv` bootstraps from), each pinned by its sha256 in a lock like the real one.
A file whose hash differs is refused; a venv the bench made that drifted from the lock is
rebuilt; a directory it did not make is left alone and refused."""

from __future__ import annotations

import hashlib
import importlib.resources
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from owngate_bench import litellm_proxy

pytestmark = [pytest.mark.bench, pytest.mark.slow]

VERSION = "9.9.9"  # no release of LiteLLM: what is installed can only be this wheel


def _wheel(wheels: Path, name: str, version: str) -> Path:
    path = wheels / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{file},,\n" for file in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in {**files, f"{info}/RECORD": record}.items():
            wheel.writestr(file, text)
    return path


def _pin(wheel: Path, marker: str = "") -> str:
    name, version = wheel.name.split("-")[:2]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return f"{name}=={version}{marker} \\\n    --hash=sha256:{digest}\n"


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Path]]:
    """A wheel directory pip reads instead of any index: the stand-in litellm and the
    wheels venv bootstraps pip from; returns it and those wheels."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundled = importlib.resources.files("ensurepip") / "_bundled"
    bootstrap = [Path(str(w)) for w in bundled.iterdir() if w.name.endswith(".whl")]
    assert bootstrap, "this Python's ensurepip bundles no wheels"
    for wheel in bootstrap:
        shutil.copy(wheel, wheels)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels, [wheels / w.name for w in bootstrap]


def _dist_info(directory: Path, name: str) -> Path:
    """An installed distribution `name` 1.0 as importlib.metadata finds one: its metadata."""
    info = directory / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return info


def _lock(path: Path, pins: list[str]) -> Path:
    path.write_text("# a lock as uv writes it\n" + "".join(pins) + "    # via nothing\n")
    return path


def test_the_venv_holds_exactly_the_lock_and_is_rebuilt_when_it_drifts(
    tmp_path: Path, offline: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels, bootstrap = offline
    pins = [_pin(_wheel(wheels, "litellm", VERSION)), *map(_pin, bootstrap)]
    nowhere = "colorama==0.4.6 ; sys_platform == 'nowhere' \\\n"  # a pin for no platform
    pins.append(nowhere + "    --hash=sha256:" + "0" * 64 + "\n")
    lock = _lock(tmp_path / "proxy.lock", pins)
    venv, said = tmp_path / "venv", list[str]()
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()

    assert litellm_proxy.ensure_venv(venv, VERSION, said.append, lock) == venv / "bin/litellm"
    assert litellm_proxy.installed_version(venv) == VERSION
    assert (venv / "owngate-bench-lock").read_text() == digest
    assert len(said) == 2 and said[0].startswith("creating")

    # it matches, and is reused as it is: what the bench's own PYTHONPATH holds is not in it
    elsewhere = tmp_path / "on-pythonpath"
    _dist_info(elsewhere, "elsewhere")
    monkeypatch.setenv("PYTHONPATH", str(elsewhere))
    said.clear()
    litellm_proxy.ensure_venv(venv, VERSION, said.append, lock)
    assert said == []

    # a distribution the lock does not name appears in the venv (installed by hand, say)
    (site,) = venv.glob("lib/python*/site-packages")
    stray = _dist_info(site, "stray")
    assert litellm_proxy.lock_mismatches(venv, litellm_proxy.read_lock(lock)) == [
        "stray 1.0 is not in the lock"
    ]
    litellm_proxy.ensure_venv(venv, VERSION, said.append, lock)
    assert (
        said[0] == f"{venv} does not match proxy.lock (stray 1.0 is not in the lock): rebuilding it"
    )
    assert not stray.exists()
    assert litellm_proxy.lock_mismatches(venv, litellm_proxy.read_lock(lock)) == []


def test_a_file_whose_hash_differs_is_refused_and_the_venv_rebuilt_next_time(
    tmp_path: Path, offline: tuple[Path, list[Path]]
) -> None:
    wheels, bootstrap = offline
    litellm = _wheel(wheels, "litellm", VERSION)
    good = _pin(litellm)
    bad = good[: good.index("sha256:") + 7] + "0" * 64 + "\n"
    lock = _lock(tmp_path / "proxy.lock", [bad, *map(_pin, bootstrap)])
    venv = tmp_path / "venv"

    with pytest.raises(RuntimeError, match="pip install --require-hashes failed") as caught:
        litellm_proxy.ensure_venv(venv, VERSION, lambda _: None, lock)
    assert "HASHES" in str(caught.value).upper()
    assert litellm_proxy.installed_version(venv) is None
    assert (venv / "owngate-bench-lock").read_text() == ""  # made here, never checked

    _lock(lock, [good, *map(_pin, bootstrap)])
    said: list[str] = []
    litellm_proxy.ensure_venv(venv, VERSION, said.append, lock)
    assert said[0] == (
        f"{venv} does not match proxy.lock (not installed and checked from this lock): "
        "rebuilding it"
    )
    assert litellm_proxy.installed_version(venv) == VERSION


def test_a_directory_the_bench_did_not_make_is_refused_untouched(
    tmp_path: Path, offline: tuple[Path, list[Path]]
) -> None:
    wheels, _ = offline
    lock = _lock(tmp_path / "proxy.lock", [_pin(_wheel(wheels, "litellm", VERSION))])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    before = sorted(venv.rglob("*"))

    with pytest.raises(RuntimeError, match="not a virtualenv the bench installed"):
        litellm_proxy.ensure_venv(venv, VERSION, lambda _: None, lock)
    assert sorted(venv.rglob("*")) == before
