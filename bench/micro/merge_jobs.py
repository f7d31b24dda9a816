"""The Spark jobs of one guarded MERGE into a small state, by what Delta says they do (issue 20).

The guarded MERGE of `small_state.py` (as `write_forms.py` times it), its
three-row change into a state of 1,000 rows, REPS times; prints each
MERGE's seconds and job count, and the jobs of the last one grouped by
their description. Extra arguments are session confs (`key=value`) to
compare, set before the state is created.

    REPS=8 PYTHONPATH=bench .venv/bin/python bench/micro/merge_jobs.py
    PYTHONPATH=bench .venv/bin/python bench/micro/merge_jobs.py \\
        spark.databricks.delta.allFilesInCrc.enabled=true

Measured 2026-11-30: 13 jobs each MERGE: "materialize source" 2, "scanning
files for matches: Compute snapshot for version" 3 (the new version's file
list, rebuilt from the log), "scanning files for matches" 5, "Writing
modified data" 3; the same 13 with allFilesInCrc and with data skipping off.
"""

import collections
import os
import re
import statistics
import sys
import time
from pathlib import Path

from micro.small_state import CHANGE_VIEW, CREATE_STATE, GUARDED_MERGE
from tpch_bench.spark_session import start_session

WORK = Path(__file__).resolve().parents[1] / "work" / "micro"
REPS = int(os.environ.get("REPS", "8"))
confs = tuple(tuple(arg.split("=", 1)) for arg in sys.argv[1:])
spark, _ = start_session(WORK, confs)
store = spark._jsparkSession.sparkContext().statusStore()


def jobs() -> dict[int, str]:
    listed = store.jobsList(None)
    found = {}
    for index in range(listed.size()):
        job = listed.apply(index)
        described = job.description()
        found[job.jobId()] = str(described.get()) if described.isDefined() else str(job.name())
    return found


spark.sql("CREATE SCHEMA IF NOT EXISTS s")
spark.sql(CHANGE_VIEW)
spark.sql("DROP TABLE IF EXISTS s.state")
spark.sql(CREATE_STATE, args={"n": 1000})


def merge(round_: int) -> None:
    spark.sql(GUARDED_MERGE, args={"r": f"g{round_}", "w": f"g{round_ + 1}"}).collect()


seconds, counts, kinds = [], [], collections.Counter[str]()
for round_ in range(REPS):
    before = set(jobs())
    started = time.perf_counter()
    merge(round_)
    seconds.append(time.perf_counter() - started)
    new = {job: text for job, text in jobs().items() if job not in before}
    counts.append(len(new))
    if round_ == REPS - 1:
        # "... Compute snapshot for version: 7": one kind whatever the version.
        kinds.update(re.sub(r" for version: \d+$", "", text) for text in new.values())
print(
    f"confs {dict(confs) or 'none'}: median {statistics.median(seconds[1:]):.2f} s, jobs {counts}"
)
for kind, count in kinds.most_common():
    print(f"  {count}  {kind}")
