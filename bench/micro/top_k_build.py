"""A top-k projection's state built three ways, on the tables a warehouse run left (issue 54).

`mart_top_customers` (the ten best of the warehouse's customers by lifetime
value, a projection over `mart_customer_ltv`) compiled by the compiler
against the run's catalog, its state's rows written by `CREATE TABLE ... AS`
into scratch tables, each form ROUNDS times in turn:

- `every`: every row, as the state was kept before ivm_compiler/rules/top_k_buffer.py;
- `grouped`: the rows grouped, then those up to the 10,000th best (`c563a2f`);
- `flat`: the edge found among the flattened rows, only those up to it grouped (`2956f52`).

Each form's rows are counted, and `grouped` and `flat` must hold the same rows.
CPU is the JVM's (its tasks, planning and JIT), read from /proc around each
statement and its count.

    cd bench && PYTHONPATH=. ../.venv/bin/python micro/top_k_build.py \\
        --runtime <clone>/integration_tests/warehouse/<runtime dir> --schema warehouse
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

from ivm_compiler import TableName, compile_model
from ivm_compiler.compile import view_class_rule
from ivm_compiler.rules import top_k_buffer

MODEL = "model.spark_ivm_warehouse.mart_top_customers"
ROUNDS = 3


class SparkCatalog:
    """The compiler's Catalog, answered by the session."""

    def __init__(self, spark) -> None:
        self.spark = spark

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in self.spark.table(str(table)).schema]

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in self.spark.sql(sql).schema]


def children_cpu_seconds() -> float:
    """User and system CPU of this process's descendants (the JVM): statements, tasks, JIT."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    mine, found = {os.getpid()}, True
    while found:
        found = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                found = True
    return sum(times[pid] for pid in mine if pid != os.getpid())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtime", type=Path, required=True)
    parser.add_argument("--schema", default="warehouse")
    args = parser.parse_args()
    spark, _ = start_session(args.runtime)
    upstream = TableName(args.schema, "mart_customer_ltv")
    sql = (
        f"select customer_id, lifetime_value from {upstream} "
        "order by lifetime_value desc, customer_id limit 10"
    )
    plan = compile_model(MODEL, sql, SparkCatalog(spark))
    versions = {upstream: 0}  # a plain table here: read at its newest version
    every = view_class_rule(plan.view_class).build_query(plan, versions)
    flat = top_k_buffer.best_rows(plan, versions)
    best = top_k_buffer.rows_kept(plan.top_k)
    grouped = f"SELECT * FROM ({every.sql(dialect='spark')}) ORDER BY `__ivm_g1` DESC, `__ivm_g0` LIMIT {best}"
    forms = {
        "every": every.sql(dialect="spark"),
        "grouped": grouped,
        "flat": flat.sql(dialect="spark"),
    }
    for name, query in forms.items():
        # The compiler reads the upstream at a version; this is a plain read of it.
        forms[name] = query.replace(f"{upstream.sql()} VERSION AS OF 0", upstream.sql())
    spark.sql("CREATE SCHEMA IF NOT EXISTS top_k_build")
    for round_ in range(ROUNDS):
        for name, query in forms.items():
            cpu = children_cpu_seconds()
            started = time.monotonic()
            spark.sql(f"CREATE OR REPLACE TABLE top_k_build.{name} USING DELTA AS {query}")
            seconds = time.monotonic() - started
            rows = spark.table(f"top_k_build.{name}").count()
            print(
                f"round {round_} {name:8} {seconds:6.2f} s, JVM CPU "
                f"{children_cpu_seconds() - cpu:6.2f} s, {rows:,} rows",
                flush=True,
            )
    same = spark.sql(
        "SELECT COUNT(*) FROM (SELECT __ivm_g0, __ivm_g1, __ivm_count FROM top_k_build.grouped "
        "EXCEPT ALL SELECT __ivm_g0, __ivm_g1, __ivm_count FROM top_k_build.flat)"
    ).first()[0]
    print(f"rows of grouped not in flat: {same}")
    spark.sql("DROP SCHEMA top_k_build CASCADE")


if __name__ == "__main__":
    main()
