"""An append-only state against the guarded MERGE, on TPC-H at SF 1 (issue 20 item 3).

For each model (default Q1, Q6, Q3: an aggregate over one table, a global
aggregate, a join's aggregate), the compiler's own plan builds two copies
of the state at the sources' current versions. Then, batch after batch
(a TPC-H RF1+RF2 of 0.1 %, as bench/run applies it):

- `merge`: the compiler's guarded MERGE of the change (emit.merge_changes);
- `append`: the same change query's rows (the view class's change_query,
  signed sums per group) appended to the other copy with one INSERT, made
  idempotent by Delta's transaction id (spark.databricks.delta.write.txnAppId
  and txnVersion), which is what would stand in for the guard row;
- `table`: the model rebuilt as a table, as a dbt `table` model would be;
- the two views read (`read merge`, `read append`): the MERGE's state as
  the view reads it today, the log consolidated by its group keys when read.

Both copies and the rebuild are checked equal as bags after every batch.
Finally the log is compacted (`compact`: its rows consolidated, written
over it). Prints a markdown table of medians (seconds, Spark jobs).

Join partners are read whole (no key-bounds probe) by both the MERGE and
the append, so a join model's figures show the write forms, not the
refresh's best change query.

Needs the data of a bench run at SF 1 in bench/work (bench/run --scale 1 ...).

    BATCHES=6 MODELS=q01_pricing_summary,q06_forecast_revenue_change \
        PYTHONPATH=bench .venv/bin/python bench/micro/append_state.py
"""

from __future__ import annotations

import os
import re
import statistics
import time
import uuid
from pathlib import Path

import sqlglot
from sqlglot import exp
from tpch_bench.batches import BatchPlanner, apply_batch, latest_version
from tpch_bench.generate import generate
from tpch_bench.spark_session import SparkMetrics, start_session

from ivm_compiler import TableName, compile_model, emit, state_rows
from ivm_compiler.compile import view_class_rule
from ivm_compiler.names import GUARD
from ivm_compiler.plan import MergeRule
from ivm_compiler.reads import VersionRange
from ivm_compiler.sql import DIALECT, create_delta_table

BENCH = Path(__file__).resolve().parents[1]
WORK = BENCH / "work"
SOURCES = "tpch_sf1"
SCHEMA = "micro_append"
BATCHES = int(os.environ.get("BATCHES", "6"))
MODELS = os.environ.get(
    "MODELS", "q01_pricing_summary,q06_forecast_revenue_change,q03_shipping_priority"
).split(",")
# Batches the bench run before this one may have drawn parts for: skipped, so
# every batch here inserts and deletes parts no earlier batch touched.
SKIP_BATCHES = int(os.environ.get("SKIP_BATCHES", "20"))
# The transaction ids a log's appends carry: a table's ids outlive CREATE OR
# REPLACE, so an id of an earlier run would make this run's appends no-ops.
RUN = uuid.uuid4().hex


def model_sql(name: str) -> str:
    """The bench macro's query with its sources named (the Jinja is a source() call only)."""
    text = (BENCH / "tpch_project" / "macros" / "queries" / f"{name}.sql").read_text()
    body = text.split("%}", 1)[1].rsplit("{% endmacro %}", 1)[0]
    return re.sub(r"\{\{\s*source\('tpch',\s*'(\w+)'\)\s*\}\}", rf"{SOURCES}.\1", body)


class Catalog:
    def __init__(self, spark) -> None:
        self.spark = spark

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in self.spark.table(table.sql()).schema]

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        rows = self.spark.sql(f"DESCRIBE QUERY {sql}").collect()
        return [(r["col_name"], r["data_type"]) for r in rows]


def consolidated(plan, state: exp.Table, types: dict[str, str]) -> exp.Select:
    """The log's rows summed per group key: the state the MERGE would have kept."""
    columns = state_rows.state_table_columns(plan)
    rules = {c.name: c.rule for c in plan.state_columns}
    keys = [c for c in columns if rules[c] is MergeRule.KEY]
    summed = [
        exp.alias_(
            exp.cast(exp.func("SUM", exp.column(c, quoted=True)), types[c], dialect=DIALECT),
            c,
            quoted=True,
        )
        for c in columns
        if c not in keys
    ]
    return (
        exp.select(*(exp.column(k, quoted=True) for k in keys), *summed)
        .select(exp.alias_(exp.cast(exp.null(), "STRING"), GUARD, quoted=True))
        .from_(state)
        .where(exp.column(GUARD, quoted=True).is_(exp.null()))
        .group_by(*(exp.column(k, quoted=True) for k in keys))
    )


def log_view(plan, state: TableName, version: int, types: dict[str, str]) -> str:
    """The model's view over the log: today's view with its state read consolidated."""
    view = emit.view_query(plan, state, version)
    table = view.find(exp.Table)
    table.replace(consolidated(plan, table.copy(), types).subquery("__ivm_log"))
    return view.sql(dialect=DIALECT)


def except_all(one: str, other: str) -> str:
    parsed = [sqlglot.parse_one(sql, read=DIALECT) for sql in (one, other)]
    return exp.except_(*parsed, distinct=False).sql(dialect=DIALECT)


def timed(spark, metrics, statement: str, collect: bool = False):
    mark = metrics.mark()
    started = time.monotonic()
    frame = spark.sql(statement)
    rows = frame.collect() if collect else None
    seconds = time.monotonic() - started
    return seconds, metrics.since(mark).jobs, rows


def main() -> None:
    spark, _ = start_session(WORK / "runtime", (("spark.driver.memory", "10g"),))
    spark.sparkContext.setLogLevel("ERROR")
    metrics = SparkMetrics(spark)
    data = generate(1, WORK / "data" / "sf1")
    planner = BatchPlanner()
    for _ in range(SKIP_BATCHES):
        planner.next_batch("rf", 0.1)
    schema = exp.Create(this=exp.Table(this=exp.to_identifier(SCHEMA)), kind="SCHEMA", exists=True)
    spark.sql(schema.sql(dialect=DIALECT))
    catalog = Catalog(spark)
    plans = {}
    for name in MODELS:
        plans[name] = compile_model(name, model_sql(name), catalog, {})
    tables = sorted({t for plan in plans.values() for t in plan.tables}, key=str)
    versions = {t: latest_version(spark, t.db, t.name) for t in tables}
    states = {}
    for name, plan in plans.items():
        merge_state = TableName(db=SCHEMA, name=f"{name}_merge")
        log_state = TableName(db=SCHEMA, name=f"{name}_log")
        for state in (merge_state, log_state):
            spark.sql(emit.create_state(plan, state, versions, guard="g0", change_feed=False))
        types = {f.name: f.dataType.simpleString() for f in spark.table(log_state.sql()).schema}
        states[name] = (merge_state, log_state, types)
    times: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for batch_number in range(1, BATCHES + 1):
        batch = planner.next_batch("rf", 0.1)
        apply_batch(spark, data, SOURCES, batch)
        after = {t: latest_version(spark, t.db, t.name) for t in tables}
        for name, plan in plans.items():
            merge_state, log_state, types = states[name]
            ranges = {t: VersionRange(versions[t], after[t]) for t in plan.tables}
            guard = emit.Guard(read=f"g{batch_number - 1}", write=f"g{batch_number}")
            merge_sql = emit.merge_changes(plan, merge_state, ranges, guard)
            change = view_class_rule(plan.view_class).change_query(
                plan, ranges, merge_state, None, None
            )
            columns = state_rows.state_table_columns(plan)
            rows = (
                exp.select(*(exp.column(c, quoted=True) for c in columns))
                .select(exp.alias_(exp.cast(exp.null(), "STRING"), GUARD, quoted=True))
                .from_(change.subquery("__ivm_change"))
            )
            append_sql = exp.insert(rows, log_state.to_table()).sql(dialect=DIALECT)
            model_sql_now = emit.model_query(plan, after)
            rebuilt = TableName(db=SCHEMA, name=f"{name}_table")
            table_sql = create_delta_table(
                rebuilt, {}, sqlglot.parse_one(model_sql_now, read=DIALECT)
            ).sql(dialect=DIALECT)
            # Alternate which form goes first, so neither always reads a warmer cache.
            steps = [("merge", merge_sql, False), ("append", append_sql, True)]
            if batch_number % 2 == 0:
                steps.reverse()
            for form, statement, idempotent in steps + [("table", table_sql, False)]:
                if idempotent:
                    spark.conf.set("spark.databricks.delta.write.txnAppId", f"{log_state}:{RUN}")
                    spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_number))
                try:
                    seconds, jobs, _ = timed(spark, metrics, statement)
                finally:
                    spark.conf.unset("spark.databricks.delta.write.txnAppId")
                    spark.conf.unset("spark.databricks.delta.write.txnVersion")
                times.setdefault((name, form), []).append((seconds, jobs))
            merge_version = latest_version(spark, merge_state.db, merge_state.name)
            log_version = latest_version(spark, log_state.db, log_state.name)
            merged_view = emit.view_query(plan, merge_state, merge_version).sql(dialect=DIALECT)
            logged_view = log_view(plan, log_state, log_version, types)
            for form, view in (("read merge", merged_view), ("read append", logged_view)):
                seconds, jobs, _ = timed(spark, metrics, view, collect=True)
                times.setdefault((name, form), []).append((seconds, jobs))
            for one, other in (
                (merged_view, model_sql_now),
                (logged_view, merged_view),
            ):
                differ = sum(
                    spark.sql(except_all(a, b)).count() for a, b in ((one, other), (other, one))
                )
                assert differ == 0, f"{name}, batch {batch_number}: {differ} rows differ"
            log_rows = spark.table(log_state.sql()).count()
            print(f"{name} batch {batch_number}: log rows {log_rows}", flush=True)
        versions = after
    # An append run again with the same transaction version writes nothing.
    name = MODELS[0]
    _, log_state, types = states[name]
    before = latest_version(spark, log_state.db, log_state.name)
    spark.conf.set("spark.databricks.delta.write.txnAppId", f"{log_state}:{RUN}")
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(BATCHES))
    again = exp.select("*").from_(log_state.to_table()).limit(1)
    spark.sql(exp.insert(again, log_state.to_table()).sql(dialect=DIALECT))
    spark.conf.unset("spark.databricks.delta.write.txnAppId")
    spark.conf.unset("spark.databricks.delta.write.txnVersion")
    skipped = latest_version(spark, log_state.db, log_state.name) == before
    print(f"a repeated transaction version appends nothing: {skipped}")
    for name, plan in plans.items():
        _, log_state, types = states[name]
        rows = consolidated(plan, log_state.to_table(), types)
        compact = exp.insert(rows, log_state.to_table(), overwrite=True).sql(dialect=DIALECT)
        seconds, jobs, _ = timed(spark, metrics, compact)
        times.setdefault((name, "compact"), []).append((seconds, jobs))
    print()
    print("| model | step | median s | Spark jobs | runs |")
    print("|---|---|---:|---:|---:|")
    for (name, form), values in times.items():
        seconds = statistics.median(v[0] for v in values)
        jobs = statistics.median(v[1] for v in values)
        print(f"| {name} | {form} | {seconds:.2f} | {jobs:g} | {len(values)} |")


if __name__ == "__main__":
    main()
