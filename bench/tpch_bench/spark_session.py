"""The process's one SparkSession, and what Spark's own metrics say about a piece of work.

dbt-spark's `session` method calls ``SparkSession.builder...getOrCreate()`` for every
statement, which returns the session already active in the process. The harness
starts that session itself, before dbt runs, so that the JVM's start is timed on
its own and every dbt invocation afterwards runs on a warm session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from dbt.adapters.spark_ivm.runtime.embedded import session_configs


@dataclass(frozen=True)
class SessionStart:
    seconds: float
    # True when a session was already active in the process (the smoke test runs
    # inside pytest, which shares one session): then no JVM start was measured.
    reused: bool
    application_id: str


def start_session(
    runtime_dir: Path, overrides: tuple[tuple[str, str], ...] = ()
) -> tuple[SparkSession, SessionStart]:
    """The embedded runtime's session (the same configs dbt's profile produces), timed."""
    reused = SparkContext._active_spark_context is not None
    started = time.monotonic()
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in {**session_configs(runtime_dir), **dict(overrides)}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # The first statement finishes the JVM-side set-up (catalog, Delta extension):
    # it belongs to the start, not to the first measurement.
    spark.sql("SELECT 1").collect()
    return spark, SessionStart(
        seconds=time.monotonic() - started,
        reused=reused,
        application_id=spark.sparkContext.applicationId,
    )


@dataclass(frozen=True)
class WorkMetrics:
    """Spark jobs and scan input of the work done between two marks."""

    jobs: int
    stages: int
    tasks: int
    # Bytes read by tasks from data sources (Parquet data files, and the Delta log
    # when Delta reads it with a job); the driver's own reads of the log are not in it.
    input_bytes: int
    # False when Spark's status store no longer holds all the jobs (it keeps the
    # last spark.ui.retainedJobs of them): the counts are then lower bounds.
    complete: bool


class SparkMetrics:
    """Counts jobs and input bytes from Spark's status store (kept even with the UI off).

    Job and stage ids only grow, so the work between ``mark()`` and ``since(mark)``
    is every job whose id is above the marked one. dbt runs statements on its own
    thread, so job groups (thread-local in PySpark) cannot be used to select them.
    """

    def __init__(self, spark: SparkSession) -> None:
        context = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
        self._context = context
        self._store = context.statusStore()
        # stageData has Scala default arguments, which Py4J cannot omit: pass the
        # defaults the Scala compiler generated (details off, no task filter).
        self._stage_data_defaults = [
            getattr(self._store, f"stageData$default${i}")() for i in range(2, 6)
        ]

    def mark(self) -> int:
        self._drain_listener_events()
        jobs = self._store.jobsList(None)
        return int(jobs.apply(0).jobId()) if jobs.size() > 0 else -1

    def since(self, mark: int) -> WorkMetrics:
        self._drain_listener_events()
        jobs = self._store.jobsList(None)  # newest first
        new_jobs: list[Any] = []
        for index in range(jobs.size()):
            job = jobs.apply(index)
            if int(job.jobId()) <= mark:
                break
            new_jobs.append(job)
        oldest_seen = int(new_jobs[-1].jobId()) if new_jobs else mark + 1
        stage_ids = sorted({int(s) for job in new_jobs for s in _scala_iter(job.stageIds())})
        input_bytes = 0
        tasks = 0
        for stage_id in stage_ids:
            for attempt in _scala_iter(self._stage_attempts(stage_id)):
                input_bytes += int(attempt.inputBytes())
                tasks += int(attempt.numCompleteTasks())
        return WorkMetrics(
            jobs=len(new_jobs),
            stages=len(stage_ids),
            tasks=tasks,
            input_bytes=input_bytes,
            complete=oldest_seen == mark + 1,
        )

    def _stage_attempts(self, stage_id: int) -> Any:
        try:
            return self._store.stageData(stage_id, *self._stage_data_defaults)
        except Exception:  # noqa: BLE001 - a stage evicted from the store has no data left
            return _EmptySeq()

    def _drain_listener_events(self) -> None:
        # The status store is fed asynchronously by the listener bus: wait until the
        # events of finished jobs are in before reading it.
        self._context.listenerBus().waitUntilEmpty()


class _EmptySeq:
    def size(self) -> int:
        return 0

    def apply(self, index: int) -> Any:
        raise IndexError(index)


def _scala_iter(seq: Any) -> list[Any]:
    return [seq.apply(index) for index in range(seq.size())]
