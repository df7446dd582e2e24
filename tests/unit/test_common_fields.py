"""The usual OpenAI request fields (`COMMON_FIELDS`), which the control-field and
server-field checks pass with one look-up each (the hot path), are fields neither check
refuses: what the look-up passes, the full checks pass too."""

from __future__ import annotations

import pytest

from gateway.api import control_fields
from gateway.api.server_fields import COMMON_FIELDS, SERVER_FIELDS, SERVER_SUFFIXES


@pytest.mark.parametrize("name", sorted(COMMON_FIELDS))
def test_a_usual_field_is_no_control_or_server_field(name: str) -> None:
    assert name.isascii() and name.islower()  # its own case fold
    assert not control_fields._is_control(name)
    assert name not in SERVER_FIELDS and not name.endswith(SERVER_SUFFIXES)
