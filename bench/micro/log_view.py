"""A projection's log read through its view: summed whole, or split by its negated rows (issue 54).

A design study of the adapter's own SQL (ivm_compiler/log_state.view_rows).
A projection kept as a log (ivm_state_form 'log' or 'auto') appends each
refresh's change rows, a removal as a row with a negative count. Its view
summed every key's rows (log_state.consolidated), so every read of the
model shuffled the whole log: the warehouse's NTILE fallback reads
slv_order_items, a log of 17.5 M rows of which 6,437 had a negative count,
and spent 24.6 of its 50.5 executor CPU s there (2026-12-06, scale 6000).
The split view passes through the rows whose key hash no negated row has
and sums the rest, the negated hashes broadcast.

One log shaped like slv_order_items (five key columns, a count, the guard
column): `--rows` rows written as a rewrite leaves them, then an append of
`--changed` keys removed (count -1) and put back changed (+1) and as many
new rows. Both forms are read in a session with Spark's defaults (a
reader's: adaptive execution on), alternating, and must give the same
rows; the view texts are the compiler's (`summed` is the split view put
back as its sums, as readers of the model parse it).

    PYTHONPATH=bench .venv/bin/python bench/micro/log_view.py --rows 17500000 --changed 6400

Measured: bench/results/issue54/log-view-17m.txt.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from micro.append_state import Catalog
from sqlglot import exp
from tpch_bench.spark_session import SparkMetrics, start_session

from ivm_compiler import TableName, compile_model, emit, log_state, state_rows
from ivm_compiler.names import COUNT, GUARD
from ivm_compiler.sql import DIALECT

SOURCE = TableName("bench_log", "items")
STATE = TableName("bench_log", "items__ivm_state")
MODEL = "SELECT order_id, line_no, product_id, quantity, net_amount FROM bench_log.items"


def build(spark, rows: int, changed: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The source (empty: only its schema is read) and the log; the state's key columns."""
    spark.sql("CREATE SCHEMA IF NOT EXISTS bench_log")
    spark.sql(
        f"CREATE OR REPLACE TABLE {SOURCE.sql()} (order_id INT, line_no INT, product_id INT, "
        "quantity INT, net_amount DECIMAL(12, 2)) USING DELTA"
    )
    plan = log_state.with_log(compile_model("items", MODEL, Catalog(spark), {}))
    keys = state_rows.state_table_columns(plan)[:5]
    assert state_rows.state_table_columns(plan)[5:] == [COUNT], "a projection's log"
    g0, g1, g2, g3, g4 = keys
    spark.sql(
        f"""
        CREATE OR REPLACE TABLE {STATE.sql()} USING DELTA AS
        SELECT CAST(id DIV 3 AS INT) AS {g0}, CAST(id % 3 AS INT) AS {g1},
               CAST(pmod(id * 7919, 20000) AS INT) AS {g2}, CAST(1 + id % 5 AS INT) AS {g3},
               CAST(pmod(id * 31, 100000) / 100 AS DECIMAL(12, 2)) AS {g4},
               CAST(1 AS BIGINT) AS {COUNT}, CAST(NULL AS STRING) AS {GUARD}
        FROM RANGE({rows}) DISTRIBUTE BY rand(1)
        """
    )
    # A day's change: lines of every age removed and put back with a new
    # quantity, and new lines, appended as a refresh appends them.
    spark.sql(
        f"""
        INSERT INTO {STATE.sql()}
        WITH touched AS (
            SELECT DISTINCT CAST(pmod(hash(id, 7), {rows}) AS BIGINT) AS id FROM RANGE({changed})
        ), old AS (
            SELECT CAST(id DIV 3 AS INT) AS {g0}, CAST(id % 3 AS INT) AS {g1},
                   CAST(pmod(id * 7919, 20000) AS INT) AS {g2}, CAST(1 + id % 5 AS INT) AS {g3},
                   CAST(pmod(id * 31, 100000) / 100 AS DECIMAL(12, 2)) AS {g4}
            FROM touched
        )
        SELECT {g0}, {g1}, {g2}, {g3}, {g4}, CAST(-1 AS BIGINT), CAST(NULL AS STRING) FROM old
        UNION ALL
        SELECT {g0}, {g1}, {g2}, {g3} + 1, {g4}, CAST(1 AS BIGINT), CAST(NULL AS STRING) FROM old
        UNION ALL
        SELECT CAST({rows} DIV 3 + id AS INT), 0, 1, 1, 1.00, CAST(1 AS BIGINT),
               CAST(NULL AS STRING)
        FROM RANGE({changed})
        """
    )
    return [
        emit.view_query(plan, STATE).sql(dialect=DIALECT),
        log_state.summed_view(emit.view_query(plan, STATE), STATE).sql(dialect=DIALECT),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--changed", type=int, default=6_400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runtime:
        spark, _ = start_session(Path(runtime), (("spark.driver.memory", "8g"),))
        metrics = SparkMetrics(spark)
        split, summed = build(spark, args.rows, args.changed)
        assert "LEFT ANTI JOIN" in split and "LEFT ANTI JOIN" not in summed
        print(f"log: {args.rows:,} rows and an append of {args.changed:,} keys changed")
        times: dict[str, list[float]] = {"split": [], "summed": []}
        jobs: dict[str, int] = {}
        answers = set()
        for _ in range(args.rounds):
            for name, view in (("summed", summed), ("split", split)):
                query = exp.select("COUNT(*)", "BIT_XOR(XXHASH64(*))").from_(
                    exp.maybe_parse(view, dialect=DIALECT).subquery("v")
                )
                mark = metrics.mark()
                started = time.monotonic()
                answer = spark.sql(query.sql(dialect=DIALECT)).collect()[0]
                times[name].append(time.monotonic() - started)
                jobs[name] = metrics.since(mark).jobs
                answers.add(tuple(answer))
        assert len(answers) == 1, f"the two views differ: {answers}"
        ((rows, _),) = answers
        print(f"both views: {rows:,} rows, the same bag hash")
        for name in ("summed", "split"):
            runs = ", ".join(f"{t:.2f}" for t in times[name])
            print(
                f"{name:7s} median {statistics.median(times[name]):6.2f} s "
                f"({runs}; {jobs[name]} Spark jobs)"
            )


if __name__ == "__main__":
    main()
