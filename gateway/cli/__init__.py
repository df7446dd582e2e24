"""The `owngate` command line: `owngate <noun> <verb>`, one module per noun."""

__all__: list[str] = []
