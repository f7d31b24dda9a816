"""When a log state's next write rewrites it (state_history.compaction_due), from history rows."""

from __future__ import annotations

import json

from dbt.adapters.spark_ivm.state_history import MIN_LOG_ROWS, compaction_due

COLUMNS = ["version", "operation", "operationParameters", "operationMetrics"]


def commit(version: int, operation: str, mode: str | None, rows: int, as_json: bool = False):
    parameters = {"mode": mode} if mode else {}
    metrics = {"numOutputRows": str(rows)}
    if as_json:  # as agate hands maps over from a Thrift server
        return [version, operation, json.dumps(parameters), json.dumps(metrics)]
    return [version, operation, parameters, metrics]


def test_appends_within_the_last_rewrite_do_not_rewrite():
    rows = [
        commit(0, "CREATE OR REPLACE TABLE AS SELECT", None, 50_000),
        commit(1, "WRITE", "Append", 20_000),
        commit(2, "WRITE", "Append", 20_000),
    ]
    assert not compaction_due(COLUMNS, rows)


def test_appends_past_the_last_rewrite_rewrite():
    rows = [
        commit(0, "CREATE OR REPLACE TABLE AS SELECT", None, 50_000),
        commit(1, "WRITE", "Append", 30_000),
        commit(2, "WRITE", "Append", 30_000),
    ]
    assert compaction_due(COLUMNS, rows)


def test_a_small_state_waits_for_the_floor():
    rows = [commit(4, "WRITE", "Overwrite", 3)] + [
        commit(v, "WRITE", "Append", 2, as_json=True) for v in range(5, 12)
    ]
    assert not compaction_due(COLUMNS, rows)
    rows.append(commit(12, "WRITE", "Append", MIN_LOG_ROWS))
    assert compaction_due(COLUMNS, rows)


def test_the_newest_rewrite_counts_and_maintenance_is_skipped():
    rows = [
        commit(0, "CREATE TABLE AS SELECT", None, 10),
        commit(1, "WRITE", "Append", MIN_LOG_ROWS + 1),
        commit(2, "WRITE", "Overwrite", 10),
        commit(3, "OPTIMIZE", None, 0),
        commit(4, "WRITE", "Append", 5),
    ]
    assert not compaction_due(COLUMNS, rows)


def test_a_rewrite_older_than_the_commits_read_rewrites():
    rows = [commit(v, "WRITE", "Append", 1) for v in range(30, 50)]
    assert compaction_due(COLUMNS, rows)


def test_a_rewrite_as_thrift_renders_its_parameters_counts():
    """Over Thrift a CREATE OR REPLACE's parameters hold its table properties as unescaped JSON."""
    parameters = (
        '{"isManaged":"true","description":null,"partitionBy":"[]","clusterBy":"[]",'
        '"properties":"{"spark_ivm.state_form":"log"}"}'
    )
    rebuilt = [
        3,
        "CREATE OR REPLACE TABLE AS SELECT",
        parameters,
        json.dumps({"numOutputRows": str(MIN_LOG_ROWS * 3)}),
    ]
    appended = [commit(v, "WRITE", "Append", 100, as_json=True) for v in (4, 5)]
    assert not compaction_due(COLUMNS, [rebuilt, *appended])
    many = [commit(v, "WRITE", "Append", MIN_LOG_ROWS * 2, as_json=True) for v in (4, 5)]
    assert compaction_due(COLUMNS, [rebuilt, *many])
