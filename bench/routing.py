"""Routing benchmark: `python bench/routing.py --help` (same as `owngate bench routing`)."""

import sys
from pathlib import Path

# Run from a checkout without installing: make the source tree importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.bench.routing import main

raise SystemExit(main())
