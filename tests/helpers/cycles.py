"""Finding reference cycles that hold a request's body: with the collector switched off
while a test runs (the `collector_off` fixture, tests/conftest.py), one collection that
saves what it finds unreachable (`gc.DEBUG_SAVEALL`), named where it holds a text
carrying the test's marker (`holders`)."""

from __future__ import annotations

import gc

__all__ = ["holders"]


def holders(mark: str, longer_than: int = 0) -> list[str]:
    """What a collection finds unreachable that holds a str, bytes or bytearray longer
    than `longer_than` with `mark` in it: a frame by its function's name, else its type."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(0)
    found = []
    for garbage in gc.garbage:
        for held in gc.get_referents(garbage):
            text = held if isinstance(held, str) else None
            if isinstance(held, bytes | bytearray) and len(held) > longer_than:
                text = bytes(held).decode("latin-1")
            if text is not None and len(text) > longer_than and mark in text:
                code = getattr(garbage, "f_code", None)
                found.append(
                    f"frame {code.co_name}" if code is not None else type(garbage).__name__
                )
                break
    gc.garbage.clear()
    gc.collect()  # what it saved, freed
    return found
