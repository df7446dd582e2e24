"""The files README.md and docs/*.md point to exist: every `gateway/...py` module and every
`tests/...py` test file, and a test named after `::` (or the start of its name, as the
docs abbreviate some) is defined in that file."""

from __future__ import annotations

import re

from tests.helpers.doc_commands import doc_files
from tests.helpers.paths import REPO_ROOT

_TEST = re.compile(r"(?<![\w/.])(tests/[\w/]+\.py)(?:::(\w+))?")
_MODULE = re.compile(r"(?<![\w/.])(gateway/[\w/]+\.py)")


def test_every_module_and_test_the_docs_name_exists() -> None:
    gone: set[str] = set()
    for path in doc_files():
        text = path.read_text()
        source = path.relative_to(REPO_ROOT).as_posix()
        for module in _MODULE.findall(text):
            if not (REPO_ROOT / module).is_file():
                gone.add(f"{source}: {module}")
        for match in _TEST.finditer(text):
            file, name = REPO_ROOT / match.group(1), match.group(2)
            if not file.is_file():
                gone.add(f"{source}: {match.group(1)}")
            elif name and not re.search(rf"^\s*(?:async )?def {name}", file.read_text(), re.M):
                gone.add(f"{source}: {match.group(0)}")
    assert not gone, "\n".join(sorted(gone))
