"""LiteLLM's Anthropic stream parser, as a loaded gateway runs it, gives a turn that did
not end no finish reason (gateway/upstream/anthropic_stops.py): `load_litellm` installs the
wrapper, so that every Anthropic stream of a hosted call is parsed through it.

Read in a child process: `load_litellm` is cached once per process, so a test that
installed the wrapper itself could not tell whether the load installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import json
from gateway.upstream.litellm_runtime import load_litellm
load_litellm()
from litellm.llms.anthropic.chat import handler
reasons = {}
for reason in ("end_turn", "max_tokens", "model_context_window_exceeded", "pause_turn",
               None, "a_reason_from_next_year"):
    parser = handler.ModelResponseIterator(None, sync_stream=False)
    chunk = {"type": "message_delta", "delta": {"stop_reason": reason},
             "usage": {"output_tokens": 1}}
    reasons[str(reason)] = parser.chunk_parser(chunk).choices[0].finish_reason or None
print(json.dumps(reasons))
"""


def test_a_loaded_gateway_parses_anthropic_stops_through_the_wrapper() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, check=True
    )
    reasons = json.loads(done.stdout.splitlines()[-1])
    assert reasons == {
        "end_turn": "stop",
        "max_tokens": "length",
        "model_context_window_exceeded": "length",
        # Before (the load did not install it): each "stop", a finished answer.
        "pause_turn": None,
        "None": None,
        "a_reason_from_next_year": None,
    }
