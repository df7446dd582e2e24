"""Scale benchmark: `python bench/scale.py --help` (same as `owngate bench scale`)."""

import sys
from pathlib import Path

# Run from a checkout without installing: make the source tree importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.bench.scale import main

raise SystemExit(main())
