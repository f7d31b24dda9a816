"""An ivm_fallback table's large difference written two ways, alone on the machine (issue 54).

At warehouse scale 1500 the refused NTILE model (mart_customer_spend_quartiles)
hands on a difference of about 21,500 rows, past handoff.MERGED_CHANGE_ROWS,
so its table is overwritten (refresh/fallback.py). Under 4 dbt threads its
refresh took 54.6 s (a381075: the difference staged from the query, then the
table overwritten from the query, run a second time) and 83.9 s (21feaf9: the
query's rows cached first, the difference and the overwrite read from the
cache), against a rebuild of 8.8-12.7 s; with the other threads' jobs in
between, those times say little about the work. This script times each form
alone, on a copy of the table, over a warehouse the driver has built:

- `twice`: CACHE the difference (table against query), INSERT OVERWRITE from the query;
- `cached`: CACHE the query's rows, CACHE the difference from them, INSERT OVERWRITE from them;
- `rebuild`: CREATE OR REPLACE TABLE ... AS the query (what `table` does).

Measured 2026-12-04 (bench/results/issue54/fallback-write-1500.txt), after the
scale-1500 batch of 21feaf9, alone: twice 16.22 s, cached 20.17 s, rebuild
4.90 s (medians of rounds 2-3), the same rows: caching the query's rows costs
more than running the query again, so 21feaf9's form was reverted.

Each runs `--rounds` times, alternating, on a copy restored before each
round; the first round warms the JVM. Both forms must leave the same rows.

    .venv/bin/python bench/micro/fallback_write.py \\
        --runtime integration_tests/warehouse/.spark_ivm \\
        --sql integration_tests/warehouse/target/compiled/.../mart_customer_spend_quartiles.sql
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

from sqlglot import exp, parse_one

from ivm_compiler import TableName, emit, row_difference
from ivm_compiler.sql import DIALECT, ident

COPY = TableName("warehouse", "bench_fallback_copy")
SOURCE = TableName("warehouse", "mart_customer_spend_quartiles")


def _timed(spark, statements: list[str]) -> float:
    started = time.monotonic()
    for statement in statements:
        spark.sql(statement).collect()
    return time.monotonic() - started


def twice(query: exp.Query, columns: list[str]) -> tuple[list[str], list[str]]:
    stage = f"__bench_{uuid.uuid4().hex}_difference"
    return [
        row_difference.stage_difference(COPY, query, columns, stage),
        row_difference.count_difference(stage),
        row_difference.overwrite(COPY, query),
    ], emit.drop_staged(stage)


def cached(query: exp.Query, columns: list[str]) -> tuple[list[str], list[str]]:
    stage = f"__bench_{uuid.uuid4().hex}"
    rows, difference = f"{stage}_rows", f"{stage}_difference"
    staged = exp.select(exp.Star()).from_(exp.Table(this=ident(rows)))
    return [
        exp.Cache(this=exp.Table(this=ident(rows)), expression=query.copy()).sql(dialect=DIALECT),
        row_difference.stage_difference(COPY, staged, columns, difference),
        row_difference.count_difference(difference),
        row_difference.overwrite(COPY, staged),
    ], [*emit.drop_staged(difference), *emit.drop_staged(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runtime", required=True, type=Path)
    parser.add_argument("--sql", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from dbt.adapters.spark_ivm.runtime.embedded import session_configs

    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(args.runtime).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    query = parse_one(args.sql.read_text(), read=DIALECT)
    assert isinstance(query, exp.Query)
    columns = [f.name for f in spark.table(str(SOURCE)).schema.fields]
    snapshot = "__bench_fallback_before"
    # The table as the previous run left it: its difference from the query is
    # what a refresh hands on (the sources are at the batch's versions).
    spark.sql(f"CREATE OR REPLACE TABLE {COPY} USING DELTA AS SELECT * FROM {SOURCE}")
    version = spark.sql(f"DESCRIBE HISTORY {SOURCE} LIMIT 2").collect()[-1]["version"]
    spark.sql(f"CACHE TABLE {snapshot} AS SELECT * FROM {SOURCE} VERSION AS OF {version}")
    times: dict[str, list[float]] = {"twice": [], "cached": [], "rebuild": []}
    results = {}
    for round_ in range(args.rounds):
        for name, form in (("twice", twice), ("cached", cached), ("rebuild", None)):
            spark.sql(f"INSERT OVERWRITE {COPY} SELECT * FROM {snapshot}")
            if form is None:
                statements = [
                    f"CREATE OR REPLACE TABLE {COPY} USING DELTA AS {args.sql.read_text()}"
                ]
                freed: list[str] = []
            else:
                statements, freed = form(query, columns)
            seconds = _timed(spark, statements)
            for statement in freed:
                spark.sql(statement)
            times[name].append(seconds)
            results[name] = sorted(spark.table(str(COPY)).collect())
            print(f"round {round_ + 1} {name:8s} {seconds:7.2f} s", flush=True)
    assert results["twice"] == results["cached"] == results["rebuild"]
    for name, seconds in times.items():
        later = seconds[1:] or seconds
        print(f"{name:8s} median of rounds 2-{args.rounds}: {statistics.median(later):.2f} s")


if __name__ == "__main__":
    main()
