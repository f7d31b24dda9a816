"""A window's recomputed partitions merged into its state: with a NOT MATCHED BY SOURCE delete, or with the deletes in the source (issue 54).

A design study, not the adapter's code. A window or dedupe model's refresh
recomputes the partitions its change touches and MERGEs them into the
state (ivm_compiler/emit._merge_recomputed_rows): a row that the
recomputation still holds keeps its place, a new one is inserted, and a
state row of those partitions that it no longer holds is deleted by a
`WHEN NOT MATCHED BY SOURCE` clause. That clause makes every state row a
candidate for the delete, so Delta looks for touched files with an outer
join that keeps the whole state, and its write joins the whole state
again: on the warehouse at scale 6000, `mart_customer_running_spend`'s
MERGE shuffled its 7.1 M state rows in each of three jobs for a change
of 274,835 rows (Spark's event log of `09c32ab`'s run).

The other form names the deletes in the source: the recomputed rows, and
the state's rows of those partitions that the recomputation no longer
holds (an anti join of the state read within the partitions), marked
gone. Every clause is then a matched or not-matched one; the ON
condition's bound on the state is a target-only conjunct of an inner or
right outer join, which Spark pushes into the state's scan, so only the
touched partitions' rows are shuffled.

Both forms run on copies of one synthetic state shaped like the
warehouse's (a running sum per customer: customer, order, date, amount,
sum, count, guard), with deletion vectors and the change feed on as the
adapter writes states of this size, under the refresh's settings
(adaptive execution off, 2 shuffle partitions). The change: every
customer in a random set gets a new latest order, and a third of them an
earlier order's amount changed, which moves every later running sum.
Each round re-creates both copies and times the MERGE alone; both copies
must end with the same rows, or the run fails.

    PYTHONPATH=bench .venv/bin/python bench/micro/partition_merge.py \\
        --rows 7100000 --customers 1800000 --touched 22500

Measured: see the results file this writes beside its output
(bench/results/issue54/partition-merge-*.txt).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

from micro.merge_forms import time_forms
from tpch_bench.spark_session import start_session

KEYS = ("g0", "g1", "g2", "g3", "g4")
SETTINGS = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "2"}


def build_state(spark, rows: int, customers: int) -> None:  # type: ignore[no-untyped-def]
    """The state: each order of a customer with its running sum, count 1, no guard."""
    spark.sql(
        f"""
        CREATE OR REPLACE TABLE bench.partition_state_base USING DELTA AS
        WITH orders AS (
            SELECT CAST(id % {customers} AS INT) AS g0, CAST(id AS INT) AS g1,
                   DATE_ADD(DATE'2020-01-01', CAST(id % 1500 AS INT)) AS g2,
                   CAST((id * 7919) % 100000 / 100 AS DECIMAL(24, 2)) AS g3
            FROM RANGE({rows})
        )
        SELECT g0, g1, g2, g3,
               CAST(SUM(g3) OVER (PARTITION BY g0 ORDER BY g2, g1
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS DECIMAL(34, 2)) AS g4,
               CAST(1 AS BIGINT) AS count, CAST(NULL AS STRING) AS guard
        FROM orders DISTRIBUTE BY rand(1)
        """
    )


def build_change(spark, touched: int, customers: int, rows: int) -> None:  # type: ignore[no-untyped-def]
    """The touched partitions' recomputed rows, as a refresh stages them."""
    spark.sql(
        f"""
        CREATE OR REPLACE TEMPORARY VIEW touched AS
        SELECT DISTINCT CAST(pmod(hash(id, 17), {customers}) AS INT) AS g0 FROM RANGE({touched})
        """
    )
    spark.sql(
        f"""
        CACHE TABLE partitions AS
        WITH old AS (
            SELECT s.g0, s.g1, s.g2,
                   -- a third of the customers: the earliest order's amount changed
                   CASE WHEN pmod(s.g0, 3) = 0 AND s.g1 = MIN(s.g1) OVER (PARTITION BY s.g0)
                        THEN s.g3 + 1 ELSE s.g3 END AS g3
            FROM bench.partition_state_base AS s JOIN touched AS t ON s.g0 = t.g0
        ),
        orders AS (
            SELECT * FROM old
            UNION ALL  -- every touched customer: a new latest order
            SELECT g0, {rows} + g0, DATE'2024-12-31', CAST(12.34 AS DECIMAL(24, 2)) FROM touched
        )
        SELECT g0, g1, g2, g3,
               CAST(SUM(g3) OVER (PARTITION BY g0 ORDER BY g2, g1
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS DECIMAL(34, 2)) AS g4,
               CAST(1 AS BIGINT) AS count
        FROM orders
        """
    )


def within(alias: str, customers: list[int]) -> str:
    return f"{alias}.g0 IN ({', '.join(str(c) for c in customers)})"


def same_keys(left: str, right: str) -> str:
    return " AND ".join(f"{left}.{k} <=> {right}.{k}" for k in KEYS)


def by_source_delete(copy: str, customers: list[int]) -> str:
    """The adapter's form: deletes by a WHEN NOT MATCHED BY SOURCE clause."""
    bound = within("t", customers)
    return f"""
        MERGE INTO {copy} AS t USING (SELECT *, CAST(NULL AS STRING) AS guard FROM partitions) AS d
        ON {same_keys("t", "d")} AND t.guard <=> d.guard AND (({bound}) OR t.guard IS NOT NULL)
        WHEN MATCHED AND NOT (t.count <=> d.count) THEN UPDATE SET t.count = d.count
        WHEN NOT MATCHED THEN INSERT (g0, g1, g2, g3, g4, count, guard)
            VALUES (d.g0, d.g1, d.g2, d.g3, d.g4, d.count, NULL)
        WHEN NOT MATCHED BY SOURCE AND ({bound}) AND t.guard IS NULL THEN DELETE
    """


def deletes_in_source(copy: str, customers: list[int]) -> str:
    """The other form: the state rows the recomputation no longer holds, marked gone."""
    bound = within("t", customers)
    columns = ", ".join(KEYS)
    return f"""
        MERGE INTO {copy} AS t USING (
            SELECT *, CAST(NULL AS STRING) AS guard, FALSE AS gone FROM partitions
            UNION ALL
            SELECT {columns}, count, guard, TRUE AS gone FROM (
                SELECT s.* FROM {copy} AS s LEFT ANTI JOIN partitions AS p
                ON {same_keys("s", "p")}
                WHERE {within("s", customers)} AND s.guard IS NULL
            )
        ) AS d
        ON {same_keys("t", "d")} AND t.guard <=> d.guard AND (({bound}) OR t.guard IS NOT NULL)
        WHEN MATCHED AND d.gone THEN DELETE
        WHEN MATCHED AND NOT (t.count <=> d.count) THEN UPDATE SET t.count = d.count
        WHEN NOT MATCHED AND NOT d.gone THEN INSERT (g0, g1, g2, g3, g4, count, guard)
            VALUES (d.g0, d.g1, d.g2, d.g3, d.g4, d.count, NULL)
    """


FORMS = {"by_source_delete": by_source_delete, "deletes_in_source": deletes_in_source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=7_100_000)
    parser.add_argument("--customers", type=int, default=1_800_000)
    parser.add_argument("--touched", type=int, default=22_500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    runtime = Path(tempfile.mkdtemp(prefix="partition-merge-"))
    spark, _ = start_session(runtime)
    spark.sql("CREATE DATABASE IF NOT EXISTS bench")
    build_state(spark, args.rows, args.customers)
    build_change(spark, args.touched, args.customers, args.rows)
    for key, value in SETTINGS.items():
        spark.conf.set(key, value)
    customers = [r.g0 for r in spark.sql("SELECT g0 FROM touched").collect()]
    staged = spark.table("partitions").count()
    files = spark.sql("DESCRIBE DETAIL bench.partition_state_base").first().numFiles
    print(
        f"state {args.rows:,} rows in {files} files over {args.customers:,} customers; "
        f"{len(customers):,} partitions recomputed, {staged:,} rows"
    )
    time_forms(
        spark,
        "bench.partition_state_base",
        {
            form: functools.partial(statement, customers=customers)
            for form, statement in FORMS.items()
        },
        args.rounds,
    )


if __name__ == "__main__":
    main()
