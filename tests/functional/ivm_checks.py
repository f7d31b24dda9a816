"""Checks shared by the integration tests: the correctness oracle and state inspection.

The oracle is the project's one definition of correct: an ivm model equals its
query recomputed at the source versions the model records, as a bag (EXCEPT
ALL both ways, so duplicates count).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from dbt.adapters.spark_ivm.delta.history import RECOMPUTED_MARKER, describe_history, load_metadata
from dbt.adapters.spark_ivm.delta.records import RecordedState, parse_recorded
from dbt.adapters.spark_ivm.refresh.recipe import RECOMPUTED_GROUPS
from dbt.adapters.spark_ivm.refresh.writes import CancellingRemoval
from ivm_compiler import TableName


@dataclass(frozen=True)
class BagDifference:
    missing_from_model: int
    extra_in_model: int
    # Counted only when the bags differ, for the failure's message.
    model_rows: int | None
    query_rows: int | None

    @property
    def equal(self) -> bool:
        return self.missing_from_model == 0 and self.extra_in_model == 0


def bag_difference(spark: SparkSession, model_sql: str, query_sql: str) -> BagDifference:
    return bag_differences(spark, {"model": (model_sql, query_sql)})["model"]


def bag_differences(
    spark: SparkSession, pairs: Mapping[str, tuple[str, str]]
) -> dict[str, BagDifference]:
    """The bag differences of named (model_sql, query_sql) pairs, all in one statement.

    Both directions of every pair in one SELECT: the property tests check
    every model after every refresh, and one statement plans once (measured
    for one pair: 0.8 s against 1.2 s for separate counts). The row counts
    only serve a failure's message.
    """
    names = list(pairs)
    columns = []
    for index, name in enumerate(names):
        model_sql, query_sql = pairs[name]
        columns += [
            f"(SELECT count(*) FROM (({query_sql}) EXCEPT ALL ({model_sql})) AS missing_{index})",
            f"(SELECT count(*) FROM (({model_sql}) EXCEPT ALL ({query_sql})) AS extra_{index})",
        ]
    counts = spark.sql("SELECT " + ", ".join(columns)).collect()[0]
    differences = {}
    for index, name in enumerate(names):
        missing, extra = int(counts[2 * index]), int(counts[2 * index + 1])
        model_rows = query_rows = None
        if missing or extra:
            model_sql, query_sql = pairs[name]
            model_rows, query_rows = spark.sql(model_sql).count(), spark.sql(query_sql).count()
        differences[name] = BagDifference(missing, extra, model_rows, query_rows)
    return differences


@dataclass(frozen=True)
class ModelCheck:
    """A model that matched its query: the source versions it records, its state's builds."""

    versions: dict[str, int]
    builds: int


@dataclass(frozen=True)
class StateHistory:
    """What one read of a state's Delta history says: the last refresh and the builds."""

    recorded: RecordedState
    # How many times its state was computed whole (see state_builds).
    builds: int


def state_history(spark: SparkSession, schema: str, model: str) -> StateHistory:
    state = TableName(db=schema, name=f"{model}__ivm_state")
    history = spark.sql(describe_history(state))
    rows = [list(r) for r in history.collect()]
    recorded = parse_recorded(state, history.columns, rows)
    assert recorded is not None, f"{state} has no refresh commit"
    return StateHistory(recorded=recorded, builds=_builds(history.collect()))


def assert_models_match_sources(
    spark: SparkSession, schema: str, queries: Mapping[str, str], sources: list[str]
) -> dict[str, ModelCheck]:
    """assert_model_matches_sources for many models, their oracles in one statement."""
    found: dict[str, ModelCheck] = {}
    pairs = {}
    for model, template in queries.items():
        history = state_history(spark, schema, model)
        versions = {
            source: int(history.recorded.sources[f"{schema}.{source}"]["version"])
            for source in sources
            if f"{{{source}}}" in template
        }
        query = template.format(
            **{s: f"{schema}.{s} VERSION AS OF {v}" for s, v in versions.items()}
        )
        pairs[model] = (f"SELECT * FROM {schema}.{model}", query)
        found[model] = ModelCheck(versions=versions, builds=history.builds)
    differing = {
        model: f"{model} differs from its query at versions {found[model].versions}: {difference}"
        for model, difference in bag_differences(spark, pairs).items()
        if not difference.equal
    }
    assert not differing, "\n".join(differing.values())
    return found


def recorded_state(spark: SparkSession, schema: str, model: str) -> RecordedState:
    return state_history(spark, schema, model).recorded


def recorded_version(spark: SparkSession, schema: str, model: str, source: str) -> int:
    sources = recorded_state(spark, schema, model).sources
    return int(sources[f"{schema}.{source}"]["version"])


def latest_version(spark: SparkSession, table: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").collect()[0]["version"])


def table_properties(spark: SparkSession, table: str) -> dict[str, str]:
    """SHOW TBLPROPERTIES of a table or view, as a mapping."""
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}


def assert_model_matches_query(
    spark: SparkSession, schema: str, model: str, query_template: str, source: str
) -> int:
    """Assert the model equals its query at the recorded source version; return that version."""
    version = recorded_version(spark, schema, model, source)
    query = query_template.format(src=f"{schema}.{source} VERSION AS OF {version}")
    difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
    assert difference.equal, f"{model} differs from its query at version {version}: {difference}"
    return version


def assert_model_matches_sources(
    spark: SparkSession, schema: str, model: str, query_template: str, sources: list[str]
) -> dict[str, int]:
    """The oracle over several sources: each read at the version the model records for it.

    Returns the recorded versions of the sources the model reads.
    """
    recorded = recorded_state(spark, schema, model).sources
    versions = {}
    for source in sources:
        if f"{{{source}}}" in query_template:
            versions[source] = int(recorded[f"{schema}.{source}"]["version"])
    query = query_template.format(
        **{s: f"{schema}.{s} VERSION AS OF {v}" for s, v in versions.items()}
    )
    difference = bag_difference(spark, f"SELECT * FROM {schema}.{model}", query)
    assert difference.equal, f"{model} differs from its query at versions {versions}: {difference}"
    return versions


# A change written to a model's state: a merged state's MERGE, a log's INSERT.
_STATE_WRITE = re.compile(r"(?:MERGE|INSERT) INTO `[^`]*`\.`(?P<model>\w+)__ivm_state`")


def state_written(sql: str) -> str | None:
    """The model whose state `sql` writes a change to, if it does.

    >>> state_written("INSERT INTO `s`.`by_g__ivm_state` (`g`) SELECT 1")
    'by_g'
    >>> state_written("MERGE INTO `s`.`joined__ivm_state` AS t USING x")
    'joined'
    >>> state_written("WITH c AS (SELECT 1) INSERT INTO `s`.`by_g__ivm_state` SELECT * FROM c")
    'by_g'
    >>> state_written("SELECT * FROM `s`.`by_g__ivm_state`") is None
    True
    """
    if not sql.lstrip().upper().startswith(("MERGE", "INSERT", "WITH")):
        return None
    # A log's INSERT comes after the CTEs of its change rows.
    found = _STATE_WRITE.search(sql)
    return found["model"] if found else None


def writes_state(sql: str, model: str) -> bool:
    return state_written(sql) == model


def state_builds(spark: SparkSession, schema: str, model: str) -> int:
    """How many times the model's state was computed whole from its sources (_builds).

    The oracle alone would pass a model that is silently rebuilt on every run;
    tests of incremental shapes also assert this number stays at one.
    """
    state = TableName(db=schema, name=f"{model}__ivm_state")
    return _builds(spark.sql(describe_history(state)).collect())


def _builds(history: Iterable[Any]) -> int:
    """A state's CREATE/REPLACE commits (builds, rebuilds) and its recomputes.

    A recompute (an INSERT OVERWRITE, or a MERGE by key where ivm models
    read the state) carries delta.history.RECOMPUTED_MARKER in its commit metadata;
    a log state's rewrite and an incremental MERGE do not.
    """
    builds = 0
    for row in history:
        operation = row["operation"]
        if "CREATE" in operation or "REPLACE" in operation:
            builds += 1
        elif operation in ("WRITE", "MERGE"):
            metadata = load_metadata(row["userMetadata"]) or {}
            builds += bool(metadata.get(RECOMPUTED_MARKER))
    return builds


def cancelling_recomputes(results: Iterable[Any]) -> dict[str, str]:
    """The models dbt's run results say recomputed because a removal would cancel their
    moments (writes.CancellingRemoval): 'model' (the whole state rebuilt, the one rebuild
    an incremental model may take) or 'groups' (an incremental refresh that recomputed
    the groups concerned)."""
    found = {}
    for result in results:
        code = str((result.adapter_response or {}).get("code"))
        message = f"{(result.adapter_response or {}).get('_message')} {result.message}"
        if code == "RECOMPUTE" and CancellingRemoval.REASON in message:
            found[result.node.name] = "model"
        elif code == "INCREMENTAL" and RECOMPUTED_GROUPS in message:
            found[result.node.name] = "groups"
    return found


def all_node_models(spark: SparkSession, schema: str) -> list[str]:
    """Every plan node kept in `schema`, in one statement: views `*__ivm_cte_*`."""
    views = spark.sql(f"SHOW VIEWS IN {schema} LIKE '*__ivm_cte_*'").collect()
    return sorted(row["viewName"] for row in views)


def assert_built_once(spark: SparkSession, schema: str, checked: Mapping[str, ModelCheck]) -> None:
    """Every checked model, and every plan node of its CTEs and subqueries, was built
    once and then maintained incrementally (the oracle alone would pass a rebuild)."""
    nodes = all_node_models(spark, schema)
    for model, check in checked.items():
        assert check.builds == 1, f"{model} was rebuilt instead of refreshed incrementally"
        for node in (n for n in nodes if n.startswith(f"{model}__ivm_cte_")):
            assert state_builds(spark, schema, node) == 1, (
                f"{node} was rebuilt instead of refreshed incrementally"
            )


def node_models(spark: SparkSession, schema: str, model: str) -> list[str]:
    """The plan nodes kept for a model's CTEs and subqueries: views `<model>__ivm_cte_<name>`."""
    views = spark.sql(f"SHOW VIEWS IN {schema} LIKE '{model}__ivm_cte_*'").collect()
    return sorted(row["viewName"] for row in views)


@dataclass(frozen=True)
class Scan:
    """One file scan of a table in one SQL execution, from Spark's SQL status store."""

    execution: str  # the execution's description (Delta names its MERGE phases there)
    files_read: int


class ScanLog:
    """The file scans of a table that SQL executions made after a mark.

    Reads the SQL tab's data (the SQLAppStatusStore, kept with the UI off):
    each execution's plan graph and the values of its scan nodes' "number of
    files read" metric. dbt runs statements on its own thread in this
    process's session, so executions are told apart by id, not by job group.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._store = spark._jsparkSession.sharedState().statusStore()  # type: ignore[attr-defined]

    def _executions(self) -> list:
        # The listener bus feeds the store asynchronously: let it catch up first.
        self._spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # type: ignore[union-attr]
        found, iterator = [], self._store.executionsList().iterator()
        while iterator.hasNext():
            found.append(iterator.next())
        return found

    def mark(self) -> int:
        return max((int(e.executionId()) for e in self._executions()), default=-1)

    def plans_since(self, mark: int) -> list[str]:
        """The physical plans of the executions after `mark`, as EXPLAIN shows them."""
        return [
            str(execution.physicalPlanDescription())
            for execution in self._executions()
            if int(execution.executionId()) > mark
        ]

    def scans_since(self, mark: int, table: str) -> list[Scan]:
        """Scans of `table` (`schema.name`) in the executions after `mark`."""
        wanted = f"Scan parquet spark_catalog.{table}".lower()
        scans = []
        for execution in self._executions():
            if int(execution.executionId()) <= mark:
                continue
            values = self._store.executionMetrics(execution.executionId())
            nodes = self._store.planGraph(execution.executionId()).allNodes().iterator()
            while nodes.hasNext():
                node = nodes.next()
                if node.name().lower() != wanted:
                    continue
                metrics = node.metrics().iterator()
                while metrics.hasNext():
                    metric = metrics.next()
                    value = values.get(metric.accumulatorId())
                    if metric.name() == "number of files read" and value.isDefined():
                        files = int(str(value.get()).replace(",", ""))
                        scans.append(Scan(execution=str(execution.description()), files_read=files))
        return scans
