"""One logged refresh replayed on a copy of its state, under session settings to compare (issue 20).

The benchmark's dbt debug log holds every statement a refresh ran. This
script takes one model's last refresh from it (its CACHE TABLE statements
and its guarded MERGE), copies the state as it was before that MERGE, and
runs the statements against the copy once per variant of settings, twice
over (the first round warms the JVM); it prints each statement's seconds
and what the MERGE wrote. The copy has no change data feed unless a variant
asks for one (`cdf=true`), as a state no ivm model reads.

    cd bench && ../.venv/bin/python -m tpch_bench --scale 5 --kinds rf \\
        --sizes 0.1 --repetitions 1 --models lineitem_supplier_extremes \\
        --dbt-log-level-file debug --results-dir /tmp/probe --label probe
    grep -n "running node model.tpch_bench.lineitem_supplier_extremes_ivm" \\
        work/dbt/logs/dbt.log | tail -2      # the last refresh's first and last line
    PYTHONPATH=. ../.venv/bin/python micro/replay_refresh.py work/dbt/logs/dbt.log FIRST LAST \\
        p2=spark.sql.shuffle.partitions:2 p17=spark.sql.shuffle.partitions:17

`--runtime DIR` first replays against another runtime's tables (the
worked example's integration_tests/.spark_ivm). A variant is
`name=key:value;key:value`; every variant runs with adaptive execution
off, as a change over large sources does (delta.confs.CHANGE_SETTINGS).

Measured 2026-12-02, SF 5's MIN/MAX refresh (1.1 GB of sources; a change
of 92,545 state rows into 2.2 million; the logged refresh ran 17
partitions), seconds of the change query's CACHE and the MERGE, two
runs of each, the second round given first:
  2 partitions   12.93 + 14.84, 11.49 + 11.52, 13.88 + 13.30
  3 partitions   13.73 + 15.33
  16-17          14.17 + 16.86, 15.23 + 18.30, 15.13 + 18.30
  200            117.65 + 85.13 (first round)
(hence delta.confs.PARTITION_BYTES, a partition per GB of sources). At SF 1
(4 partitions logged) 1, 2 and 4 partitions were within the runs' noise.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

RUNTIME = Path(__file__).resolve().parents[1] / "work" / "runtime"
COPY = "exp.replayed_state"
BASE_SETTINGS = {
    "spark.sql.adaptive.enabled": "false",
    # The refresh stores its staged views' analyzed plans (reads.stage_feed).
    "spark.sql.legacy.storeAnalyzedPlanForView": "true",
}


def logged_statements(log: Path, first: int, last: int) -> list[str]:
    """The refresh's CACHE TABLE statements and its MERGE, in order (each one line in the log)."""
    lines = log.read_text().split("\n")[first - 1 : last]
    return [line for line in lines if re.match(r"(CACHE TABLE|MERGE INTO) ", line)]


def logged_partitions(log: Path, first: int, last: int) -> dict[str, str]:
    """The shuffle partitions the refresh SET, if it did."""
    lines = log.read_text().split("\n")[first - 1 : last]
    found = [
        m.group(1)
        for line in lines
        if (m := re.match(r"SET spark\.sql\.shuffle\.partitions=(\d+)", line))
    ]
    return {"spark.sql.shuffle.partitions": found[-1]} if found else {}


def timed(spark, statement: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds to run one statement to its end."""
    started = time.perf_counter()
    spark.sql(statement).collect()
    return time.perf_counter() - started


def drop_cached(spark, names: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Uncache and drop the refresh's staged relations, as the refresh does after its MERGE."""
    for name in names:
        spark.sql(f"UNCACHE TABLE IF EXISTS {name}")
        spark.sql(f"DROP VIEW IF EXISTS {name}")


def cached_names(statements: list[str]) -> list[str]:
    return [m.group(1) for s in statements if (m := re.match(r"CACHE TABLE (`\w+`)", s))]


class Replay:
    """The logged statements, pointed at a fresh copy of the state before their MERGE."""

    def __init__(self, spark, statements: list[str]) -> None:  # type: ignore[no-untyped-def]
        self.spark = spark
        self.statements = statements
        merge = statements[-1]
        self.target = re.match(r"MERGE INTO (`\w+`\.`\w+`)", merge).group(1)  # type: ignore[union-attr]
        history = spark.sql(f"DESCRIBE HISTORY {self.target}").collect()
        self.version = max(r["version"] for r in history if r["operation"] == "MERGE")
        guard = re.search(r"SELECT '(\w+)' AS `__ivm_guard`\) AS `__ivm_check`", merge)
        self.logged_guard = guard.group(1)  # type: ignore[union-attr]

    def copy_state(self, change_feed: bool = False) -> str:
        """A copy of the state before the logged MERGE; its guard, which the MERGE must name."""
        self.spark.sql("CREATE SCHEMA IF NOT EXISTS exp")
        feed = "true" if change_feed else "false"
        self.spark.sql(
            f"CREATE OR REPLACE TABLE {COPY} USING delta "
            f"TBLPROPERTIES ('delta.enableChangeDataFeed' = '{feed}') "
            f"AS SELECT * FROM {self.target} VERSION AS OF {self.version - 1}"
        )
        return self.spark.sql(
            f"SELECT __ivm_guard FROM {COPY} WHERE __ivm_guard IS NOT NULL"
        ).first()[0]

    def run(self, guard: str) -> list[float]:
        """Each statement's seconds against the copy; the cached relations dropped after."""
        seconds = [
            timed(
                self.spark,
                statement.replace(self.target, COPY).replace(
                    f"'{self.logged_guard}'", f"'{guard}'"
                ),
            )
            for statement in self.statements
        ]
        drop_cached(self.spark, cached_names(self.statements))
        return seconds

    def written(self) -> str:
        metrics = self.spark.sql(f"DESCRIBE HISTORY {COPY} LIMIT 1").first()["operationMetrics"]
        keys = ("numTargetFilesRemoved", "numTargetFilesAdded", "numTargetRowsUpdated")
        return ", ".join(f"{k} {metrics.get(k)}" for k in keys)


def main(log: Path, first: int, last: int, variants: list[str]) -> None:
    spark, _ = start_session(RUNTIME)
    replay = Replay(spark, logged_statements(log, first, last))
    print(f"{replay.target}: the MERGE of version {replay.version}")
    for round_ in (1, 2):
        for variant in variants:
            name, _, listed = variant.partition("=")
            settings = dict(kv.split(":", 1) for kv in listed.split(";") if kv)
            change_feed = settings.pop("cdf", "false") == "true"
            guard = replay.copy_state(change_feed)
            for key, value in {**BASE_SETTINGS, **settings}.items():
                spark.conf.set(key, value)
            seconds = replay.run(guard)
            for key in {**BASE_SETTINGS, **settings}:
                spark.conf.unset(key)
            timed = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"round {round_} {name}: {timed} s; {replay.written()}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--runtime"]:
        # Another runtime's tables (the worked example's, the warehouse's).
        RUNTIME = Path(arguments[1]).resolve()
        arguments = arguments[2:]
    main(Path(arguments[0]), int(arguments[1]), int(arguments[2]), arguments[3:])
