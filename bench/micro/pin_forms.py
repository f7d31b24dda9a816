"""Pinning a source right after a commit, with and without DESCRIBE DETAIL (issue 20).

Each round commits one row to a small Delta table with a change feed, then
reads what a refresh reads: the table's DESCRIBE DETAIL (`detail`, how pins
were read before 2b360e9) or its SHOW TBLPROPERTIES (`properties`, how they
are read now), then DESCRIBE HISTORY LIMIT 20, the new commit's change feed,
and the table at its latest version (a join partner's read). The forms
alternate which goes first; prints the median seconds of each statement.

    REPS=8 PYTHONPATH=bench .venv/bin/python bench/micro/pin_forms.py

The embedded runtime's configs, a JVM of its own, data in bench/work/micro.
Measured 2026-11-29 (REPS=8): detail 0.92 s, properties 0.07 s; history
0.34 / 0.32 s; change feed 0.22 / 0.23 s; latest read 0.34 / 0.97 s (the
file listing DETAIL did is paid by the first read that needs it).
"""

import os
import statistics
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

WORK = Path(__file__).resolve().parents[1] / "work" / "micro"
spark, _ = start_session(WORK)
REPS = int(os.environ.get("REPS", "8"))
STEPS = ("pin", "history", "change feed", "latest read")

spark.sql("CREATE SCHEMA IF NOT EXISTS s")
spark.sql("DROP TABLE IF EXISTS s.pinned")
spark.sql(
    "CREATE TABLE s.pinned (k INT, v INT) USING delta "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
for start in range(0, 500, 100):
    spark.sql(f"INSERT INTO s.pinned SELECT id, id FROM range({start}, {start + 100})")


def timed(sql: str) -> tuple[float, list]:
    started = time.perf_counter()
    rows = spark.sql(sql).collect()
    return time.perf_counter() - started, rows


def round_of(form: str) -> list[float]:
    spark.sql("INSERT INTO s.pinned VALUES (1, 1)")
    pin = "DESCRIBE DETAIL s.pinned" if form == "detail" else "SHOW TBLPROPERTIES s.pinned"
    seconds = [timed(pin)[0]]
    history_seconds, history = timed("DESCRIBE HISTORY s.pinned LIMIT 20")
    seconds.append(history_seconds)
    version = history[0]["version"]
    seconds.append(timed(f"SELECT * FROM table_changes('s.pinned', {version}, {version})")[0])
    seconds.append(timed("SELECT count(*) FROM s.pinned")[0])
    return seconds


results: dict[str, list[list[float]]] = {"detail": [], "properties": []}
for rep in range(REPS):
    for form in ("detail", "properties") if rep % 2 == 0 else ("properties", "detail"):
        results[form].append(round_of(form))
for form, rounds in results.items():
    medians = [statistics.median(step) for step in zip(*rounds)]
    print(form, ", ".join(f"{name} {m:.2f} s" for name, m in zip(STEPS, medians)))
