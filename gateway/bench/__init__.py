"""Benchmarks of owngate: `overhead` compares the gateway with the simulator and LiteLLM.

`loadgen` is the client (its own process), `litellm_proxy` prepares the comparison proxy
in an isolated virtualenv, and `overhead` starts the targets, runs the loads and reports.
"""

__all__: list[str] = []
