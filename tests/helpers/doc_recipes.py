"""docs/provenance.md's independent verification recipes (the receipt recipe and the
countersignature recipe), run as written: the code blocks after their HTML markers,
executed in one namespace. An independent verifier holding only public keys."""

from __future__ import annotations

import re
from typing import Any

from tests.helpers.paths import REPO_ROOT

__all__ = ["provenance_recipes"]


def provenance_recipes() -> dict[str, Any]:
    """The receipt recipe and the countersignature recipe, in one namespace
    (`verify_receipt`, `verify_countersignature`, ...)."""
    text = (REPO_ROOT / "docs" / "provenance.md").read_text()
    namespace: dict[str, Any] = {}
    for name in ("receipt-recipe", "countersignature-recipe"):
        found = re.search(rf"<!-- {name} -->\n```python\n(.*?)```", text, re.DOTALL)
        assert found, f"docs/provenance.md has no {name}"
        exec(compile(found.group(1), f"docs/provenance.md:{name}", "exec"), namespace)
    return namespace
