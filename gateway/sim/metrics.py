"""`/metrics` in the Prometheus text format, with the names and labels real servers use.

- vLLM (V1 engine): `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (0..1), `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total` and
  `vllm:prefix_cache_hits_total` (prompt tokens looked up in the prefix cache, and of
  those found there), labelled `{engine="0",model_name="<first model>"}`.
- llama.cpp (`llama-server --metrics`): `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, `llamacpp:prompt_tokens_total`,
  `llamacpp:tokens_predicted_total`, `llamacpp:n_decode_total`,
  `llamacpp:n_busy_slots_per_decode`, `llamacpp:kv_cache_usage_ratio`,
  `llamacpp:kv_cache_tokens`, without labels.
- SGLang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
  `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
  `sglang:cache_hit_rate` (prefix-cache hit tokens over looked-up tokens), labelled
  `{model_name="<first model>"}`.
"""

from __future__ import annotations

from typing import Final

from gateway.sim.engine import Engine
from gateway.sim.settings import Kind

__all__ = ["CONTENT_TYPE", "render_metrics"]

CONTENT_TYPE: Final = b"text/plain; version=0.0.4; charset=utf-8"

# Every family as (name, type, help, value key), per kind, in exposition order.
_Family = tuple[str, str, str, str]
_VLLM: Final[tuple[_Family, ...]] = (
    (
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        "running",
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        "waiting",
    ),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
    (
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        "generated",
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        "cache_queries",
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        "cache_hits",
    ),
)
_LLAMACPP: Final[tuple[_Family, ...]] = (
    ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", "prompt"),
    (
        "llamacpp:tokens_predicted_total",
        "counter",
        "Number of generation tokens processed.",
        "generated",
    ),
    ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", "steps"),
    (
        "llamacpp:n_busy_slots_per_decode",
        "counter",
        "Average number of busy slots per llama_decode() call",
        "busy_per_step",
    ),
    ("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 = 100% usage", "kv_usage"),
    ("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", "kv_tokens"),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing.", "running"),
    ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", "waiting"),
)
_SGLANG: Final[tuple[_Family, ...]] = (
    ("sglang:num_running_reqs", "gauge", "The number of running requests.", "running"),
    ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", "waiting"),
    ("sglang:token_usage", "gauge", "The token usage.", "kv_usage"),
    ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
    (
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        "generated",
    ),
    ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", "cache_hit_rate"),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(kind: Kind, model: str, engine: Engine) -> bytes:
    """The `/metrics` body of a `kind` server serving `model` with `engine`'s state."""
    steps = engine.decode_steps
    cache = engine.prefix_cache
    values = {
        "running": engine.running,
        "waiting": engine.waiting,
        "kv_usage": engine.kv_usage,
        "kv_tokens": engine.kv_tokens,
        "prompt": engine.prompt_tokens_total,
        "generated": engine.generation_tokens_total,
        "steps": steps,
        "busy_per_step": engine.busy_slot_steps / steps if steps else 0.0,
        "cache_queries": cache.queries,
        "cache_hits": cache.hits,
        "cache_hit_rate": cache.hits / cache.queries if cache.queries else 0.0,
    }
    if kind == "llamacpp":
        families, labels = _LLAMACPP, ""
    elif kind == "sglang":
        families, labels = _SGLANG, f'{{model_name="{_escape(model)}"}}'
    else:
        families, labels = _VLLM, f'{{engine="0",model_name="{_escape(model)}"}}'
    lines: list[str] = []
    for name, mtype, help_text, key in families:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {mtype}")
        lines.append(f"{name}{labels} {float(values[key])!r}")
    lines.append("")
    return "\n".join(lines).encode()
