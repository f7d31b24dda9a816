"""``python -m tpch_bench`` (with bench/ on the path): what bench/run executes."""

import sys

from tpch_bench.cli import main

sys.exit(main())
