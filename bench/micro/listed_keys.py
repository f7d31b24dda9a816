"""A join term over a log partner, its change keys given as ranges against ranges and a list (issue 54).

A design study of the lever in ivm_compiler/key_bounds.py, at the size
where the warehouse lost most: at scale 6000, `fct_order_lines` spent
154 s of its batch refresh in one change query, the term of the change of
`slv_orders` (8,399 orders whose status moved, spread over every month)
joined with `slv_order_items`, a projection kept as a log state of 18 M
rows. The term reads the partner through its view, which sums the log per
key before it repeats each row by its count; the probe's 16 key ranges
cover almost every order, so the whole log was summed and joined.

This script builds that shape (a log state sorted by order id in files of
layout.ROWS_PER_FILE rows, the view the compiler writes over it, a change
of `--changed` orders spread by a hash, each an update: a row removed and
one added) and times the term's rows under the
bounds the refresh computes, with the compiler's own probe
(key_bounds.probe_query, parse_probe) and predicate (bound_predicate):

- `ranges`: the probe without the list (a small source's refresh);
- `listed`: the probe listing the change's keys (a large source's).

Each variant runs `--rounds` times, alternating; the first round warms the
JVM. Both must give the same rows (checked).

    .venv/bin/python bench/micro/listed_keys.py --orders 12600000 --changed 8399

Measured 2026-12-04 (bench/results/issue54/listed-keys.txt), 12.6 M orders, 18 M log
rows in 19 files, 8,399 orders changed: ranges 13.88 s, listed 2.58 s (5.4x;
medians of rounds 2 and 3), the same 24,038 rows; the probe 0.30-0.38 s either way.
The 16 ranges of 8,399 keys spread by a hash span nearly the whole key space.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlglot import exp

from dbt.adapters.spark_ivm.runtime.embedded import session_configs
from ivm_compiler import key_bounds, layout
from ivm_compiler.sql import TableName

STATE = "bench_ivm.items__ivm_state"
VIEW = "bench_ivm.items"
CHANGE = TableName("bench_ivm", "orders_change")
# The view of a projection's log, as emit.view_query writes it (tests/unit/fixtures/log_state.sql).
VIEW_SQL = f"""
CREATE OR REPLACE VIEW {VIEW} AS
SELECT CAST(__ivm_g0 AS BIGINT) AS order_id, CAST(__ivm_g1 AS INT) AS line_no,
       CAST(__ivm_g2 AS BIGINT) AS product_id, CAST(__ivm_g3 AS INT) AS quantity,
       CAST(__ivm_g4 AS DECIMAL(14,2)) AS net_amount
FROM (
  SELECT __ivm_g0, __ivm_g1, __ivm_g2, __ivm_g3, __ivm_g4,
         SUM(__ivm_count) AS __ivm_count, CAST(NULL AS STRING) AS __ivm_guard
  FROM {STATE} WHERE __ivm_guard IS NULL
  GROUP BY __ivm_g0, __ivm_g1, __ivm_g2, __ivm_g3, __ivm_g4
  HAVING SUM(__ivm_count) <> 0
) AS items__ivm_state
LATERAL VIEW EXPLODE(SEQUENCE(1, __ivm_count)) __ivm_copies AS __ivm_copy
WHERE __ivm_guard IS NULL AND __ivm_count > 0
"""


def build(spark, orders: int, changed: int) -> None:
    """The log state (about 1.43 lines per order, as the warehouse's), sorted, and the change."""
    spark.sql("CREATE DATABASE IF NOT EXISTS bench_ivm")
    spark.conf.set(layout.ROWS_PER_FILE_CONF, str(layout.ROWS_PER_FILE))
    started = time.monotonic()
    spark.sql(f"""
        CREATE OR REPLACE TABLE {STATE} USING DELTA AS
        SELECT id * 7 DIV 10 AS __ivm_g0, CAST(id % 2 + 1 AS INT) AS __ivm_g1,
               id * 7919 % 40000 AS __ivm_g2, CAST(id % 9 + 1 AS INT) AS __ivm_g3,
               CAST(id % 50000 / 100 AS DECIMAL(14,2)) AS __ivm_g4,
               CAST(1 AS BIGINT) AS __ivm_count, CAST(NULL AS STRING) AS __ivm_guard
        FROM range({orders * 10 // 7})
        ORDER BY __ivm_g0
    """)
    spark.sql(VIEW_SQL)
    spark.sql(f"""
        CREATE OR REPLACE TABLE {CHANGE} USING DELTA AS
        SELECT CAST(PMOD(HASH(id DIV 2), {orders}) AS BIGINT) AS order_id, 'shipped' AS status,
               IF(id % 2 = 0, 1, -1) AS __ivm_sign
        FROM range({changed * 2})
    """)
    rows = spark.sql(f"SELECT COUNT(*) FROM {STATE}").collect()[0][0]
    files = spark.sql(f"DESCRIBE DETAIL {STATE}").collect()[0]["numFiles"]
    print(f"built {rows:,} log rows in {files} files in {time.monotonic() - started:.1f}s")


def bounds_of(spark, listed: bool) -> tuple[exp.Expr, float, str]:
    """The partner's predicate from the compiler's probe, the probe's seconds and a summary."""
    key = key_bounds.KeyColumn(CHANGE, "order_id", "bigint")
    rows = (
        exp.select("*")
        .from_(exp.to_table(str(CHANGE)))
        .subquery(exp.to_identifier("__ivm_changes", True))
    )
    sql = key_bounds.probe_query({CHANGE: (rows, [key])}, list_keys=listed).sql("spark")
    started = time.monotonic()
    answer = [tuple(r) for r in spark.sql(sql).collect()]
    seconds = time.monotonic() - started
    bounds = key_bounds.parse_probe([key], answer)
    found = bounds[(CHANGE, "order_id")]
    predicate = key_bounds.bound_predicate(key_bounds.PartnerBound(key, "i", "order_id"), bounds)
    assert predicate is not None
    listed_count = "no list" if found.listed is None else f"{len(found.listed):,} keys listed"
    return predicate, seconds, f"{len(found.ranges)} ranges, {listed_count}"


def term(predicate: exp.Expr) -> str:
    """The term's rows: the change of orders joined with the partner's view, bounded."""
    return (
        exp.select(
            "o.order_id", "i.line_no", "o.status", "i.product_id", "i.net_amount", "o.__ivm_sign"
        )
        .from_(exp.to_table(str(CHANGE)).as_("o"))
        .join(exp.to_table(VIEW).as_("i"), on="i.order_id = o.order_id")
        .where(predicate)
        .sql("spark")
    )


def run(spark, listed: bool) -> tuple[float, float, int, str]:
    predicate, probe_seconds, summary = bounds_of(spark, listed)
    started = time.monotonic()
    rows = spark.sql(f"SELECT COUNT(*), SUM(HASH(*)) FROM ({term(predicate)})").collect()[0]
    return probe_seconds, time.monotonic() - started, (rows[0], rows[1]), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=12_600_000)
    parser.add_argument("--changed", type=int, default=8_399)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    runtime = Path(tempfile.mkdtemp(prefix="listed-keys-"))
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(runtime).items():
        builder = builder.config(key, value)
    spark = builder.config("spark.driver.memory", args.driver_memory).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # As a change over large sources runs (delta.confs.CHANGE_SETTINGS).
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    build(spark, args.orders, args.changed)

    times: dict[str, list[float]] = {"ranges": [], "listed": []}
    answers = {}
    for round_ in range(args.rounds):
        for name, taken in times.items():
            probe, seconds, answer, summary = run(spark, name == "listed")
            answers[name] = answer
            taken.append(seconds)
            print(
                f"round {round_ + 1} {name:6}: probe {probe:5.2f}s, term {seconds:6.2f}s, "
                f"{answer[0]:,} rows ({summary})",
                flush=True,
            )
    assert answers["ranges"] == answers["listed"], answers
    kept = {name: t[1:] or t for name, t in times.items()}
    ranges, listed = (statistics.median(kept[n]) for n in ("ranges", "listed"))
    print(
        f"median of rounds 2..{args.rounds}: ranges {ranges:.2f}s, listed {listed:.2f}s "
        f"({ranges / listed:.1f}x), same rows"
    )


if __name__ == "__main__":
    main()
