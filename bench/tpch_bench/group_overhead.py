"""The group-overhead phase: what publishing the ivm models as one consistency group costs.

Every ivm model of the benchmark reads lineitem, so refreshed in one dbt
invocation they form one consistency group (docs/consistency-groups.md): the
group's sources are pinned once, each member writes its state, then one row
appended to the commit log decides the group's state, every member's view is
moved, and a second row closes the commit. With ``ivm_group: 'none'`` (the
project var ``bench_ivm_group``, read by every ivm model's config) the same
models refresh and publish each on its own, with no commit rows.

Each measurement applies a fresh ``rf`` batch, then refreshes every ivm model in
one invocation, in one of the two modes; a pair measures both, and which mode
goes first alternates between pairs, so neither always finds the caches the
other warmed. Recorded per measurement: the invocation's wall time, each model's
dbt execution time and action, the Spark jobs, and for a grouped run what the
commit log says (the group's time, the publication window) and the "views
moved within" figure of the dbt log's commit line.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dbt.adapters.spark_ivm.consistency.groups import NO_GROUP
from dbt.adapters.spark_ivm.consistency.publish import COMMIT_LOG_NAME, create_commit_log
from ivm_compiler import TableName
from tpch_bench import sql_names
from tpch_bench.batches import ChangeBatch, apply_batch
from tpch_bench.catalog import BenchModel
from tpch_bench.dbt_driver import DbtProject, Invocation
from tpch_bench.generate import GeneratedData
from tpch_bench.spark_session import SparkMetrics

GROUPED = "grouped"
INDEPENDENT = "independent"
MODES = (GROUPED, INDEPENDENT)
# The project var every ivm model's config reads (bench/tpch_project/models/ivm/).
GROUP_VAR = "bench_ivm_group"
# Extra dbt vars per mode: grouped leaves ivm_group unset (grouped by shared inputs).
MODE_VARS: dict[str, dict[str, str]] = {GROUPED: {}, INDEPENDENT: {GROUP_VAR: NO_GROUP}}

# The adapter's summary of a group commit (consistency/publish.py, Publisher._commit_if_complete).
_COMMIT_LINE = re.compile(
    r"consistency group '(?P<group>[^']*)' committed \w+: .*"
    r"views moved within (?P<seconds>\d+(?:\.\d+)?)s"
)


@dataclass
class NodeRecord:
    """One model's node in the invocation."""

    model: str
    seconds: float  # dbt's execution time of the node
    action: str
    message: str
    ok: bool


@dataclass
class CommitRecord:
    """One group commit of the invocation, as the commit log records it."""

    commit_id: str
    group_name: str
    members: int
    # The group's time from its first member's start to the 'commit' row.
    group_seconds: float | None
    committed_at: str | None
    published_at: str | None
    # From the 'commit' row to the 'published' row (their committed_at): the
    # views' moves and the second INSERT's planning. None when not published.
    publication_window_seconds: float | None


@dataclass
class GroupOverheadRecord:
    pair: int
    mode: str  # grouped | independent
    position: int  # 0 when this mode ran first in its pair, 1 when second
    batch: dict[str, Any]
    ok: bool
    error: str | None
    invocation_seconds: float
    models_seconds: float  # the sum of the nodes' execution times
    jobs: int
    stages: int
    tasks: int
    input_bytes: int
    metrics_complete: bool
    invocation_id: str | None
    # When the invocation started (wall clock), and the machine's 1-minute load
    # average right after it: a load well above the session's 2 cores means
    # another process was competing for them during the run.
    started_at: str = ""
    load_average: float = 0.0
    nodes: list[NodeRecord] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)
    # "views moved within X s" of each commit line the adapter logged.
    views_moved_seconds: list[float] = field(default_factory=list)


class GroupOverheadPhase:
    """Measures the two modes on one scale factor's project and sources."""

    def __init__(
        self,
        spark: SparkSession,
        metrics: SparkMetrics,
        project: DbtProject,
        data: GeneratedData,
        source_schema: str,
        model_schema: str,
    ) -> None:
        self.spark = spark
        self.metrics = metrics
        self.project = project
        self.data = data
        self.source_schema = source_schema
        self.model_schema = model_schema

    def prepare(self) -> float:
        """Parse the independent mode's manifest and create the commit log; seconds taken.

        The log is created by the first group commit of a schema; creating it here
        keeps that one-time DDL out of the first grouped measurement, which should
        cost what every later commit costs.
        """
        seconds = self.project.parse(MODE_VARS[INDEPENDENT])
        self.spark.sql(
            create_commit_log(TableName(db=self.model_schema, name=COMMIT_LOG_NAME))
        ).collect()
        return seconds

    def measure(
        self,
        models: Sequence[BenchModel],
        mode: str,
        batch: ChangeBatch,
        pair: int,
        position: int,
    ) -> GroupOverheadRecord:
        applied = apply_batch(self.spark, self.data, self.source_schema, batch)
        mark = self.metrics.mark()
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        invocation = self.project.run_models(
            [model.ivm_model for model in models], extra_vars=MODE_VARS[mode]
        )
        load_average = os.getloadavg()[0]
        work = self.metrics.since(mark)
        return GroupOverheadRecord(
            pair=pair,
            mode=mode,
            position=position,
            batch=applied.to_json(),
            ok=invocation.ok,
            error=invocation.error,
            invocation_seconds=round(invocation.seconds, 4),
            models_seconds=round(sum(node.seconds for node in invocation.nodes), 4),
            jobs=work.jobs,
            stages=work.stages,
            tasks=work.tasks,
            input_bytes=work.input_bytes,
            metrics_complete=work.complete,
            invocation_id=invocation.invocation_id,
            started_at=started_at,
            load_average=round(load_average, 2),
            nodes=[
                NodeRecord(
                    model=node.model,
                    seconds=round(node.seconds, 4),
                    action=node.action,
                    message=node.message,
                    ok=node.ok,
                )
                for node in invocation.nodes
            ],
            commits=self._commits(invocation),
            views_moved_seconds=views_moved_seconds(invocation.adapter_messages),
        )

    def _commits(self, invocation: Invocation) -> list[CommitRecord]:
        if invocation.invocation_id is None:
            return []
        rows = (
            self.spark.table(sql_names.table(self.model_schema, COMMIT_LOG_NAME))
            .where(F.col("invocation_id") == invocation.invocation_id)
            .select(
                "commit_id",
                "kind",
                "group_name",
                F.size("members").alias("members"),
                "group_seconds",
                F.col("committed_at").cast("string").alias("committed_at"),
                F.unix_micros("committed_at").alias("micros"),
            )
            .collect()
        )
        return commits_from_rows([row.asDict() for row in rows])


def commits_from_rows(rows: Sequence[dict[str, Any]]) -> list[CommitRecord]:
    """Pair each 'commit' row with its 'published' row (same commit_id), oldest first."""
    published = {row["commit_id"]: row for row in rows if row["kind"] == "published"}
    commits = []
    for row in sorted((r for r in rows if r["kind"] == "commit"), key=lambda r: r["micros"]):
        closing = published.get(row["commit_id"])
        commits.append(
            CommitRecord(
                commit_id=str(row["commit_id"]),
                group_name=str(row["group_name"]),
                members=int(row["members"]),
                group_seconds=row["group_seconds"],
                committed_at=row["committed_at"],
                published_at=closing["committed_at"] if closing else None,
                publication_window_seconds=(
                    round((closing["micros"] - row["micros"]) / 1e6, 6) if closing else None
                ),
            )
        )
    return commits


def views_moved_seconds(messages: Sequence[str]) -> list[float]:
    """The "views moved within X s" figure of every group commit line among ``messages``.

    >>> views_moved_seconds(["m: refreshed", "consistency group 'g' committed 3f2a9c1e0b7d: "
    ...     "a.b@5 (incremental, 3.1s); sources raw.src@12; group refresh 11.2s, "
    ...     "views moved within 0.41s (log: a.ivm_group_commits)"])
    [0.41]
    """
    return [
        float(match["seconds"])
        for message in messages
        if (match := _COMMIT_LINE.search(message)) is not None
    ]
