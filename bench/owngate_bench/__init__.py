"""owngate's benchmarks, a distribution of their own (`owngate-bench`) kept out of the
runtime wheel: `owngate bench VERB` (or `python -m owngate_bench VERB`) runs them.

`cli` lists the verbs. Each verb's module has its flags (`add_arguments`), the work
(`run`) and, in its docstring, its description. The load generators run in their own
processes (`loadgen` closed loop, `openloop` trace replay); `services` starts, measures
and stops the servers under test, `simhost` hosts simulators in-process, and
`litellm_proxy` prepares LiteLLM's proxy as a comparison target in an isolated virtualenv.
"""

__all__: list[str] = []
