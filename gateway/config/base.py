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
    model_config = ConfigDict(extra="forbid", frozen=True)
