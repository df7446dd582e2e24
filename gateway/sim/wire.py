"""Reading inference requests: the fields the simulator needs, validated the way servers do.

Unknown fields are ignored, as real servers ignore what they do not use. A wrong shape
raises `WireError` (answered 400), an unknown model `ModelNotFound` (answered 404 by
vLLM- and SGLang-like servers; llama.cpp ignores the requested model), a request longer
than the context `ContextTooLong` (answered 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.sim.settings import SimSettings
from gateway.sim.text import (
    WireError,
    chat_prompt_tokens,
    completion_prompt_tokens,
    prompt_list,
)

__all__ = [
    "MAX_CHOICES",
    "Completion",
    "ContextTooLong",
    "EmbeddingRequest",
    "Endpoint",
    "ModelNotFound",
    "WireError",
    "parse_completion",
    "parse_embedding",
]

Endpoint = Literal["chat", "text"]

MAX_CHOICES = 128
"""The most choices (`n`) one completion request may ask for."""


class ModelNotFound(LookupError):
    """The request names a model this server does not serve."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")
        self.model = model


class ContextTooLong(ValueError):
    """Prompt plus requested completion exceed the context length."""

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


@dataclass(frozen=True, slots=True)
class Completion:
    """A chat or legacy completion request, as far as the simulator cares."""

    endpoint: Endpoint
    model: str
    prompt: object  # `messages` or `prompt` (the first of `prompts`): choice 0's text key
    prompt_tokens: int  # summed over `prompts` when there are several
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    n: int = 1  # choices to answer per prompt, each `max_tokens` long
    # A legacy `prompt` that is a list of several prompts (strings or token-id lists):
    # each prompt and its own token count; empty for one prompt. Each prompt gets `n`
    # choices, choice `p * n + c` from prompt `p`, as vLLM and OpenAI number them.
    prompts: tuple[object, ...] = ()
    prompt_counts: tuple[int, ...] = ()

    @property
    def choices(self) -> int:
        """Choices in the answer: `n` for each prompt."""
        return self.n * len(self.prompts) if self.prompts else self.n

    def source(self, index: int) -> tuple[object, int, int]:
        """Choice `index`'s prompt, its choice number within that prompt (the text salt)
        and that prompt's token count."""
        if not self.prompts:
            return self.prompt, index, self.prompt_tokens
        which, choice = divmod(index, self.n)
        return self.prompts[which], choice, self.prompt_counts[which]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: list[object]
    prompt_tokens: int
    dims: int
    base64: bool


def _model(payload: dict[str, Any], settings: SimSettings) -> str:
    if settings.kind == "llamacpp":
        return settings.model  # llama-server serves one model whatever the request names
    model = payload.get("model")
    if model is None:
        return settings.model
    if not isinstance(model, str):
        raise WireError("'model' must be a string")
    if model not in settings.models:
        raise ModelNotFound(model)
    return model


def _positive_int(payload: dict[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WireError(f"'{name}' must be a positive integer")
    return value


def _choices(payload: dict[str, Any]) -> int:
    """`n`: absent or null is 1; vLLM refuses one below 1, and this server one above
    `MAX_CHOICES` (a bound on the work one request may ask for)."""
    value = payload.get("n")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise WireError(f"'n' must be an integer from 1 to {MAX_CHOICES}")
    return value


def _flag(container: dict[str, Any], name: str) -> bool:
    value = container.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise WireError(f"'{name}' must be a boolean")
    return value


def parse_completion(
    endpoint: Endpoint, payload: dict[str, Any], settings: SimSettings
) -> Completion:
    model = _model(payload, settings)
    if endpoint == "chat":
        prompt = payload.get("messages")
        prompt_tokens = chat_prompt_tokens(prompt)
        requested = _positive_int(payload, "max_completion_tokens")
        if requested is None:
            requested = _positive_int(payload, "max_tokens")
    else:
        prompt = payload.get("prompt")
        prompt_tokens = completion_prompt_tokens(prompt)
        requested = _positive_int(payload, "max_tokens")
    prompts, counts = prompt_list(prompt) if endpoint == "text" else ((), ())
    if prompts:  # several prompts: each is its own request to the context check, as in vLLM
        prompt, prompt_tokens, longest = prompts[0], sum(counts), max(counts)
    else:
        longest = prompt_tokens
    if requested is not None and longest + requested > settings.n_ctx:
        raise ContextTooLong(longest, requested, settings.n_ctx)
    if longest >= settings.n_ctx:
        raise ContextTooLong(longest, requested or 1, settings.n_ctx)
    n = _choices(payload)
    if prompts and n * len(prompts) > MAX_CHOICES:
        raise WireError(f"'n' times the number of prompts must be at most {MAX_CHOICES}")
    stream = _flag(payload, "stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise WireError("'stream_options' must be an object")
    include_usage = stream and options is not None and _flag(options, "include_usage")
    return Completion(
        endpoint=endpoint,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=settings.default_max_tokens if requested is None else requested,
        finish_reason="stop" if requested is None else "length",
        stream=stream,
        include_usage=include_usage,
        n=n,
        prompts=prompts,
        prompt_counts=counts,
    )


def parse_embedding(payload: dict[str, Any], settings: SimSettings) -> EmbeddingRequest:
    model = _model(payload, settings)
    raw = payload.get("input")
    prompt_tokens = completion_prompt_tokens(raw)
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(t, int) for t in raw)):
        inputs: list[object] = [raw]
    else:
        assert isinstance(raw, list)  # completion_prompt_tokens accepted nothing else
        inputs = list(raw)
    dims = _positive_int(payload, "dimensions") or settings.embedding_dims
    encoding = payload.get("encoding_format", "float")
    if encoding not in ("float", "base64", None):
        raise WireError("'encoding_format' must be 'float' or 'base64'")
    return EmbeddingRequest(
        model=model,
        inputs=inputs,
        prompt_tokens=prompt_tokens,
        dims=dims,
        base64=encoding == "base64",
    )
