"""`n` > 1 through a gateway whose backends are simulators, as `owngate demo` runs them: the
hosted provider (`openai/gpt-4o-mini` on a timed vLLM-kind simulator, seed 3) answers a
whole chat or text completion of two choices with 200 and both, and the signed log says
what the client received; a private simulator streams both choices.

Before: the simulator answered one choice whatever `n` asked, so the gateway's check of a
hosted answer (gateway/upstream/hosted_finish.py `short_of`) turned each such request
into a 502 "the provider's answer held 1 choice(s) where 2 were asked", charged to the
provider's breaker: three of them and the tenant's next plain request found it open.
A hosted stream of several choices is refused unsent by the gateway itself
(tests/integration/test_hosted_stream_choices.py), whoever the provider.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.audit_rig import assert_logged_as_received, client_gets, logged
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
)

pytestmark = LITELLM_WARNINGS

MODEL = "gpt-4o-mini"
HI = [{"role": "user", "content": "hi"}]


def _choices(body: bytes) -> list[dict[str, Any]]:
    choices: list[dict[str, Any]] = json.loads(body)["choices"]
    return choices


def test_the_demos_hosted_simulator_answers_two_choices(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=(MODEL,), seed=3)  # `owngate demo`'s hosted provider
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [hosted_backend("hosted", f"{sim.url}/v1", MODEL)],
        environ={"HOSTED_KEY": "sk-test"},
        policy={"paths": [str(tmp_path / "policies")]},
    )
    chat = {"model": MODEL, "messages": HI, "max_tokens": 4, "n": 2}
    text = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "n": 2}
    for _ in range(3):  # as many as opened the provider's breaker before
        received = client_gets(gateway, chat)
        assert received.status == 200, received.body
        choices = _choices(received.body)
        assert [c["index"] for c in choices] == [0, 1]
        assert all(c["message"]["content"] and c["finish_reason"] for c in choices)
        assert json.loads(received.body)["usage"]["completion_tokens"] == 2 * 4
        assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    received = client_gets(gateway, text, "/v1/completions")
    assert received.status == 200, received.body
    assert [(c["index"], bool(c["text"])) for c in _choices(received.body)] == [
        (0, True),
        (1, True),
    ]
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
    # Streamed, `n` > 1 is the gateway's refusal for any hosted provider, before sending.
    sent = len(sim.app.captured("/v1/chat/completions"))
    received = client_gets(gateway, {**chat, "stream": True})
    assert received.status == 400, received.body
    assert json.loads(received.body)["error"]["param"] == "n"
    assert len(sim.app.captured("/v1/chat/completions")) == sent
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)


def test_a_private_simulator_streams_two_choices_through_the_gateway(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    sim = start_sim("vllm", models=("m",), seed=1)
    gateway, vkey = logged(start_gateway, tmp_path, [backend("gpu", sim.url, "m")])
    ask = {"model": "m", "messages": HI, "max_tokens": 4, "n": 2, "stream": True}
    received = client_gets(gateway, {**ask, "stream_options": {"include_usage": True}})
    assert received.status == 200, received.body
    events = [
        json.loads(e.removeprefix(b"data: "))
        for e in received.body.split(b"\n\n")
        if e.startswith(b"data: {")
    ]
    finished = [
        c["index"] for e in events for c in e["choices"] if c.get("finish_reason") is not None
    ]
    assert sorted(finished) == [0, 1]
    assert events[-1]["usage"]["completion_tokens"] == 2 * 4
    assert b"data: [DONE]\n\n" in received.body  # the receipt follows it
    assert_logged_as_received(received, gateway, tmp_path / "log", vkey)
