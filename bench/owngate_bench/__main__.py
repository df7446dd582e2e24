"""`python -m owngate_bench VERB ...`: the benchmarks without the `owngate` front end."""

from owngate_bench.cli import main

raise SystemExit(main())
