"""LiteLLM imports modules inside every call (`wrapper_async`); one of them has pydantic warn
as it loads. `load_litellm` imports them first, under a filter for that warning alone, so
a hosted call never imports on the event loop, and never fails where warnings are errors:
the test suite's setting (pyproject `filterwarnings = ["error"]`), under which the first
hosted call of a process after pytest dropped that filter failed as `untranslated`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PROGRAM = textwrap.dedent(
    """
    import asyncio, sys, warnings
    from gateway.upstream.litellm_runtime import load_litellm

    litellm = load_litellm()
    warnings.simplefilter("error")  # after the load: what a later call meets

    async def call():
        answer = await litellm.acompletion(
            model="openai/m", messages=[{"role": "user", "content": "hi"}],
            api_key="sk-test", mock_response="fine",
        )
        return answer.choices[0].message.content

    print(asyncio.run(call()))
    """
)


def test_a_hosted_call_after_the_load_raises_no_warning_of_litellms_own_imports() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "fine"
