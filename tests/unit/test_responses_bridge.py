"""What the gateway makes of the Responses request LiteLLM's bridge builds
(gateway/upstream/responses_bridge.py), checked without LiteLLM: stored nothing, no
provider-side state; a LiteLLM without the bridge step is refused, not served.
The wire itself: tests/integration/test_hosted_responses_bridge.py."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.responses_bridge import (
    DROPPED_FIELDS,
    BridgeNotFound,
    install_unstored_bridge,
    unstored,
)

INPUT = [{"type": "message", "role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "request_data",
    [
        {"model": "openai/o3-pro", "input": INPUT},  # what the bridge builds: no `store`
        {"model": "openai/o3-pro", "input": INPUT, "store": True},
        {"model": "openai/o3-pro", "input": INPUT, "store": None},
        {
            "model": "azure/o3-pro",
            "input": INPUT,
            "background": True,
            "previous_response_id": "resp_earlier",
            "conversation": {"id": "conv_earlier"},
        },
    ],
)
def test_a_bridged_request_stores_nothing_and_keeps_no_state(request_data: dict[str, Any]) -> None:
    result = unstored(dict(request_data))
    assert result["store"] is False
    assert not set(DROPPED_FIELDS) & result.keys()
    kept = {k: v for k, v in request_data.items() if k not in {"store", *DROPPED_FIELDS}}
    assert {k: v for k, v in result.items() if k != "store"} == kept


@pytest.mark.parametrize(
    "bridge",
    [
        ("gateway.upstream.no_such_module", "Handler", "transform_request"),
        ("gateway.upstream.responses_bridge", "NoSuchHandler", "transform_request"),
        ("gateway.upstream.responses_bridge", "BridgeNotFound", "no_such_method"),
    ],
)
def test_a_litellm_without_the_bridge_step_is_refused(bridge: tuple[str, str, str]) -> None:
    with pytest.raises(BridgeNotFound, match="could be stored by the provider"):
        install_unstored_bridge(bridge)
