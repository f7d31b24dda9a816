"""Python time to build a MERGE's key bounds and a window's partition predicate (issue 54).

A day's batch on the warehouse lists up to 10,000 keys per key column
(key_bounds.MAX_LISTED_KEYS; a window's recomputed partitions more), and
py-spy put layout.target_bounds and window.partition_predicate at 351 of
the 1,137 busy samples of dbt's Python in that batch (2026-12-07, scale
6000). This builds both for KEYS integer keys and KEYS dates, writes
their SQL, ROUNDS times, and prints the best time of each; run it on two
checkouts to compare:

    PYTHONPATH=. .venv/bin/python bench/micro/merge_bounds_python.py

No Spark: the compiler alone.
"""

from __future__ import annotations

import datetime
import time

from sqlglot import exp

from ivm_compiler import layout
from ivm_compiler.view_classes import window

KEYS = 20_000
ROUNDS = 5


def best(build) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        build()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    numbers = tuple(str(7 * i) for i in range(KEYS))
    day = datetime.date(2020, 1, 1)
    dates = tuple(str(day + datetime.timedelta(days=i % 3000)) for i in range(KEYS))
    for name, data_type, listed in (("int", "int", numbers), ("date", "date", dates)):
        bounds = layout.TargetBounds("__ivm_g0", data_type, (), listed)
        merge = best(lambda b=bounds: layout.target_bounds(b, "t").sql(dialect="spark"))
        keys = [(value,) for value in listed]
        partitions = best(
            lambda k=keys, t=data_type: window.partition_predicate([exp.column("k")], [t], k).sql(
                dialect="spark"
            )
        )
        print(f"{name}: target_bounds {merge:.3f} s, partition_predicate {partitions:.3f} s")


if __name__ == "__main__":
    main()
