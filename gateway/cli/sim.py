"""`owngate sim`: run one simulated vLLM / llama.cpp / SGLang server.

Every flag has an environment default `OWNGATE_SIM_<FLAG>` (for `--model`, a
comma-separated list). Exit codes: 0 after a clean shutdown, 2 on bad settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from gateway.cli._logging import add_logging_flags, start_logging
from gateway.sim.settings import KINDS, MAX_BODY_BYTES, Faults, SimSettings

__all__ = ["build_settings", "register", "run"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _env(name: str) -> str | None:
    return os.environ.get(f"OWNGATE_SIM_{name}")


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def register(subparsers: Any) -> None:  # argparse's subparsers action has no public type
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="run a simulated OpenAI-compatible inference server",
        description=(
            "Run an OpenAI-compatible server that queues, batches and publishes /metrics "
            "like vLLM, llama.cpp or SGLang, with optional fault injection. Every flag "
            "defaults from the environment variable OWNGATE_SIM_<FLAG>, e.g. "
            "OWNGATE_SIM_DIE_MID_STREAM_RATE."
        ),
        epilog="Exit codes: 0 after a clean shutdown, 2 on invalid settings.",
    )
    add = parser.add_argument
    add(
        "--kind",
        choices=KINDS,
        default=_env("KIND") or "vllm",
        help="server to imitate: API quirks, /metrics names, load defaults (default: vllm)",
    )
    add("--host", default=_env("HOST") or "127.0.0.1", help="address to bind (127.0.0.1)")
    add("--port", type=int, default=_env("PORT") or "8001", help="port to bind (8001)")
    add(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help="served model name, repeatable; the first is echoed in responses and metrics "
        "(env: comma-separated; default: sim-model)",
    )
    add(
        "--slots",
        type=int,
        default=_env("SLOTS"),
        help="sequences run at once, the rest queue (default: vllm/sglang 64, llamacpp 4)",
    )
    add("--seed", type=int, default=_env("SEED") or "0", help="seed of text and faults (0)")
    add(
        "--zero-latency",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="skip every sleep and write whole responses at once, for benchmarks (off)",
    )
    add(
        "--coalesce-chunks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --zero-latency, write a whole stream as one message instead of one per "
        "SSE event: fastest, less like a real server (off)",
    )
    add(
        "--token-interval",
        type=_non_negative,
        default=_env("TOKEN_INTERVAL") or "0",
        metavar="SECONDS",
        help="with --zero-latency, pace streams: one write per token, this long apart, as "
        "a decoding server writes them (0: back to back)",
    )
    add(
        "--error-rate",
        type=_rate,
        default=_env("ERROR_RATE") or "0",
        help="fraction of inference requests answered 500 (0)",
    )
    add(
        "--hang-rate",
        type=_rate,
        default=_env("HANG_RATE") or "0",
        help="fraction of inference requests never answered until the client leaves (0)",
    )
    add(
        "--die-mid-stream-rate",
        type=_rate,
        default=_env("DIE_MID_STREAM_RATE") or "0",
        help="fraction of requests whose connection is closed mid-response: streams after "
        "a few chunks, other requests after the headers (0)",
    )
    add(
        "--slow-start",
        type=_non_negative,
        default=_env("SLOW_START") or "0",
        metavar="SECONDS",
        help='answer 503 "Loading model" to /health and inference for this long (0)',
    )
    add(
        "--health-delay",
        type=_non_negative,
        default=_env("HEALTH_DELAY") or "0",
        metavar="SECONDS",
        help="answer /health only after this long, inference unaffected: a server whose "
        "HTTP threads are busy (0)",
    )
    add(
        "--prefill-tps",
        type=float,
        default=_env("PREFILL_TPS"),
        help="prompt tokens prefilled per second (default: vllm/sglang 8000, llamacpp 2000)",
    )
    add(
        "--decode-tps",
        type=float,
        default=_env("DECODE_TPS"),
        help="tokens per second of one sequence decoding alone (default: vllm/sglang 60, "
        "llamacpp 40)",
    )
    add(
        "--n-ctx",
        type=int,
        default=_env("N_CTX"),
        help="context length of one sequence in tokens: prompt plus max_tokens past it is "
        "answered 400 (default: vllm/sglang 8192, llamacpp 4096)",
    )
    add(
        "--api-key",
        default=_env("API_KEY"),
        help="require 'Authorization: Bearer KEY' as the real server would (default: none)",
    )
    add(
        "--max-body-bytes",
        type=_positive_int,
        default=_env("MAX_BODY_BYTES") or str(MAX_BODY_BYTES),
        metavar="BYTES",
        help="largest request body read; a longer one is answered 413 and not read on "
        f"(default: {MAX_BODY_BYTES}, 64 MiB)",
    )
    add_logging_flags(parser, "OWNGATE_SIM_")
    parser.set_defaults(handler=run)


def _switch(value: bool | None, env_name: str) -> bool:
    """A --flag/--no-flag value, or else its environment default."""
    if value is not None:
        return value
    text = (_env(env_name) or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"OWNGATE_SIM_{env_name} must be a boolean, got {text!r}")


def build_settings(args: argparse.Namespace) -> SimSettings:
    """The `SimSettings` the parsed flags ask for; raises ValueError when invalid."""
    models = args.model or [m.strip() for m in (_env("MODEL") or "").split(",") if m.strip()]
    base = SimSettings.for_kind(
        args.kind,
        models=tuple(models) or ("sim-model",),
        zero_latency=_switch(args.zero_latency, "ZERO_LATENCY"),
        seed=args.seed,
        api_key=args.api_key or None,
        faults=Faults(
            error_rate=args.error_rate,
            hang_rate=args.hang_rate,
            die_mid_stream_rate=args.die_mid_stream_rate,
            slow_start_s=args.slow_start,
            health_delay_s=args.health_delay,
        ),
    )
    return dataclasses.replace(
        base,
        slots=base.slots if args.slots is None else args.slots,
        n_ctx=base.n_ctx if args.n_ctx is None else args.n_ctx,
        prefill_tokens_per_s=(
            base.prefill_tokens_per_s if args.prefill_tps is None else args.prefill_tps
        ),
        decode_tokens_per_s=base.decode_tokens_per_s
        if args.decode_tps is None
        else args.decode_tps,
        coalesce_chunks=_switch(args.coalesce_chunks, "COALESCE_CHUNKS"),
        token_interval_s=args.token_interval,
        max_body_bytes=args.max_body_bytes,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    import uvicorn  # the server is only needed when serving, not to build the parser

    from gateway.serving import uvicorn_config
    from gateway.sim import create_sim_app

    try:
        settings = build_settings(args)
    except ValueError as exc:
        print(f"owngate sim: {exc}", file=sys.stderr)
        return 2
    start_logging(args)
    app = create_sim_app(settings)
    print(
        f"owngate sim: {settings.kind}-like server for {', '.join(settings.models)} "
        f"on http://{args.host}:{args.port} ({settings.slots} slots"
        f"{', zero latency' if settings.zero_latency else ''})",
        file=sys.stderr,
    )
    uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port)).run()
    return 0
