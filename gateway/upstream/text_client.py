"""The gateway's OpenAI client lent to LiteLLM's text completions that its bridge sends.

LiteLLM 1.108.7's text-completion handler (`OpenAITextCompletion.acompletion`,
`async_streaming`) builds a new `AsyncOpenAI`, with its own aiohttp session and connector
(or, streamed, its own httpx pool), for every call not handed a `client`, and never closes
it. gateway/upstream/hosted.py hands every `atext_completion` its own client for that reason,
but a model LiteLLM serves through its Responses bridge (`openai/responses/<model>`, a
`mode: responses` model: gateway/upstream/responses_bridge.py) reaches that handler through
`litellm.responses` and a second `acompletion`, which pass no `client` on: each such request
left a session holding its provider connection open until the garbage collector found it
(aiohttp's "Unclosed client session" / "Unclosed connector"), one descriptor per request, a
provider answering 500 on a kept-alive connection included.

`lending(client)` makes `client` the one those two methods use, within the block (and the
tasks it starts), when they were given none and the call goes to the same base URL with the
same key; `install_text_client_default()` (run once, when LiteLLM is loaded: gateway/
upstream/litellm_runtime.py) wraps them so. A LiteLLM without them raises
`TextHandlerNotFound` at load: hosted calls then fail, they do not leak unchecked.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

__all__ = ["HANDLER", "TextHandlerNotFound", "install_text_client_default", "lending"]

# Where LiteLLM's OpenAI text-completion handler builds its client (LiteLLM 1.108.7).
HANDLER: Final = (
    "litellm.llms.openai.completion.handler",
    "OpenAITextCompletion",
    ("acompletion", "async_streaming"),
)
_MARK: Final = "_owngate_lent_client"
_LENT: ContextVar[Any | None] = ContextVar("owngate_text_client", default=None)


class TextHandlerNotFound(RuntimeError):
    """The installed LiteLLM has no text-completion handler where this module expects one."""


@contextmanager
def lending(client: Any | None) -> Iterator[None]:
    """Within this block, LiteLLM's text-completion handler uses `client` when it was
    handed none (None: lend nothing)."""
    token = _LENT.set(client)
    try:
        yield
    finally:
        _LENT.reset(token)


def _fits(client: Any, kwargs: dict[str, Any]) -> bool:
    """Whether `client` sends where, and with the key, this call would."""
    base = str(getattr(client, "base_url", "")).rstrip("/")
    wanted = str(kwargs.get("api_base") or "").rstrip("/")
    return (
        bool(wanted)
        and base == wanted
        and getattr(client, "api_key", None) == kwargs.get("api_key")
    )


def install_text_client_default(handler: tuple[str, str, tuple[str, ...]] = HANDLER) -> None:
    """Wrap the handler's methods (`handler`: module, class, method names) to use the lent
    client when given none; idempotent. Raises `TextHandlerNotFound` when LiteLLM has no
    such methods."""
    module_name, class_name, method_names = handler
    try:
        owner = getattr(importlib.import_module(module_name), class_name)
        methods = {name: getattr(owner, name) for name in method_names}
    except (ImportError, AttributeError) as exc:
        raise TextHandlerNotFound(
            f"LiteLLM's text-completion handler ({module_name}.{class_name}) is not where "
            "owngate expects it: each text completion it bridges would leak a connection"
        ) from exc
    for name, method in methods.items():
        if getattr(method, _MARK, False):
            continue
        setattr(owner, name, _lent_default(method))


def _lent_default(method: Any) -> Any:
    """`method` (a coroutine or async generator function: `async_streaming` is one) with
    the lent client as its default: it is called with it, and returns what it returns."""

    @functools.wraps(method)
    def with_lent_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        lent = _LENT.get()
        if lent is not None and kwargs.get("client") is None and _fits(lent, kwargs):
            kwargs["client"] = lent
        return method(self, *args, **kwargs)

    setattr(with_lent_client, _MARK, True)
    return with_lent_client
