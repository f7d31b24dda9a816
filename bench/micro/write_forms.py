"""Write forms for a small state, timed alone (issue 20 item 3).

The guarded MERGE as emit.merge_changes shapes it (a guard source row, a
DELETE clause, an UPDATE, an INSERT and the stale-guard clause), the same
MERGE under merge.materializeSource=none, and one INSERT OVERWRITE of the
state FULL JOIN the change with the guard row checked and moved. Each
applies the same three-row change (one group updated, one emptied, one
new) to a state of SIZES rows, in alternation, REPS rounds after one warm
round; prints the median seconds and Spark jobs of each.

    REPS=8 SIZES=1,1000 PYTHONPATH=bench .venv/bin/python bench/micro/write_forms.py

The embedded runtime's configs, a JVM of its own, data in bench/work/micro.
"""

import os
import statistics
import time
from pathlib import Path

from micro.small_state import CHANGE_VIEW, CREATE_STATE, GUARDED_MERGE
from tpch_bench.spark_session import start_session

WORK = Path(__file__).resolve().parents[1] / "work" / "micro"
spark, _ = start_session(WORK)
sc = spark.sparkContext
st = sc.statusTracker()
REPS = int(os.environ.get("REPS", "8"))
spark.sql("create schema if not exists s")
# A change of three rows: one key updated, one emptied (its count goes to 0), one new.
spark.sql(CHANGE_VIEW)


def setup(n):
    spark.sql("drop table if exists s.state")
    spark.sql(CREATE_STATE, args={"n": n})


gid = [0]


def ids():
    r, w = f"g{gid[0]}", f"g{gid[0] + 1}"
    gid[0] += 1
    return r, w


def merge(conf=None):
    r, w = ids()
    if conf:
        spark.conf.set("spark.databricks.delta.merge.materializeSource", conf)
    spark.sql(GUARDED_MERGE, args={"r": r, "w": w}).collect()
    if conf:
        spark.conf.unset("spark.databricks.delta.merge.materializeSource")


def merge_none():
    merge("none")


def overwrite():
    r, w = ids()
    spark.sql(
        """insert overwrite s.state
    select coalesce(t.k, c.k) as k, coalesce(t.cnt, 0) + coalesce(c.cnt, 0) as cnt,
      coalesce(t.total, 0) + coalesce(c.total, 0) as total, cast(null as string) as g
    from (select k, cnt, total from s.state where g is null) t full outer join chg c on t.k <=> c.k
    where coalesce(t.cnt, 0) + coalesce(c.cnt, 0) <> 0
    union all
    select null, null, null, if(max(g) = :r, :w, raise_error('guard')) from s.state where g is not null""",
        args={"r": r, "w": w},
    ).collect()


forms = [merge, merge_none, overwrite]
for n in [int(x) for x in os.environ.get("SIZES", "1,1000").split(",")]:
    setup(n)
    times = {f.__name__: [] for f in forms}
    jobs = {f.__name__: [] for f in forms}
    for f in forms:
        f()  # warm
    for i in range(REPS):
        for f in forms:
            group = f"{f.__name__}-{n}-{i}"
            sc.setJobGroup(group, group)
            t = time.monotonic()
            f()
            times[f.__name__].append(time.monotonic() - t)
            jobs[f.__name__].append(len(st.getJobIdsForGroup(group)))
    rows = spark.sql("select count(*) from s.state").collect()[0][0]
    for name, taken in times.items():
        print(
            f"state {n:>7} rows (now {rows}): {name:10s} median {statistics.median(taken):.2f} s "
            f"[{min(taken):.2f}-{max(taken):.2f}], jobs {statistics.median(jobs[name]):.0f}",
            flush=True,
        )
