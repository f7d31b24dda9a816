"""A MIN and a MAX of one argument built from one ranking, against one ranking each (issue 54).

A model with MIN(x) and MAX(x) keeps, per group, its 16 smallest and its
16 largest distinct values of x (ivm_compiler/rules/extremes.py). Its build
ranks each group's distinct values twice, ascending for MIN and
descending for MAX, and joins the two arrays. Ranked once ascending
beside each group's number of distinct values, the largest are those
whose rank is within 16 of that number, so one sort serves both:

- `pair`: two windows, one per side, joined by group (the build's form before 2026-12-06);
- `shared`: one window and a count per group, both arrays collected from it.

Both must give the same rows (count and hash sum); each form runs ROUNDS
times, alternating, over a loaded TPC-H lineitem (l_suppkey, l_shipdate).

    cd bench && PYTHONPATH=. ../.venv/bin/python micro/extremes_pair_build.py \\
        --runtime /tmp/benchwork/runtime --table tpch_sf5.lineitem

Measured 2026-12-06 at SF 5 (30 M lineitems, 50,000 suppliers), alone,
8 shuffle partitions, two runs of two rounds: pair 79.97, 58.03, 77.25 and
63.92 s; shared 44.20, 40.25, 42.62 and 43.99 s; the same rows. The
build's form from 2026-12-06 on (rules/extremes.py, `_kept_per_group`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

KEPT = 16
ROUNDS = 2


def kept(counted: str, descending: bool) -> str:
    order = "DESC" if descending else "ASC"
    ranked = (
        f"SELECT g, v, n, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v {order}) AS r "
        f"FROM ({counted})"
    )
    return (
        "SELECT g, ARRAY_SORT(COLLECT_LIST(STRUCT(v AS v, n AS n))) AS kv "
        f"FROM ({ranked}) WHERE r <= {KEPT} GROUP BY g"
    )


def forms(table: str) -> dict[str, str]:
    counted = f"SELECT l_suppkey AS g, l_shipdate AS v, COUNT(*) AS n FROM {table} GROUP BY 1, 2"
    ranked = (
        "SELECT g, v, n, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v) AS r, "
        f"COUNT(*) OVER (PARTITION BY g) AS t FROM ({counted})"
    )
    return {
        "pair": (
            f"SELECT a.g, a.kv AS lo, b.kv AS hi FROM ({kept(counted, False)}) a "
            f"JOIN ({kept(counted, True)}) b ON a.g = b.g"
        ),
        "shared": (
            f"SELECT g, ARRAY_SORT(COLLECT_LIST(IF(r <= {KEPT}, STRUCT(v AS v, n AS n), NULL))) AS lo, "
            f"ARRAY_SORT(COLLECT_LIST(IF(t - r < {KEPT}, STRUCT(v AS v, n AS n), NULL))) AS hi "
            f"FROM ({ranked}) WHERE r <= {KEPT} OR t - r < {KEPT} GROUP BY g"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runtime", type=Path, required=True)
    parser.add_argument("--table", required=True)
    args = parser.parse_args()
    spark, _ = start_session(args.runtime)
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    answers: dict[str, set] = {}
    for round_ in range(ROUNDS):
        for name, query in forms(args.table).items():
            started = time.monotonic()
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW kept_values AS {query}")
            answer = spark.sql("SELECT COUNT(*), SUM(hash(*)) FROM kept_values").first()
            print(f"round {round_} {name:6s} {time.monotonic() - started:7.2f} s {tuple(answer)}")
            answers.setdefault(name, set()).add(tuple(answer))
    if len({a for found in answers.values() for a in found}) != 1:
        raise SystemExit(f"the forms' rows differ: {answers}")


if __name__ == "__main__":
    main()
