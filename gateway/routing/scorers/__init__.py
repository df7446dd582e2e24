"""Scorers of the `score` strategy: each gives a backend 0..1, and the picker
(gateway/routing/picker.py) orders the candidates by the weighted sum
(`routing.*.weights`). One module per scorer, its formula in its docstring:
`queue`, `kv`, `affinity`, `prefill`.
"""

__all__: list[str] = []
