"""Configuration of one simulated backend: what it pretends to be, how fast it is, how it fails.

`SimSettings` is frozen and fixed when the app is built. The parts tests change on a
running server (faults and load) are copied into the app's mutable `SimControl`
(see `gateway.sim.control`). Build settings with `SimSettings.for_kind(kind)` to get
that kind's load defaults; the plain constructor's load defaults are vLLM's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = ["KINDS", "MAX_BODY_BYTES", "Faults", "Kind", "SimSettings"]

Kind = Literal["vllm", "llamacpp", "sglang"]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
MAX_BODY_BYTES: Final = 64 << 20  # a request body, by default


def _check_rate(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault injection. Rates are probabilities in 0..1, drawn from the app's seeded RNG.

    One draw per inference request decides its fate; the rates are consecutive slices of
    that draw (error first, then hang, then die), so their sum is capped at 1.

    - `error_rate`: answer 500 with an error JSON body.
    - `hang_rate`: accept the request and never answer until the client disconnects.
    - `die_mid_stream_rate`: streams close the connection after a few chunks, without the
      final chunk or `[DONE]`; non-streaming requests close it after the response headers,
      before any body byte.
    - `slow_start_s`: for this many seconds after start, `/health` and inference requests
      answer 503 "Loading model".
    - `health_delay_s`: `/health` answers only after this many seconds (sooner if the
      client leaves), while inference is unaffected: a llama-server whose few HTTP threads
      are busy streaming.
    """

    error_rate: float = 0.0
    hang_rate: float = 0.0
    die_mid_stream_rate: float = 0.0
    slow_start_s: float = 0.0
    health_delay_s: float = 0.0

    def __post_init__(self) -> None:
        _check_rate("error_rate", self.error_rate)
        _check_rate("hang_rate", self.hang_rate)
        _check_rate("die_mid_stream_rate", self.die_mid_stream_rate)
        if not self.slow_start_s >= 0.0:
            raise ValueError(f"slow_start_s must be >= 0, got {self.slow_start_s!r}")
        if not self.health_delay_s >= 0.0:
            raise ValueError(f"health_delay_s must be >= 0, got {self.health_delay_s!r}")


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Everything that defines one simulated server.

    Load model: at most `slots` sequences run at once, the rest wait in a FIFO queue. A
    sequence's prefill takes `prompt_tokens / prefill_tokens_per_s` seconds; each decode
    step emits one token for every running sequence and takes
    `(1 / decode_tokens_per_s) * (1 + batch_slowdown * (running - 1))` seconds. KV cache
    usage is the tokens held by running sequences over `kv_capacity_tokens`. `n_ctx` is
    the context length of one sequence (llama.cpp: of one slot).

    Prefix cache (see `gateway.sim.prefix`): a chat prompt whose leading messages were
    prefilled recently prefills only the rest. `prefix_cache_tokens` bounds what the
    cache holds; None means half of `kv_capacity_tokens`, 0 turns caching off.

    `zero_latency` skips every sleep and writes whole responses at once (benchmarks); its
    streams still write one ASGI message per SSE event, as real servers do, unless
    `coalesce_chunks` joins them into one message (the simulator's fastest mode).
    `token_interval_s` > 0 paces a zero-latency stream instead: one write per token (the
    role rides with the first), then a sleep of `token_interval_s` before the next, as a
    decoding server writes its tokens; late wake-ups make the gaps longer, never
    bursts. Non-streaming answers stay immediate.
    `max_body_bytes` bounds a request body (64 MiB): a longer one is answered 413 and
    read no further (a declared length over it, unread), so a client of the simulator's
    own port cannot make it hold a body of any size.
    `seed` fixes generated text, embeddings and fault draws. `api_key`, when set, makes
    the server answer 401 without `Authorization: Bearer <api_key>`.
    """

    kind: Kind = "vllm"
    models: tuple[str, ...] = ("sim-model",)
    slots: int = 64
    prefill_tokens_per_s: float = 8000.0
    decode_tokens_per_s: float = 60.0
    batch_slowdown: float = 0.02
    kv_capacity_tokens: int = 131072
    prefix_cache_tokens: int | None = None
    default_max_tokens: int = 16
    n_ctx: int = 8192
    embedding_dims: int = 16
    zero_latency: bool = False
    coalesce_chunks: bool = False
    token_interval_s: float = 0.0
    seed: int = 0
    api_key: str | None = None
    faults: Faults = Faults()
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.models or any(not isinstance(m, str) or not m for m in self.models):
            raise ValueError("models must be a non-empty tuple of non-empty names")
        for name in ("slots", "kv_capacity_tokens", "default_max_tokens", "n_ctx"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}")
        if self.embedding_dims < 1:
            raise ValueError(f"embedding_dims must be >= 1, got {self.embedding_dims!r}")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.token_interval_s >= 0.0:
            raise ValueError(f"token_interval_s must be >= 0, got {self.token_interval_s!r}")
        if self.token_interval_s > 0.0 and self.coalesce_chunks:
            raise ValueError("token_interval_s paces one write per token: not with coalesce_chunks")
        if not self.batch_slowdown >= 0.0:
            raise ValueError(f"batch_slowdown must be >= 0, got {self.batch_slowdown!r}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError(
                f"prefix_cache_tokens must be >= 0 or None, got {self.prefix_cache_tokens!r}"
            )

    @property
    def prefix_cache_budget(self) -> int:
        """Tokens the prefix cache may hold: `prefix_cache_tokens`, by default half the KV."""
        if self.prefix_cache_tokens is None:
            return self.kv_capacity_tokens // 2
        return self.prefix_cache_tokens

    @property
    def model(self) -> str:
        """The first served model name: the one echoed when the request's is ignored."""
        return self.models[0]

    @classmethod
    def for_kind(
        cls,
        kind: Kind,
        *,
        models: tuple[str, ...] = ("sim-model",),
        zero_latency: bool = False,
        seed: int = 0,
        api_key: str | None = None,
        faults: Faults = Faults(),
    ) -> SimSettings:
        """Settings with the load defaults of `kind`; change others with `dataclasses.replace`."""
        if kind == "llamacpp":
            # llama-server -np 4 -c 16384: four slots of 4096 tokens, small batch, slower GPU.
            load = cls(
                kind=kind,
                slots=4,
                prefill_tokens_per_s=2000.0,
                decode_tokens_per_s=40.0,
                batch_slowdown=0.15,
                kv_capacity_tokens=16384,
                n_ctx=4096,
            )
        else:
            load = cls(kind=kind)
        return dataclasses.replace(
            load,
            models=models,
            zero_latency=zero_latency,
            seed=seed,
            api_key=api_key,
            faults=faults,
        )
