"""What pinning a source costs when nothing was committed to it since the last pin (issue 20).

A refresh with no source change answers from its view's record, and what
it still reads is each source's pin: `SHOW TBLPROPERTIES` (a Delta table?
its change feed?) and `DESCRIBE HISTORY ... LIMIT 20` (the version, the
commit times that tell a re-created table). Issue 20 asks for such a
refresh under 0.5 s per model; Q5 reads six sources. This script creates
TABLES small Delta tables with a change feed and a few commits, then times
each statement on them, unchanged, ROUNDS times, with the Spark jobs each
ran (seconds per statement: the median of all rounds but the first).

    PYTHONPATH=bench .venv/bin/python bench/micro/unchanged_pin.py

Measured 2026-12-02 (the embedded runtime's configs, a JVM of its own):
`SHOW TBLPROPERTIES` 0.05 s and no job; `DESCRIBE HISTORY ... LIMIT 20`
0.18 s and `LIMIT 1` 0.13 s, one Spark job each (0.02-0.04 s of it)
however few commits it reads: Delta reads the commits' files in a job of its own
(`DeltaHistoryManager.getHistory`, `spark.range(...).mapPartitions`). So a
model over six sources pays about a second to learn that none changed,
unless an earlier model of the same `dbt build` pinned them (the worked
example's no-change run: 0.08-0.14 s for every model but the first).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from micro.append_phases import Jobs
from tpch_bench.spark_session import start_session

WORK = Path(__file__).resolve().parents[1] / "work" / "micro"
TABLES = 3
ROUNDS = 6
STATEMENTS = (
    "SHOW TBLPROPERTIES s.pinned_{n}",
    "DESCRIBE HISTORY s.pinned_{n} LIMIT 20",
    "DESCRIBE HISTORY s.pinned_{n} LIMIT 1",
)


def main() -> None:
    spark, _ = start_session(WORK)
    spark.sql("CREATE SCHEMA IF NOT EXISTS s")
    for n in range(TABLES):
        spark.sql(f"DROP TABLE IF EXISTS s.pinned_{n}")
        spark.sql(
            f"CREATE TABLE s.pinned_{n} (k INT, v INT) USING delta "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
        for start in range(0, 1200, 100):
            spark.sql(f"INSERT INTO s.pinned_{n} SELECT id, id FROM range({start}, {start + 100})")
    jobs = Jobs(spark)
    for template in STATEMENTS:
        seconds, described = [], ""
        for round_ in range(ROUNDS):
            for n in range(TABLES):
                started = time.perf_counter()
                spark.sql(template.format(n=n)).collect()
                if round_ > 0:
                    seconds.append(time.perf_counter() - started)
                described = jobs.since()
        print(f"{template.format(n='N')}: {statistics.median(seconds):.3f} s; {described}")


if __name__ == "__main__":
    main()
