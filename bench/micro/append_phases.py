"""Where a logged append's seconds go: planning the change, running it, committing it (issue 20).

A single-source model kept as a log refreshes with one `INSERT` of its
aggregated change (Q1, Q6), and its refresh at SF 5 still takes 1.2-1.5 s
where issue 20's ratios ask for about 1 s. This script takes that `INSERT`
from a benchmark's dbt debug log (the refresh between log lines FIRST and
LAST), copies the state it wrote to, and times, ROUNDS times over:

- `feed`: a count of each change feed the statement reads, alone;
- the change query (the `INSERT`'s rows, collected) phase by phase: parsed
  and analyzed (Delta resolves the feed's versions), optimized, physically
  planned (the feed's file lists, read from the commits), then run;
- the `INSERT` into the copy;
- a one-row `INSERT` into the copy: a Delta append's own cost.

Each line also gives the Spark jobs the statement ran and their seconds.
The first round warms the JVM; compare the later ones.

    cd bench && ../.venv/bin/python -m tpch_bench --scale 5 --kinds rf \\
        --sizes 0.1 --repetitions 2 --models q01_pricing_summary \\
        --dbt-log-level-file debug --results-dir /tmp/probe --label probe
    grep -n "running node model.tpch_bench.q01_pricing_summary_ivm" \\
        work/dbt/logs/dbt.log | tail -2      # the last refresh's first and last line
    PYTHONPATH=. ../.venv/bin/python micro/append_phases.py work/dbt/logs/dbt.log FIRST LAST

Measured 2026-12-02 (`1ed995c`), Q1's refresh at SF 5 after a 0.1 % RF
batch (60,007 change rows in two commits; the logged refresh 2.06 s, its
`INSERT` 1.29 s), the two warm rounds: the feed alone 0.33-0.35 s (its job
0.07 s); the change query 0.75-0.95 s, of which analysis 0.11-0.14 s,
optimization 0.04-0.05 s, physical planning 0.27-0.28 s and the run
0.33-0.48 s (its job 0.23-0.38 s); the `INSERT` 1.26-1.32 s (its job
0.45-0.48 s); a one-row `INSERT` 0.34-0.43 s (its job 0.08-0.11 s). An
earlier probe the same day ran the change query without generated code:
its run took longer (0.38-0.50 s without whole-stage code, 0.62-0.95 s
without any). So about 0.4 s is Delta planning a change-feed read and
0.3-0.4 s committing an append, beside a job of a third of a second.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from micro.replay_refresh import BASE_SETTINGS, RUNTIME, logged_partitions, timed
from tpch_bench.spark_session import start_session

COPY = "exp.appended_state"
ROUNDS = 3


def logged_insert(log: Path, first: int, last: int) -> str:
    """The refresh's INSERT INTO its state (one line in the log, maybe after a WITH)."""
    lines = log.read_text().split("\n")[first - 1 : last]
    found = [line for line in lines if re.match(r"(WITH .*)?INSERT INTO ", line)]
    if not found:
        raise SystemExit(f"no INSERT between lines {first} and {last}")
    return found[-1]


class Jobs:
    """The Spark jobs run since the last call, from the driver's status store."""

    def __init__(self, spark) -> None:  # type: ignore[no-untyped-def]
        self.store = spark._jsparkSession.sparkContext().statusStore()
        self.seen = self._ids()

    def _ids(self) -> set[int]:
        listed = self.store.jobsList(None)
        return {listed.apply(i).jobId() for i in range(listed.size())}

    def since(self) -> str:
        listed = self.store.jobsList(None)
        new = []
        for index in range(listed.size()):
            job = listed.apply(index)
            if job.jobId() in self.seen:
                continue
            submitted, completed = job.submissionTime(), job.completionTime()
            if submitted.isDefined() and completed.isDefined():
                new.append((completed.get().getTime() - submitted.get().getTime()) / 1000)
        self.seen = self._ids()
        return f"{len(new)} job(s) {', '.join(f'{s:.2f}' for s in new)} s"


def phases(spark, query: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds of each phase of `query`: analyzed, optimized, planned, run."""
    started = time.perf_counter()
    frame = spark.sql(query)
    analyzed = time.perf_counter()
    execution = frame._jdf.queryExecution()
    execution.optimizedPlan()
    optimized = time.perf_counter()
    execution.executedPlan()
    planned = time.perf_counter()
    frame.collect()
    ran = time.perf_counter()
    return {
        "analyze": analyzed - started,
        "optimize": optimized - analyzed,
        "plan": planned - optimized,
        "run": ran - planned,
    }


def main(log: Path, first: int, last: int) -> None:
    insert = logged_insert(log, first, last)
    target = re.search(r"INSERT INTO (`\w+`\.`\w+`)", insert).group(1)  # type: ignore[union-attr]
    columns = re.search(r"INSERT INTO `\w+`\.`\w+` (\([^)]*\)) ", insert).group(1)  # type: ignore[union-attr]
    feeds = re.findall(r"TABLE_CHANGES\('[^']*', \d+, \d+\)", insert)
    spark, _ = start_session(RUNTIME)
    # The replay's settings and the refresh's own shuffle partitions, where it set them.
    for key, value in {**BASE_SETTINGS, **logged_partitions(log, first, last)}.items():
        spark.conf.set(key, value)
    spark.sql("CREATE SCHEMA IF NOT EXISTS exp")
    spark.sql(f"CREATE OR REPLACE TABLE {COPY} USING delta AS SELECT * FROM {target}")
    statement = insert.replace(target, COPY)
    query = statement.replace(f"INSERT INTO {COPY} {columns} ", "")
    first_column = columns.strip("()").split(",")[0]
    one_row = f"INSERT INTO {COPY} ({first_column}) VALUES (NULL)"
    jobs = Jobs(spark)
    print(f"{target}: {len(feeds)} change feed(s), {len(statement):,} characters")
    for round_ in range(1, ROUNDS + 1):
        for feed in feeds:
            print(
                f"round {round_} feed {feed}: {timed(spark, f'SELECT count(*) FROM {feed}'):.2f} s;"
                f" {jobs.since()}"
            )
        seconds = phases(spark, query)
        described = ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())
        total = sum(seconds.values())
        print(f"round {round_} change query: {total:.2f} s ({described}); {jobs.since()}")
        print(f"round {round_} insert: {timed(spark, statement):.2f} s; {jobs.since()}")
        print(f"round {round_} one-row insert: {timed(spark, one_row):.2f} s; {jobs.since()}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
