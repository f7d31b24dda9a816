"""A change MERGEd into a large unsorted state: unbounded, or with the change's keys listed in ON (issue 54).

A design study, not the adapter's code. A refresh MERGEs its change rows
into the state by key (ivm_compiler/emit.merge_changes). Delta's MERGE runs
up to three jobs (find the touched files, write the new rows, write the
deletion vectors), each joining the state with the change; a state over
sources under SORTED_STATE_BYTES is not sorted, and a day's change touches
keys of every age, so Delta skips no file and each job shuffles the whole
state: on the warehouse at scale 6000, `mart_payment_coverage`'s MERGE
shuffled its 7.1 M state rows in three jobs for 17,602 change rows
(Spark's event log of `2bf4ca2`'s run).

With the change's keys listed in ON as a condition on the state alone
(`t.k IN (...) OR t.k IS NULL OR <the guard row>`), every job's join is
inner or keeps the change's side only (no clause reads unmatched state
rows), so Spark filters the state's rows by the list in its scan, before
the shuffle.

Both forms run on copies of one synthetic state shaped like a join
projection's (key, three values, count, guard), deletion vectors and the
change feed on, under the refresh's settings (adaptive execution off, 2
shuffle partitions), with the change staged as the refresh stages it
(CACHE TABLE): each changed key's old row with count -1 and its new row
with count +1, plus new keys. Each round re-creates both copies and times
the MERGE alone; both copies must end with the same rows, or the run fails.

    PYTHONPATH=bench .venv/bin/python bench/micro/merge_key_list.py \\
        --rows 7100000 --changed 8800

Measured: bench/results/issue54/merge-key-list-7m.txt.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from micro.merge_forms import time_forms
from tpch_bench.spark_session import start_session

SETTINGS = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "2"}
KEYS = ("g0", "g1", "g2", "g3")


def build(spark, rows: int, changed: int) -> list[int]:  # type: ignore[no-untyped-def]
    spark.sql(
        f"""
        CREATE OR REPLACE TABLE bench.key_list_base USING DELTA AS
        SELECT CAST(id AS INT) AS g0, CAST((id * 7919) % 100000 / 100 AS DECIMAL(24, 2)) AS g1,
               CAST(id % 1000 AS DECIMAL(24, 2)) AS g2, CAST(id % 7 AS BIGINT) AS g3,
               CAST(1 AS BIGINT) AS count, CAST(NULL AS STRING) AS guard
        FROM RANGE({rows}) DISTRIBUTE BY rand(1)
        """
    )
    # Changed keys spread over the whole key range, as a day's updates of orders of every age.
    spark.sql(
        f"""
        CACHE TABLE change AS
        WITH touched AS (
            SELECT DISTINCT CAST(pmod(hash(id, 31), {rows}) AS INT) AS g0 FROM RANGE({changed})
        )
        SELECT b.g0, b.g1, b.g2, b.g3, CAST(-1 AS BIGINT) AS count
        FROM bench.key_list_base AS b JOIN touched AS t ON b.g0 = t.g0
        UNION ALL
        SELECT b.g0, b.g1 + 1, b.g2, b.g3, CAST(1 AS BIGINT)
        FROM bench.key_list_base AS b JOIN touched AS t ON b.g0 = t.g0
        UNION ALL
        SELECT CAST({rows} + id AS INT), 1.00, 1.00, 1, CAST(1 AS BIGINT) FROM RANGE({changed // 10})
        """
    )
    return [r.g0 for r in spark.sql("SELECT DISTINCT g0 FROM change").collect()]


def merge(copy: str, keys: list[int] | None) -> str:
    same = " AND ".join(f"t.{k} <=> d.{k}" for k in KEYS)
    bound = (
        f" AND (t.g0 IN ({', '.join(map(str, keys))}) OR t.g0 IS NULL OR t.guard IS NOT NULL)"
        if keys is not None
        else ""
    )
    return f"""
        MERGE INTO {copy} AS t USING (SELECT *, CAST(NULL AS STRING) AS guard FROM change) AS d
        ON {same} AND t.guard <=> d.guard{bound}
        WHEN MATCHED AND t.count + d.count = 0 THEN DELETE
        WHEN MATCHED THEN UPDATE SET t.count = t.count + d.count
        WHEN NOT MATCHED THEN INSERT (g0, g1, g2, g3, count, guard)
            VALUES (d.g0, d.g1, d.g2, d.g3, d.count, NULL)
    """


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=7_100_000)
    parser.add_argument("--changed", type=int, default=8_800)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    spark, _ = start_session(Path(tempfile.mkdtemp(prefix="merge-key-list-")))
    spark.sql("CREATE DATABASE IF NOT EXISTS bench")
    keys = build(spark, args.rows, args.changed)
    for key, value in SETTINGS.items():
        spark.conf.set(key, value)
    files = spark.sql("DESCRIBE DETAIL bench.key_list_base").first().numFiles
    staged = spark.table("change").count()
    print(
        f"state {args.rows:,} rows in {files} files; change {staged:,} rows over {len(keys):,} keys"
    )
    time_forms(
        spark,
        "bench.key_list_base",
        {"unbounded": lambda copy: merge(copy, None), "listed": lambda copy: merge(copy, keys)},
        args.rounds,
    )


if __name__ == "__main__":
    main()
