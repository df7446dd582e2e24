"""The `owngate` command line: `owngate <noun> <verb>`, one module per noun."""
