"""A number gateway.yaml accepts is one the gateway can start with.

`provenance.export_stall_after_s: 1e306` validated (`owngate config validate` said fine)
and then killed `owngate serve` in its lifespan: taken x1000 it is inf, which the log's
`LogSettings` refuses. `.inf` in any timing did the same. Every float setting now refuses
a number that is not finite, and the log's timings have upper bounds under which their
`LogSettings` builds.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from gateway.api.recorder_log import log_settings
from gateway.cli.main import main
from gateway.config.base import MAX_FLOAT
from gateway.config.schema import GatewaySettings, ProvenanceSettings, StateSettings
from gateway.state.redis_state import RedisState

BASE = {"dir": "log", "origin": "gateway.test/log", "signing_key_file": "k"}
TIMINGS = {  # each at the largest value it validates with
    "group_commit_ms": 60_000,
    "checkpoint_interval_ms": 86_400_000,
    "export_stall_after_s": 86_400,
    "witness_retry_max_s": 86_400,
}


@pytest.mark.parametrize(("name", "largest"), sorted(TIMINGS.items()))
def test_a_log_timing_that_validates_is_one_the_log_opens_with(name: str, largest: int) -> None:
    assert log_settings(ProvenanceSettings.model_validate({**BASE, name: largest})) is not None
    for past in (largest * 1.001, 1e306, float("inf"), float("nan")):
        with pytest.raises(ValidationError):
            ProvenanceSettings.model_validate({**BASE, name: past})


def test_config_validate_refuses_an_export_stall_limit_the_log_cannot_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "provenance:\n  dir: log\n  origin: gateway.test/log\n  signing_key_file: k\n"
        "  export_stall_after_s: 1e306\n"
    )
    assert main(["config", "validate", str(config), "--without-secrets"]) == 1
    assert "export_stall_after_s" in capsys.readouterr().err


def _float_settings(model: type[BaseModel], path: str = "") -> list[tuple[type[BaseModel], str]]:
    """Every float field of `model` and of the models under it, with its path."""
    found = []
    for name, field in model.model_fields.items():
        for kind in typing.get_args(field.annotation) or (field.annotation,):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += _float_settings(kind, f"{path}{name}.")
            elif kind is float:
                found.append((model, f"{path}{name}"))
    return found


FLOATS = _float_settings(GatewaySettings)


def test_the_table_holds_the_settings_it_should() -> None:
    names = {path for _, path in FLOATS}
    assert "provenance.export_stall_after_s" in names and "listen.header_timeout_s" in names


@pytest.mark.parametrize(("model", "path"), FLOATS, ids=[path for _, path in FLOATS])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_no_float_setting_takes_a_number_that_is_not_finite(
    model: type[BaseModel], path: str, value: str
) -> None:
    name = path.rpartition(".")[2]
    with pytest.raises(ValidationError) as refused:
        model.model_validate({name: float(value)})
    assert any(error["loc"] == (name,) for error in refused.value.errors()), refused.value


@pytest.mark.parametrize(("model", "path"), FLOATS, ids=[path for _, path in FLOATS])
def test_no_float_setting_takes_a_number_past_a_billion(model: type[BaseModel], path: str) -> None:
    """`state.lease_ttl_s: 1e306` validated, then `round(lease_ttl_s * 1000)` raised
    OverflowError when serve started (found by review): every float setting, not only
    the log's timings, refuses a number past MAX_FLOAT."""
    name = path.rpartition(".")[2]
    with pytest.raises(ValidationError) as refused:
        model.model_validate({name: 1e306})
    assert any(error["loc"] == (name,) for error in refused.value.errors()), refused.value


def test_a_lease_the_state_settings_take_is_one_redis_state_starts_with() -> None:
    settings = StateSettings(backend="redis", url="redis://127.0.0.1:1/0", lease_ttl_s=MAX_FLOAT)
    assert settings.url is not None
    RedisState(settings.url, lease_ttl_s=settings.lease_ttl_s)  # no OverflowError
