"""MIN/MAX's kept values built two ways, alone on the machine (issue 54, item 6).

A bounded MIN or MAX keeps each group's best 16 distinct values with their
counts (ivm_compiler/rules/extremes.py). A first build, a recompute and a
refill compute them from the rows; two forms, the same rows:

- `ranked`: every row ranked (DENSE_RANK per group), the best kept, then
  counted per (group, value): the form before 2026-12-05, chosen when
  Spark's WindowGroupLimit cut each task's rows ahead of the shuffle;
- `counted`: the rows counted per (group, value) first, a hash aggregate
  partial ahead of its shuffle, then the distinct values ranked
  (ROW_NUMBER) and the best kept: the form extremes._best_rows builds now.

For each value column, the MIN side and the MAX side, as the build's UNION
ALL has them. Each form runs `--rounds` times, alternating, written to
Spark's `noop` sink (the work without the Delta write); the first round
warms the JVM. Both must give the same rows (count and hash sum).

    cd bench && PYTHONPATH=. ../.venv/bin/python micro/extremes_build.py --runtime work/runtime \\
        --table tpch_sf1.lineitem --group l_suppkey --values l_shipdate l_discount
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sqlglot import exp
from tpch_bench.spark_session import start_session

from ivm_compiler.sql import DIALECT, ident

KEPT = 16
ROWS = "bench_rows"


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _not_null(value: str) -> exp.Expr:
    return exp.Not(this=exp.Is(this=_column(value), expression=exp.Null()))


def _rank(function: exp.Expr, group: list[str], value: str, desc: bool) -> exp.Window:
    return exp.Window(
        this=function,
        partition_by=[_column(g) for g in group] or None,
        order=exp.Order(expressions=[exp.Ordered(this=_column(value), desc=desc)]),
    )


def ranked(group: list[str], value: str, desc: bool) -> exp.Select:
    rows = (
        exp.select(
            *[_column(g) for g in group],
            _column(value),
            exp.alias_(_rank(exp.DenseRank(), group, value, desc), "r"),
        )
        .from_(ROWS)
        .where(_not_null(value))
    )
    return (
        exp.select(
            *[_column(g) for g in group],
            exp.alias_(exp.Count(this=exp.Star()), "n"),
            exp.alias_(exp.cast(_column(value), "STRING"), "v"),
        )
        .from_(rows.subquery("ranked"))
        .where("r <= " + str(KEPT))
        .group_by(*[_column(g) for g in group], _column(value))
    )


def counted(group: list[str], value: str, desc: bool) -> exp.Select:
    values = (
        exp.select(
            *[_column(g) for g in group],
            _column(value),
            exp.alias_(exp.Count(this=exp.Star()), "n"),
        )
        .from_(ROWS)
        .where(_not_null(value))
        .group_by(*[_column(g) for g in group], _column(value))
    )
    ranked_values = exp.select(
        *[_column(g) for g in group],
        _column(value),
        exp.column("n"),
        exp.alias_(_rank(exp.RowNumber(), group, value, desc), "r"),
    ).from_(values.subquery("counted"))
    return (
        exp.select(
            *[_column(g) for g in group],
            exp.column("n"),
            exp.alias_(exp.cast(_column(value), "STRING"), "v"),
        )
        .from_(ranked_values.subquery("ranked"))
        .where("r <= " + str(KEPT))
    )


def query(form, table: str, group: list[str], values: list[str]) -> str:
    parts = [form(group, v, desc) for v in values for desc in (False, True)]
    union = parts[0]
    for part in parts[1:]:
        union = exp.union(union, part, distinct=False)
    rows = exp.select(*[_column(c) for c in [*group, *values]]).from_(
        exp.to_table(table, dialect=DIALECT)
    )
    return exp.select("*").from_(union.subquery(ident("kept"))).with_(ROWS, as_=rows).sql(DIALECT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", required=True, help="the embedded runtime's directory")
    parser.add_argument("--table", required=True)
    parser.add_argument("--group", nargs="*", default=[])
    parser.add_argument("--values", nargs="+", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    spark, _ = start_session(Path(args.runtime))

    forms = {
        name: query(form, args.table, args.group, args.values)
        for name, form in (("ranked", ranked), ("counted", counted))
    }
    answers = {
        name: tuple(spark.sql(f"SELECT COUNT(*), SUM(HASH(*)) FROM ({sql})").collect()[0])
        for name, sql in forms.items()
    }
    if len(set(answers.values())) != 1:
        raise SystemExit(f"the forms differ: {answers}")
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for round_number in range(args.rounds):
        for name, sql in forms.items():
            started = time.monotonic()
            spark.sql(sql).write.format("noop").mode("overwrite").save()
            seconds[name].append(time.monotonic() - started)
            print(f"round {round_number + 1} {name}: {seconds[name][-1]:.2f} s", flush=True)
    rows = answers["counted"][0]
    print(
        f"{args.table} per {', '.join(args.group) or '(one group)'}, "
        f"{', '.join(args.values)}: {rows:,} kept rows, the same in both forms"
    )
    for name, times in seconds.items():
        warm = times[1:] or times
        print(f"  {name}: median {statistics.median(warm):.2f} s of rounds 2-{len(times)}")


if __name__ == "__main__":
    main()
