"""A traceback in a log says where an exception happened, never what its message said:
an exception's message may quote the request (a prompt, a header, a model name)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Literal

import pytest

from gateway.log_tracebacks import MAX_EXCEPTIONS, traceback_without_messages
from gateway.logs import get_logger
from tests.helpers.log_capture import rendered_logs

CANARY = "CANARY-7f3a"
SAID = CANARY + '\x1b[31m\n{"json":"injection"}\u202e' + "x" * 100_000


def _lookup(prompt: str) -> int:
    return {"known": 1}[prompt]


def _failed() -> BaseException:
    """A KeyError quoting the prompt, raised while handling a ValueError quoting it, then
    wrapped in a RuntimeError quoting it, with a note quoting it."""
    try:
        try:
            raise ValueError(f"invalid literal for int() with base 10: {SAID!r}")
        except ValueError:
            _lookup(SAID)
    except KeyError as exc:
        wrapped = RuntimeError(f"the request {SAID} failed")
        wrapped.add_note(f"while serving {SAID}")
        try:
            raise wrapped from exc
        except RuntimeError as raised:
            return raised
    raise AssertionError("not raised")


def test_a_traceback_keeps_the_stack_and_withholds_every_message() -> None:
    text = traceback_without_messages(_failed())
    assert CANARY not in text and "injection" not in text
    # where it happened: every frame, the source line, each exception's class, in order
    assert "in _lookup" in text and 'return {"known": 1}[prompt]' in text
    assert text.index("ValueError: [message withheld: ") < text.index("KeyError: [message")
    assert "During handling of the above exception" in text
    assert "The above exception was the direct cause" in text
    assert text.endswith(
        f"RuntimeError: [message withheld: {len(f'the request {SAID} failed')} characters]"
        " [1 notes withheld]"
    )


def test_groups_cycles_and_unprintable_messages_are_bounded() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError(CANARY)

    members = [KeyError(f"{CANARY}-{n}") for n in range(3 * MAX_EXCEPTIONS)]
    group = ExceptionGroup(CANARY, [Unprintable(), *members])
    looped = ValueError(CANARY)
    looped.__context__ = KeyError(CANARY)
    looped.__context__.__context__ = looped  # a cycle
    for exc in (group, looped):
        text = traceback_without_messages(exc)
        assert CANARY not in text
    text = traceback_without_messages(group)
    assert "Unprintable: [message unprintable]" in text
    assert text.count("KeyError: [message withheld:") == MAX_EXCEPTIONS - 2
    assert "more exceptions of the group]" in text
    assert traceback_without_messages(KeyError()) == "KeyError"  # no message, none said


async def _crash(prompt: str) -> None:
    _lookup(prompt)


def _never_retrieved() -> None:
    """What asyncio logs for a task whose exception nobody retrieved: its message names the
    task, whose repr holds the exception's (`exception=KeyError('<the prompt>')`)."""

    async def main() -> None:
        task = asyncio.create_task(_crash(SAID))
        await asyncio.wait([task])
        loop = asyncio.get_running_loop()
        context = {"message": "Task exception was never retrieved", "future": task}
        loop.call_exception_handler({**context, "exception": task.exception()})

    asyncio.run(main())


def _logged(fmt: Literal["json", "console"]) -> str:
    with rendered_logs(fmt) as stream:
        exc = _failed()
        get_logger("t").error("crashed", exc_info=exc)
        logging.getLogger("uvicorn.error").error("Exception in ASGI application", exc_info=exc)
        _never_retrieved()
    return stream.getvalue()


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_no_exception_message_reaches_a_log_line(fmt: Literal["json", "console"]) -> None:
    out = _logged(fmt)
    assert CANARY not in out and "injection" not in out
    assert out.count("KeyError: [message withheld: ") == 3  # structlog's, the stdlib's, asyncio's
    assert out.count("in _lookup") == 3
    assert "exception=[KeyError: message withheld]>" in out  # the task named, not what it said
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["event"].partition("\\n")[0] for line in lines] == [
            "crashed",
            "Exception in ASGI application",
            "Task exception was never retrieved",
        ]
        assert all("KeyError: [message withheld:" in line["exception"] for line in lines)
