"""What one load point asks of the load generator (`owngate_bench.loadgen`): `LoadSpec`.

It travels to the generator's process as JSON. `prompt_text(size)` is the user message of
a request: "hello", or `size` bytes of prose for the body-size points (RAG-sized prompts).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["LoadSpec", "prompt_text"]


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """One load point against one target."""

    host: str
    port: int
    api_key: str
    model: str
    stream: bool
    concurrency: int
    duration_s: float
    max_tokens: int = 16
    # Each request asks for max_tokens +- this (uniform, seeded per connection): answers of
    # varied length, as real ones are, so closed-loop clients do not run in lockstep.
    max_tokens_spread: int = 0
    path: str = "/v1/chat/completions"
    # The user message's length in bytes, 0 = "hello": a body-size point (RAG-sized prompts).
    prompt_bytes: int = 0
    max_requests: int | None = None
    warmup_s: float = 0.5
    warmup_requests: int = 2000
    grace_s: float = 30.0  # how long in-flight requests may run past the deadline
    cpu_pids: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: str | bytes) -> LoadSpec:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("load spec must be a JSON object")
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown load spec keys: {', '.join(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    def request_bytes(self, max_tokens: int | None = None) -> bytes:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt_text(self.prompt_bytes)}],
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
        }
        if self.stream:
            payload["stream"] = True
        body = orjson.dumps(payload)
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {self.api_key}\r\nContent-Type: application/json\r\n"
            f"Accept: {'text/event-stream' if self.stream else 'application/json'}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("ascii") + body


_WORDS = (
    "the gateway relays each request to a private backend and signs a receipt for it "
    "while the policy decides where the data may go "
)


def prompt_text(size: int) -> str:
    """`size` bytes of ASCII prose (words repeated), or "hello" when `size` is 0."""
    if size <= 0:
        return "hello"
    return (_WORDS * (size // len(_WORDS) + 1))[:size]
