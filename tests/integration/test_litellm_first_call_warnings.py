"""Pydantic warns as LiteLLM builds schemas of its TypedDicts with `ReadOnly` items, lazily,
inside hosted calls (a remark on LiteLLM's code, which an installed gateway never shows).
The suite turns warnings into errors (pyproject `filterwarnings`, put back by pytest around
every test): unless that remark is let pass there, a hosted call fails as `untranslated` in
whichever test first builds such a schema. test_labels_gateway.py did, in file order."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_PROGRAM = textwrap.dedent(
    """
    import asyncio, sys, tomllib, warnings
    from _pytest.config import parse_warning_filter
    from gateway.upstream.litellm_runtime import load_litellm

    litellm = load_litellm()
    warnings.resetwarnings()  # the filters pytest applies around each test
    with open(sys.argv[1], "rb") as file:
        entries = tomllib.load(file)["tool"]["pytest"]["ini_options"]["filterwarnings"]
    for entry in entries:
        warnings.filterwarnings(*parse_warning_filter(entry, escape=False))

    async def call():
        answer = await litellm.acompletion(
            model="openai/m", messages=[{"role": "user", "content": "hi"}],
            api_key="sk-test", mock_response="fine",
        )
        return answer.choices[0].message.content

    print(asyncio.run(call()))
    """
)
_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_a_hosted_call_under_the_suites_warning_filters_is_answered() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(_PYPROJECT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "fine"
