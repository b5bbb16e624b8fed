from __future__ import annotations

import sys
from pathlib import Path

# builders.py sits next to the tests; make it importable as a plain module
sys.path.insert(0, str(Path(__file__).parent))
