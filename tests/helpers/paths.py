"""Where the tests find the repository and the test vectors, wherever a test module lives."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VECTORS = REPO_ROOT / "tests" / "vectors"  # data from independent implementations (README)
