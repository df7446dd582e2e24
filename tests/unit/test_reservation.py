"""What a request reserves of its tenant's tokens budget (gateway/api/reservation.py), as
a table: the prompt estimate, the client's limit times the choices, the default without
a limit, embeddings, and the refusal of a limit past the whole budget."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.reservation import default_per_answer, tokens_to_reserve
from gateway.api.usage_bound import COMPLETION_ALLOWANCE
from gateway.config import ConfigError, parse_config
from gateway.errors import GatewayError

MESSAGES = [{"role": "user", "content": "hi"}]
BODY = 100  # bytes: a prompt estimate of 25 tokens

# name: (request, per_minute, per_answer, tokens reserved)
CASES: dict[str, tuple[dict[str, Any], int, int | None, int]] = {
    "max_tokens": ({"max_tokens": 400}, 1000, None, 25 + 400),
    "max_completion_tokens": ({"max_completion_tokens": 300}, 1000, None, 25 + 300),
    "the larger of both": ({"max_tokens": 10, "max_completion_tokens": 300}, 1000, None, 325),
    "n choices each": ({"max_tokens": 100, "n": 3}, 1000, None, 25 + 300),
    "n as a string": ({"max_tokens": 100, "n": "3"}, 1000, None, 25 + 300),
    "a batch of prompts": ({"max_tokens": 100, "prompt": ["a", "b"]}, 1000, None, 225),
    "min_tokens past the limit": ({"max_tokens": 10, "min_tokens": 90}, 1000, None, 115),
    "no limit: an eighth of the budget": ({}, 1000, None, 25 + 125),
    "no limit: the tenant's setting": ({}, 1000, 50, 25 + 50),
    "no limit, n 2": ({"n": 2}, 1000, 50, 25 + 100),
    # llama.cpp reads n_predict -1 as no limit whatever max_tokens says
    "a limit some backend ignores": ({"max_tokens": 5, "n_predict": -1}, 1000, 50, 75),
    "a limit that is no whole number": ({"max_tokens": "5"}, 1000, 50, 75),
    "max_tokens 0": ({"max_tokens": 0}, 1000, None, 25),
    # cut to the whole budget by the caller: never refused, waits for a full budget
    "a long prompt without a limit": ({}, 10, None, 25 + 2),
    "many choices without a limit": ({"n": 100}, 1000, None, 25 + 100 * 125),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tokens_reserved(name: str) -> None:
    fields, per_minute, per_answer, expected = CASES[name]
    ask = {"model": "m", "messages": MESSAGES, **fields}
    reserved = tokens_to_reserve(ask, BODY, per_minute=per_minute, per_answer=per_answer)
    assert reserved == expected


def test_embeddings_reserve_their_prompt_alone() -> None:
    ask = {"model": "m", "input": "hi", "max_tokens": 10**9}
    assert tokens_to_reserve(ask, BODY, per_minute=1000, per_answer=None, embeddings=True) == 25


@pytest.mark.parametrize(
    ("fields", "requested"),
    [({"max_tokens": 1001}, 1001), ({"max_tokens": 400, "n": 3}, 1200)],
)
def test_a_limit_past_the_whole_budget_is_refused(fields: dict[str, Any], requested: int) -> None:
    with pytest.raises(GatewayError) as caught:
        tokens_to_reserve({"model": "m", **fields}, BODY, per_minute=1000, per_answer=None)
    error = caught.value
    assert (error.status, error.code.value, error.error_type) == (
        429,
        "rate_limit_exceeded",
        "tokens",
    )
    assert f"Limit 1000, Requested {requested}" in error.message
    assert error.headers == ()  # no retry-after: waiting never makes it fit


@pytest.mark.parametrize(
    ("per_minute", "default"),
    [(1, 1), (8, 1), (1000, 125), (1001, 126), (10**8, COMPLETION_ALLOWANCE)],
)
def test_the_default_per_answer(per_minute: int, default: int) -> None:
    assert default_per_answer(per_minute) == default


TENANT = """
backends:
  - {id: gpu, kind: vllm, base_url: "http://127.0.0.1:9", region: eu-west-1, owner: t,
     models: [{name: m}]}
tenants:
  - id: acme
    limits: %s
"""


@pytest.mark.parametrize(
    "limits",
    ["{reserved_tokens_per_answer: 10}", "{tokens_per_minute: 10, reserved_tokens_per_answer: 11}"],
)
def test_the_setting_needs_a_budget_that_holds_it(limits: str) -> None:
    with pytest.raises(ConfigError, match="reserved_tokens_per_answer"):
        parse_config(TENANT % limits)


def test_the_setting_is_read() -> None:
    config = parse_config(TENANT % "{tokens_per_minute: 10, reserved_tokens_per_answer: 10}")
    assert config.tenants[0].limits.reserved_tokens_per_answer == 10
