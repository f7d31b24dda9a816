"""How long an UNCACHE TABLE of a tiny stage waits while another session builds a cache (issue 54).

On the warehouse at scale 6000 (2026-12-07, `838bc4c`), three UNCACHEs in
three dbt threads ended within 4 ms of one another, after 9.4-18.0 s, just
before a fourth thread's CACHE TABLE of the NTILE fallback's difference
finished. This reproduces it in one process: session A caches a query whose
shuffle runs for about half a minute; a second after it starts, session B
uncaches a ten-row table. A thread dump taken during B's wait names the
lock (written to work/micro/uncache_wait_jstack.txt). Each mode runs in a
process of its own:

    PYTHONPATH=bench .venv/bin/python bench/micro/uncache_wait.py adaptive
    PYTHONPATH=bench .venv/bin/python bench/micro/uncache_wait.py static

`adaptive`: session A as Spark's defaults have it (adaptive execution on);
`static`: session A with `spark.sql.adaptive.enabled=false`.

Measured 2026-12-07 (2 cores, alone; two runs of each): adaptive, the
UNCACHE took 22.6 and 28.5 s, ending a second or less before A's CACHE
TABLE (26.9 and 29.7 s); static, 0.1 s both times (A 29.5 and 30.3 s). The
dump: B blocked in CachedRDDBuilder.isCachedColumnBuffersLoaded, which
CacheManager.recacheByCondition calls on every cache entry after an
uncache; A held that builder's monitor in CachedRDDBuilder.cachedColumnBuffers
-> buildBuffers -> AdaptiveSparkPlanExec.doExecute, which runs the adaptive
plan's shuffle stages before it returns the RDD. A static plan returns its
RDD without running anything, so the monitor is held for the planning only.

Since `e91338e` every stage the refresh caches is planned statically
(delta.confs.STAGE_SETTINGS): at scale 6000 over two days the UNCACHEs took
5.6 s where 82.2 s, and the batch's wall did not move, its two cores as busy
as before (docs/performance.md, "Open work").
"""

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

WORK = Path(__file__).resolve().parents[1] / "work" / "micro"
# A cross join filtered and grouped: a shuffle that runs for about half a
# minute on two cores, with no source to set up.
SLOW_CACHE = (
    "CACHE TABLE slow_stage AS SELECT a.id % 1000 AS k, COUNT(*) AS n "
    "FROM range(0, 200000) a CROSS JOIN range(0, 100000) b "
    "WHERE (a.id * b.id) % 7 = 3 GROUP BY 1"
)


def main(mode: str) -> None:
    WORK.mkdir(parents=True, exist_ok=True)  # the thread dump is written there
    runtime = WORK / "uncache_wait_runtime"
    shutil.rmtree(runtime, ignore_errors=True)
    spark, _ = start_session(runtime)
    builder = spark.newSession()
    if mode == "static":
        builder.sql("SET spark.sql.adaptive.enabled=false")
    spark.sql("CACHE TABLE tiny_stage AS SELECT id FROM range(10)")

    def slow_cache() -> None:
        started = time.monotonic()
        builder.sql(SLOW_CACHE)
        print(f"{mode}: the other session's CACHE TABLE took {time.monotonic() - started:.1f} s")

    other = threading.Thread(target=slow_cache)
    other.start()
    time.sleep(1)
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()

    def dump() -> None:
        time.sleep(2)
        found = subprocess.run(["jstack", str(pid)], check=True, capture_output=True, text=True)
        (WORK / "uncache_wait_jstack.txt").write_text(found.stdout)

    threading.Thread(target=dump).start()
    started = time.monotonic()
    spark.sql("UNCACHE TABLE IF EXISTS tiny_stage")
    print(f"{mode}: UNCACHE TABLE of a ten-row stage took {time.monotonic() - started:.1f} s")
    other.join()
    spark.sql("UNCACHE TABLE IF EXISTS slow_stage")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "adaptive")
