"""The strict base of every `gateway.yaml` model (frozen, unknown keys forbidden) and the
field shapes that several sections share: identifiers and key digests."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["_ID", "_KEY_HASH", "Identifier", "_Strict"]

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")

Identifier = Annotated[str, Field(pattern=_ID)]


class _Strict(BaseModel):
    # No setting is a number that is not finite: `.inf` or `.nan` validated, then failed
    # where it was used (a log timing refused at startup, a timer that never fires).
    # "No limit" is null where a setting has it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
