"""`owngate sim`: an OpenAI-compatible server that behaves like vLLM, llama.cpp or SGLang.

It queues, batches and slows down like a real inference server, publishes the real
servers' `/metrics` names, and injects faults on demand, so the demo, the tests and the
benchmarks run without a GPU or network. A per-server prefix cache (`gateway.sim.prefix`)
makes prompts that share leading messages prefill faster. See `SimSettings` for the knobs
and `SimApp` for what tests read and change on a running server.
"""

from gateway.sim.app import SimApp, create_sim_app
from gateway.sim.control import CapturedRequest, SimControl, SimStats
from gateway.sim.engine import Clock, Engine, MonotonicClock, SeqState, Sequence, VirtualClock
from gateway.sim.prefix import PrefixCache, PromptChain, prompt_chain
from gateway.sim.settings import KINDS, Faults, Kind, SimSettings
from gateway.sim.text import VOCABULARY, TextGenerator

__all__ = [
    "KINDS",
    "VOCABULARY",
    "CapturedRequest",
    "Clock",
    "Engine",
    "Faults",
    "Kind",
    "MonotonicClock",
    "PrefixCache",
    "PromptChain",
    "SeqState",
    "Sequence",
    "SimApp",
    "SimControl",
    "SimSettings",
    "SimStats",
    "TextGenerator",
    "VirtualClock",
    "create_sim_app",
    "prompt_chain",
]
