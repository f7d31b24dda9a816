"""MIN/MAX's bounded pre-aggregation as one array per group, against the state as it is (issue 20).

A design study, not the adapter's code. `lineitem_supplier_extremes` keeps,
per supplier and per bounded MIN or MAX, its best 16 to 32 values as rows
of the state (ivm_compiler/rules/extremes.py): 440,001 rows at SF 1, and a
refresh reads the touched groups' rows with a window per pre-aggregation,
then MERGEs the changed ones. Kept instead as one array of (value, count)
per group and pre-aggregation on the group row, the state has a row per
group, and the change is one aggregate of the feed joined to the touched
group rows, merged with map functions, no window.

The script replays one refresh logged by the benchmark both ways, on
copies of the state as it was before that refresh, in one session:

- `rows`: the logged statements themselves (the staged feed, the change
  query's rows, the guarded MERGE), under the logged settings;
- `arrays`: the same feed, then the array form's change and MERGE into an
  array state built from the same rows (its build is not timed: it
  stands for the first build, which would rank the values as now).

After each `arrays` refresh it checks every group's count, MINs and MAXes
against the state the logged refresh wrote; a difference fails the run.

    cd bench && ../.venv/bin/python -m tpch_bench --scale 1 --kinds rf \\
        --sizes 0.1 --repetitions 1 --models lineitem_supplier_extremes \\
        --dbt-log-level-file debug --results-dir /tmp/probe --label mm
    grep -n "running node model.tpch_bench.lineitem_supplier_extremes_ivm" \\
        work/dbt/logs/dbt.log | tail -2      # the last refresh's first and last line
    PYTHONPATH=. ../.venv/bin/python micro/extremes_arrays.py work/dbt/logs/dbt.log FIRST LAST

Measured 2026-12-02 (0.1 % RF batches; a refresh each of the two logged,
three rounds, the median of the last two given):
  SF 1 (15,046 change rows, 1 shuffle partition):  rows 9.75 s, arrays 4.93 s;
       the state 440,001 rows as rows, 10,000 as arrays
  SF 5 (75,259 change rows, 2 shuffle partitions): rows 24.46 s, arrays 11.31 s;
       the state 2,200,001 rows as rows, 50,000 as arrays
In both the arrays' groups equalled the logged refresh's, none ran out;
of the arrays' time, the MERGE into a row per group took 2.2 s at SF 1
and 3.6-4.4 s at SF 5. The rebuilds of the same runs: 3.2 s and 5.5 s.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from micro.replay_refresh import (
    BASE_SETTINGS,
    COPY,
    RUNTIME,
    Replay,
    cached_names,
    drop_cached,
    logged_partitions,
    logged_statements,
    timed,
)
from tpch_bench.spark_session import start_session

REPS = 3
KEPT = 16
# (array column, the state's slot and value column, the argument's change column, max first)
PREAGGREGATIONS = (
    ("kv_a0_min", 1, "__ivm_pv_a0_min", "__ivm_arg0", False),
    ("kv_a0_max", 2, "__ivm_pv_a0_max", "__ivm_arg0", True),
    ("kv_a1_max", 3, "__ivm_pv_a1_max", "__ivm_arg1", True),
)
VALUE_TYPES = {"__ivm_arg0": "DATE", "__ivm_arg1": "DECIMAL(15,2)"}
NON_NULL = {"__ivm_arg0": "__ivm_nn_a0", "__ivm_arg1": "__ivm_nn_a1"}
DESCENDING = "(a, b) -> CASE WHEN a.{f} > b.{f} THEN -1 WHEN a.{f} < b.{f} THEN 1 ELSE 0 END"


def sorted_array(entries: str, field: str, descending: bool) -> str:
    return (
        f"array_sort({entries}, {DESCENDING.format(f=field)})"
        if descending
        else (f"array_sort({entries})")
    )


def array_state(state: str) -> str:
    """The array form of a rows-form state: its group rows, each pre-aggregation collected."""
    joins = []
    for column, slot, value, _, descending in PREAGGREGATIONS:
        entries = sorted_array(
            f"collect_list(struct({value} AS v, __ivm_count AS n))", "v", descending
        )
        joins.append(
            f"LEFT JOIN (SELECT __ivm_g0, {entries} AS {column} FROM {state} "
            f"WHERE __ivm_slot = {slot} GROUP BY __ivm_g0) USING (__ivm_g0)"
        )
    columns = ", ".join(c for c, *_ in PREAGGREGATIONS)
    return (
        "CREATE OR REPLACE TABLE exp.arrays USING delta AS SELECT __ivm_g0, __ivm_count, "
        f"__ivm_nn_a0, __ivm_nn_a1, __ivm_min_a0, __ivm_max_a0, __ivm_max_a1, {columns} "
        f"FROM (SELECT * FROM {state} WHERE __ivm_slot = 0 AND __ivm_guard IS NULL) "
        + " ".join(joins)
    )


def kept_after(column: str, argument: str, descending: bool) -> str:
    """A group's kept (value, count) array after the change, as extremes.py keeps it.

    A value stays or comes in when it still has rows and was kept, or the
    group's kept values were all of its values, or it lies on the kept
    side of the edge (the last kept value); past 2 * KEPT it is cut to KEPT.
    """
    value_type = VALUE_TYPES[argument]
    empty = f"CAST(map() AS MAP<{value_type}, BIGINT>)"
    stored = f"COALESCE(map_from_entries({column}), {empty})"
    merged = f"map_zip_with({stored}, COALESCE(d_{column}, {empty}), (k, a, b) -> COALESCE(a, 0) + COALESCE(b, 0))"
    total = f"aggregate(COALESCE({column}, array()), 0L, (acc, x) -> acc + x.n)"
    all_kept = f"({total} = COALESCE(nn_{argument}, 0))"
    edge = f"element_at({column}, -1).v"
    kept_side = f"k > {edge}" if descending else f"k < {edge}"
    keeps = f"n > 0 AND (element_at({stored}, k) IS NOT NULL OR {all_kept} OR {kept_side})"
    entries = sorted_array(
        f"map_entries(map_filter({merged}, (k, n) -> {keeps}))", "key", descending
    )
    kept = f"transform({entries}, e -> struct(e.key AS v, e.value AS n))"
    return f"IF(size({kept}) > {2 * KEPT}, slice({kept}, 1, {KEPT}), {kept})"


def array_change(feed: str) -> str:
    """The touched groups' new rows: additive counts summed, arrays merged with the change."""
    deltas = []
    for column, _, _, argument, _ in PREAGGREGATIONS:
        deltas.append(
            f"LEFT JOIN (SELECT __ivm_g0, map_from_entries(collect_list(struct(v, n))) AS d_{column} "
            f"FROM (SELECT __ivm_g0, {argument} AS v, SUM(__ivm_sign) AS n FROM {feed} "
            f"WHERE {argument} IS NOT NULL GROUP BY 1, 2 HAVING SUM(__ivm_sign) <> 0) "
            "GROUP BY __ivm_g0) USING (__ivm_g0)"
        )
    arrays = ", ".join(f"{kept_after(c, a, d)} AS {c}" for c, _, _, a, d in PREAGGREGATIONS)
    extremes = ", ".join(
        f"element_at({c}, 1).v AS {name}"
        for (c, *_), name in zip(PREAGGREGATIONS, ("__ivm_min_a0", "__ivm_max_a0", "__ivm_max_a1"))
    )
    return f"""CACHE TABLE exp_array_rows AS
      WITH m AS (SELECT __ivm_g0, SUM(__ivm_sign) AS dc,
                        SUM(IF(__ivm_arg0 IS NOT NULL, __ivm_sign, 0)) AS dn0,
                        SUM(IF(__ivm_arg1 IS NOT NULL, __ivm_sign, 0)) AS dn1
                 FROM {feed} GROUP BY 1),
      t AS (SELECT * FROM m {" ".join(deltas)}),
      j AS (SELECT t.*, s.__ivm_count AS c, s.__ivm_nn_a0 AS nn___ivm_arg0,
                   s.__ivm_nn_a1 AS nn___ivm_arg1, s.kv_a0_min, s.kv_a0_max, s.kv_a1_max
            FROM t LEFT JOIN exp.arrays s ON s.__ivm_g0 = t.__ivm_g0),
      n AS (SELECT __ivm_g0, COALESCE(c, 0) + dc AS __ivm_count,
                   COALESCE(nn___ivm_arg0, 0) + dn0 AS __ivm_nn_a0,
                   COALESCE(nn___ivm_arg1, 0) + dn1 AS __ivm_nn_a1, {arrays} FROM j)
      SELECT __ivm_g0, __ivm_count, __ivm_nn_a0, __ivm_nn_a1, {extremes},
             kv_a0_min, kv_a0_max, kv_a1_max FROM n"""


ARRAY_MERGE = (
    "MERGE INTO exp.arrays t USING exp_array_rows d ON t.__ivm_g0 = d.__ivm_g0 "
    "WHEN MATCHED AND d.__ivm_count = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
    "WHEN NOT MATCHED THEN INSERT *"
)
# A group whose kept values ran out while it still has some: the adapter reads
# those from the sources (extremes.py's refill); the study only counts them.
RAN_OUT = (
    "SELECT COUNT(*) FROM exp_array_rows WHERE (size(kv_a0_min) = 0 AND __ivm_nn_a0 > 0) "
    "OR (size(kv_a0_max) = 0 AND __ivm_nn_a0 > 0) OR (size(kv_a1_max) = 0 AND __ivm_nn_a1 > 0)"
)


def main(log: Path, first: int, last: int) -> None:
    spark, _ = start_session(RUNTIME)
    replay = Replay(spark, logged_statements(log, first, last))
    feed = cached_names(replay.statements)[0]
    settings = {**BASE_SETTINGS, **logged_partitions(log, first, last)}
    for key, value in settings.items():
        spark.conf.set(key, value)

    print(f"{replay.target}: the MERGE of version {replay.version}; settings {settings}")
    totals: dict[str, list[float]] = {"rows": [], "arrays": []}
    for rep in range(REPS):
        seconds = replay.run(replay.copy_state())
        totals["rows"].append(sum(seconds))
        print(
            f"rep {rep} rows:   "
            + ", ".join(f"{t:.2f}" for t in seconds)
            + f" = {sum(seconds):.2f} s"
        )

        replay.copy_state()
        spark.sql(array_state(COPY)).collect()
        seconds = [timed(spark, q) for q in (replay.statements[0], array_change(feed), ARRAY_MERGE)]
        ran_out = spark.sql(RAN_OUT).first()[0]
        drop_cached(spark, ["exp_array_rows", feed])
        totals["arrays"].append(sum(seconds))
        differing = spark.sql(
            "SELECT COUNT(*) FROM (SELECT __ivm_g0, __ivm_count, __ivm_min_a0, __ivm_max_a0, "
            "__ivm_max_a1 FROM exp.arrays EXCEPT ALL SELECT __ivm_g0, __ivm_count, __ivm_min_a0, "
            f"__ivm_max_a0, __ivm_max_a1 FROM {replay.target} VERSION AS OF {replay.version} "
            "WHERE __ivm_slot = 0 AND __ivm_guard IS NULL)"
        ).first()[0]
        print(
            f"rep {rep} arrays: "
            + ", ".join(f"{t:.2f}" for t in seconds)
            + f" = {sum(seconds):.2f} s"
            f" ({ran_out} groups ran out, {differing} groups differ from the logged refresh's)"
        )
        if differing:
            sys.exit("the array form's result differs from the logged refresh's")
    rows = spark.table(COPY).count()
    arrays = spark.table("exp.arrays").count()
    print(
        f"state rows: {rows:,} as rows, {arrays:,} as arrays; median of reps 2-{REPS}: "
        f"rows {statistics.median(totals['rows'][1:]):.2f} s, "
        f"arrays {statistics.median(totals['arrays'][1:]):.2f} s"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
