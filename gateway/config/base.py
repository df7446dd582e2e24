"""The strict base of every `gateway.yaml` model (frozen, unknown keys forbidden) and the
field shapes that several sections share: identifiers and key digests."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MAX_FLOAT", "_ID", "_KEY_HASH", "Identifier", "_Strict"]

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")

Identifier = Annotated[str, Field(pattern=_ID)]
# The largest float any setting may be (a billion seconds is 31 years).
MAX_FLOAT = 1e9


class _Strict(BaseModel):
    # No setting is a number that is not finite: `.inf` or `.nan` validated, then failed
    # where it was used (a log timing refused at startup, a timer that never fires).
    # "No limit" is null where a setting has it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_float(cls, value: object) -> object:
        # Nor a float past MAX_FLOAT: a duration or rate that large is a typo, and one
        # multiplied up (seconds to milliseconds) or rounded to an int overflowed where it
        # was used (`state.lease_ttl_s: 1e306` validated, then failed serve's startup).
        if type(value) is float and abs(value) > MAX_FLOAT:
            raise ValueError(f"must be at most {MAX_FLOAT:.0e} (written {value:.3g})")
        return value
