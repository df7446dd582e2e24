"""LiteLLM's chat-to-Responses bridge: every call it makes asks the provider to store nothing.

OpenAI's Responses API keeps every response (30 days, retrievable by id with the key that
made it) unless the request says `"store": false`; Azure OpenAI's and xAI's do the same.
LiteLLM 1.108.7 serves some chat (and text) completions through that API instead of chat
completions, and its bridge builds the Responses request from the chat request's
parameters, which carry no `store`: so the provider kept the prompt and the answer,
whatever retention the policy checked the backend for (`retention.days: 0`,
`zero_data_retention`).

When LiteLLM bridges, from its source (`litellm/main.py`, `litellm/responses/
bridge_check.py`): the model's entry in its model map says `mode: responses` (OpenAI's
`o1-pro`, `o3-pro`, `gpt-5-pro`, `*-codex`, deep-research models; Azure's, Azure AI
Foundry's, Databricks', xAI's, Perplexity's, Bedrock Mantle's, GitHub Copilot's and
ChatGPT's listed ones); the model name has a `responses/` part (`azure/responses/<dep>`,
`openai/responses/gpt-4o`, any provider); or the request does (an OpenAI, Azure or
Foundry GPT-5.4+ model with function tools and reasoning effort; xAI with web search,
refused before this). A text completion of such a model is bridged the same way. That
depends on the request and on a model map that changes with every LiteLLM release, so
the gateway does not guess it: it changes the bridge.

`install_unstored_bridge()` (run once, when LiteLLM is loaded: gateway/upstream/
litellm_runtime.py) wraps `LiteLLMResponsesTransformationHandler.transform_request`,
the one step every bridged call goes through (sync and async, streamed or not), so that
the Responses request it returns has `store` set to False, and none of `background` (a
response kept to be polled), `previous_response_id` or `conversation` (state kept on the
provider's side). The gateway's allow-list already keeps those three from LiteLLM
(gateway/upstream/openai_request.py); here they are removed behind it. Each provider's
Responses adapter then sends `store: false` on the wire (tests/integration/
test_hosted_responses_bridge.py reads it at a mock provider for OpenAI, Azure, xAI,
Databricks and Perplexity). A LiteLLM without that step raises `BridgeNotFound` at load:
hosted calls then fail, they do not go out unchecked.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Final

__all__ = ["BRIDGE", "DROPPED_FIELDS", "BridgeNotFound", "install_unstored_bridge", "unstored"]

# Where the bridge builds its Responses request (LiteLLM 1.108.7).
BRIDGE: Final = (
    "litellm.completion_extras.litellm_responses_transformation.transformation",
    "LiteLLMResponsesTransformationHandler",
    "transform_request",
)
# Responses API fields that keep state on the provider's side beyond one answer.
DROPPED_FIELDS: Final = ("background", "previous_response_id", "conversation")
_MARK: Final = "_owngate_unstored"


class BridgeNotFound(RuntimeError):
    """The installed LiteLLM has no bridge step where this module expects one."""


def unstored(request: dict[str, Any]) -> dict[str, Any]:
    """`request` (the bridge's keyword arguments for `litellm.responses`) with `store`
    False and no `DROPPED_FIELDS`; changed in place and returned."""
    for name in DROPPED_FIELDS:
        request.pop(name, None)
    request["store"] = False
    return request


def install_unstored_bridge(bridge: tuple[str, str, str] = BRIDGE) -> None:
    """Make every Responses request LiteLLM's bridge builds `unstored`; idempotent.
    Raises `BridgeNotFound` when LiteLLM has no such step (`bridge`: module, class and
    method)."""
    module_name, class_name, method_name = bridge
    try:
        owner = getattr(importlib.import_module(module_name), class_name)
        build = getattr(owner, method_name)
    except (ImportError, AttributeError) as exc:
        raise BridgeNotFound(
            f"LiteLLM's chat-to-Responses bridge ({'.'.join(bridge)}) is not where owngate "
            "expects it: hosted calls it would make could be stored by the provider"
        ) from exc
    if getattr(build, _MARK, False):
        return

    @functools.wraps(build)
    def transform_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = build(self, *args, **kwargs)
        if not isinstance(request, dict):
            raise BridgeNotFound(f"LiteLLM's {method_name} returned no request to change")
        return unstored(request)

    setattr(transform_request, _MARK, True)
    setattr(owner, method_name, transform_request)
