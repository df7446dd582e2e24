"""`owngate demo`: the gateway, two simulated private backends and a simulated hosted
provider in one process, with the bundled config. No Redis, GPU or network needed."""

from __future__ import annotations

import contextlib
import logging
import sys
from importlib import resources
from typing import TextIO

import uvicorn

from gateway.api import create_app
from gateway.config import GatewayConfig, parse_config
from gateway.keys import hash_api_key, new_api_key
from gateway.logs import configure_logging
from gateway.serving import ServerThread, bind_socket, uvicorn_config
from gateway.sim import SimSettings, create_sim_app

__all__ = ["demo_config", "run_demo"]


def demo_config(urls: dict[str, str], key_hash: str) -> GatewayConfig:
    text = resources.files("gateway.demo").joinpath("gateway.yaml").read_text(encoding="utf-8")
    env = {
        "OWNGATE_DEMO_VLLM_URL": urls["vllm"],
        "OWNGATE_DEMO_LLAMACPP_URL": urls["llamacpp"],
        "OWNGATE_DEMO_HOSTED_URL": urls["hosted"],
        "OWNGATE_DEMO_KEY_HASH": key_hash,
    }
    return parse_config(text, source="gateway/demo/gateway.yaml", env=env)


def run_demo(host: str, port: int, out: TextIO = sys.stdout) -> int:
    configure_logging("console", "info")
    # uvicorn's start/stop lines for four servers would bury the banner.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    key = new_api_key()
    sims = {
        "vllm": SimSettings.for_kind(
            "vllm", models=("meta-llama/Llama-3.1-8B-Instruct", "bge-small"), seed=1
        ),
        "llamacpp": SimSettings.for_kind("llamacpp", models=("llama-3.1-8b-q4_k_m",), seed=2),
        "hosted": SimSettings.for_kind("vllm", models=("gpt-4o-mini",), seed=3),
    }
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(ServerThread(create_sim_app(settings))).url
            for name, settings in sims.items()
        }
        config = demo_config(urls, hash_api_key(key))
        try:
            sock = bind_socket(host, port)
        except OSError as exc:
            print(
                f"error: cannot listen on {host}:{port}: {exc.strerror}; pick another with --port",
                file=sys.stderr,
            )
            return 1
        url = f"http://{host}:{sock.getsockname()[1]}"
        out.write(_banner(url, key, urls))
        out.flush()
        server = uvicorn.Server(uvicorn_config(create_app(config)))
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled
            server.run(sockets=[sock])
    return 0


def _banner(url: str, key: str, sims: dict[str, str]) -> str:
    return f"""
owngate demo is running at {url}
  simulated private backends: gpu-vllm (vLLM-like, {sims["vllm"]}),
                              cpu-llamacpp (llama.cpp-like, 4 slots, {sims["llamacpp"]})
  simulated hosted provider:  openai ({sims["hosted"]}) - no trust policy allows it, so
                              requests for gpt-4o-mini are refused (403)
  demo API key (shown once):  {key}

Try it:
  curl -s {url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "llama-3.1-8b", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="{key}")
  reply = client.chat.completions.create(
      model="llama-3.1-8b", messages=[{{"role": "user", "content": "Hello!"}}])
  print(reply.choices[0].message.content)
  PY

Models: curl -s {url}/v1/models -H "Authorization: Bearer {key}"
Metrics: curl -s {url}/metrics      Ctrl-C stops everything.

"""
