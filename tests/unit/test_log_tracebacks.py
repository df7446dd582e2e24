"""A traceback in a log says where an exception happened, never what its message said:
an exception's message may quote the request (a prompt, a header, a model name)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import ssl
from pathlib import Path
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


def test_an_os_error_keeps_what_the_os_said_and_withholds_its_file_names(
    tmp_path: Path,
) -> None:
    """A full disk, an I/O error and a read-only file system are told apart in a trace
    (they all read `OSError: [message withheld: N characters]` before); the file name,
    which may be made of the request's words, and the message's text are not shown."""
    with pytest.raises(FileNotFoundError) as failed:
        os.rmdir(tmp_path / CANARY)  # a real OS failure, as a disk's would be
    text = traceback_without_messages(failed.value)
    assert text.endswith(
        "FileNotFoundError: [Errno 2 ENOENT] No such file or directory [message withheld: "
        f"{len(str(failed.value))} characters]"
    )
    assert CANARY not in text
    for number, name in [(errno.ENOSPC, "ENOSPC"), (errno.EIO, "EIO"), (errno.EROFS, "EROFS")]:
        # The name and text come from the number: a strerror the raiser chose is withheld.
        text = traceback_without_messages(OSError(number, CANARY, CANARY))
        assert text == f"OSError: [Errno {number} {name}] {os.strerror(number)} " + (
            f"[message withheld: {len(str(OSError(number, CANARY, CANARY)))} characters]"
        )


def test_codes_that_are_not_the_os_errno_are_not_named_as_one() -> None:
    """Another module's OSError numbers something else (getaddrinfo's EAI codes, the
    number a library chose): not shown, rather than shown as the wrong errno."""
    for exc in [
        socket.gaierror(1, CANARY),  # EAI code 1 is not EPERM
        OSError(10**30, CANARY),
        OSError(True, CANARY),
        OSError(CANARY),
    ]:
        text = traceback_without_messages(exc)
        assert "Errno" not in text and "EPERM" not in text and CANARY not in text, text
    assert traceback_without_messages(OSError()) == "OSError"


def test_a_tls_failure_keeps_openssl_s_reason_code() -> None:
    """A real handshake failure (a peer answering something that is not TLS) keeps
    OpenSSL's library and reason codes; a reason that is not a code is withheld."""
    incoming = ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(
        incoming, ssl.MemoryBIO(), server_hostname="backend.test"
    )
    incoming.write(b"\x16\x03\x01\x00\x05" + CANARY.encode() * 4)
    with pytest.raises(ssl.SSLError) as failed:
        client.do_handshake()
    text = traceback_without_messages(failed.value)
    assert "ssl.SSLError: [SSL: UNEXPECTED_MESSAGE] [message withheld: " in text, text
    odd = ssl.SSLError(1, CANARY)
    odd.library, odd.reason = "SSL", f"{CANARY} <quoted>"  # not a code: not shown
    assert traceback_without_messages(odd).startswith("ssl.SSLError: [message withheld: ")


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
