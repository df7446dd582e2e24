"""A missing prerequisite fails the test that needs it, naming its marker
(tests/helpers/prerequisites.py): never a skip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import prerequisites


def test_a_missing_browser_fails_naming_the_browser_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # nothing on PATH either
    with pytest.raises(pytest.fail.Exception, match=r"chromium is not installed.*`browser`"):
        prerequisites.browser(tmp_path)
    (tmp_path / "chromium").touch()
    with pytest.raises(pytest.fail.Exception, match=r"chromedriver is not installed.*`browser`"):
        prerequisites.browser(tmp_path)
    (tmp_path / "chromedriver").touch()
    assert prerequisites.browser(tmp_path) == (
        str(tmp_path / "chromium"),
        str(tmp_path / "chromedriver"),
    )
