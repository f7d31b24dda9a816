"""How much of a refresh statement's planning is Spark's constraint propagation (issue 54).

A refresh statement carries its change's keys as literals, often thousands
of them, in several places of one plan (the join terms' `IN` lists, the
MERGE's bounds). Spark's optimizer propagates each operator's constraints
up the plan and infers filters from them (InferFiltersFromConstraints),
copying and comparing those lists as it goes. This replays the longest
statements of a warehouse run's dbt log, each's query (a MERGE's source, an
INSERT's rows) planned by `EXPLAIN`, with `spark.sql.constraintPropagation.enabled`
on and off in turn, against the tables that run left behind.

    cd bench && PYTHONPATH=. ../.venv/bin/python micro/plan_constraints.py \\
        --runtime <clone>/integration_tests/warehouse/<runtime dir> \\
        --log <clone>/integration_tests/warehouse/logs/dbt.log --top 20

Statements reading a stage (a temporary view of the refresh that wrote
them) cannot be planned outside it and are skipped: on the warehouse that
is every change statement carrying thousands of listed keys, so this
measures the others only (bench/results/issue54/plan-constraints-c563a2f.txt:
no difference, 2.16 s against 2.11 s for ten statements).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import sqlglot
from sqlglot import exp
from tpch_bench.spark_session import start_session

CONF = "spark.sql.constraintPropagation.enabled"
ROUNDS = 3

_START = re.compile(r"\[(Thread-\d+|MainThread)\s*\]: On (model\.[\w.]+):")
_STATUS = re.compile(r"\[(Thread-\d+|MainThread)\s*\]: SQL status: \w+ in ([\d.]+) seconds")


def logged_statements(log: Path) -> list[tuple[float, str, str]]:
    """(seconds, model, statement) of each statement the log times, paired per thread."""
    lines = log.read_text(errors="replace").split("\n")
    open_: dict[str, tuple[str, str]] = {}
    found = []
    for i, line in enumerate(lines):
        started = _START.search(line)
        if started:
            open_[started.group(1)] = (started.group(2), lines[i + 1] if i + 1 < len(lines) else "")
            continue
        ended = _STATUS.search(line)
        if ended and ended.group(1) in open_:
            model, text = open_.pop(ended.group(1))
            found.append((float(ended.group(2)), model.split(".")[-1], text))
    return found


def query_of(statement: str) -> str | None:
    """The statement's query: a MERGE's source, an INSERT's rows (with its CTEs)."""
    if "__ivm_staged_" in statement:
        return None
    if not statement.startswith(("MERGE INTO", "WITH")):
        return None
    tree = sqlglot.parse_one(statement, read="spark")
    if isinstance(tree, exp.Merge):
        source = tree.args["using"]
        query = source.this if isinstance(source, exp.Subquery) else source
    elif isinstance(tree, exp.Insert):
        query = tree.expression
        if tree.args.get("with_"):
            query = query.copy()
            query.set("with_", tree.args["with_"])
    else:
        return None
    return query.sql(dialect="spark")


def planned(spark, query: str, propagate: bool) -> float:
    spark.conf.set(CONF, "true" if propagate else "false")
    started = time.monotonic()
    spark.sql(f"EXPLAIN {query}").collect()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtime", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    chosen = []
    for seconds, model, statement in sorted(logged_statements(args.log), reverse=True):
        query = query_of(statement)
        if query is not None:
            chosen.append((seconds, model, statement[:40], query))
        if len(chosen) == args.top:
            break
    spark, _ = start_session(args.runtime)
    # Warm the planner on the first statement, both ways, untimed.
    for propagate in (True, False):
        planned(spark, chosen[0][3], propagate)
    totals = {True: 0.0, False: 0.0}
    for seconds, model, head, query in chosen:
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(ROUNDS):
            for propagate in (True, False) if round_ % 2 == 0 else (False, True):
                times[propagate].append(planned(spark, query, propagate))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        totals[True] += on
        totals[False] += off
        literals = query.count(",")
        print(
            f"{model:32} {head:40} ran {seconds:6.2f} s  planned {on:6.3f} s with, "
            f"{off:6.3f} s without  ({literals} commas)",
            flush=True,
        )
    print(f"total planning: {totals[True]:.2f} s with, {totals[False]:.2f} s without")


if __name__ == "__main__":
    main()
