"""Names that trust rules match by their letters: printable ASCII, nothing that only looks so.

Policies match models, providers, backends and regions by name (globs), and gateway.yaml
states the facts they are matched against. A name with a look-alike letter
(`gpt-4o` written with a Cyrillic o, `us-east` with U+2010 HYPHEN), an invisible character
or spaces at its ends loads fine and matches nothing: a `deny` entry written so protects
nothing, and a fact written so escapes every `deny`. Such names are refused where they
are loaded (gateway/policy/schema.py, gateway/config/backends.py), naming the character.
"""

from __future__ import annotations

import unicodedata

__all__ = ["plain_name_problem"]


def plain_name_problem(value: str) -> str | None:
    """Why `value` is not a plain name (printable ASCII, no spaces at its ends), or None."""
    if value != value.strip():
        return f"{value!r} has spaces at its ends"
    for index, char in enumerate(value):
        if not (char.isascii() and char.isprintable()):
            name = unicodedata.name(char, "unnamed")
            kind = "a look-alike of an ASCII letter?" if char.isprintable() else "invisible"
            return (
                f"{value!r} has U+{ord(char):04X} {name} at position {index} ({kind}); "
                "names that policies match must be printable ASCII"
            )
    return None
