"""integration_tests/warehouse/ is a dbt project with its driver beside it, not
an installed package: make the driver importable."""

from __future__ import annotations

import sys
from pathlib import Path

WAREHOUSE_DIR = Path(__file__).resolve().parents[2] / "integration_tests" / "warehouse"
if str(WAREHOUSE_DIR) not in sys.path:
    sys.path.insert(0, str(WAREHOUSE_DIR))
