"""A state's history: when a log state's next write rewrites it, and the view's record of it."""

from __future__ import annotations

import json

from dbt.adapters.spark_ivm.delta.records import RecordedState, commit_metadata
from dbt.adapters.spark_ivm.refresh.state_history import (
    LOG_CHECK_EVERY,
    MIN_LOG_ROWS,
    RECENT_COMMITS,
    RECORD_PROPERTY,
    StateHistory,
    compaction_due,
    read_record_property,
    record_property,
)
from ivm_compiler import TableName

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


# -- the view's record (StateHistory.from_view and what a write leaves) -------

STATE = TableName("models", "m__ivm_state")
SOURCES = {"raw.t": {"version": 7, "committed_at": "2026-11-30 10:00:00"}}
HISTORY_COLUMNS = ["version", "operation", "userMetadata"]


class History:
    """A runner answering DESCRIBE HISTORY [LIMIT n] with given rows, counting the reads."""

    def __init__(self, rows: list[list[object]]) -> None:
        self.rows = rows
        self.reads = 0
        self.limits: list[int | None] = []

    def query(self, sql: str):
        assert sql.startswith("DESCRIBE HISTORY"), sql
        self.reads += 1
        limit = int(sql.split("LIMIT")[1]) if "LIMIT" in sql else None
        self.limits.append(limit)
        newest_first = sorted(self.rows, key=lambda row: -int(row[0]))  # type: ignore[call-overload]
        return HISTORY_COLUMNS, newest_first[:limit]

    def execute(self, sql: str) -> None:
        raise AssertionError(sql)


REPLACE = "CREATE OR REPLACE TABLE AS SELECT"


def refresh_commit(
    version: int, operation: str = "WRITE", on_record: int | None = None
) -> list[object]:
    metadata = commit_metadata(f"r{version}", STATE, "fp", [], guard="g", on_record=on_record)
    metadata["sources"] = SOURCES
    return [version, operation, json.dumps(metadata)]


def shown(version: int, unchecked: int = 0, sources=SOURCES) -> dict[str, str]:
    recorded = RecordedState(version, "fp", sources, guard="g")
    return {RECORD_PROPERTY: record_property(recorded, unchecked)}


def test_a_log_state_starts_from_the_record_of_the_version_its_view_shows():
    runner = History([refresh_commit(3)])
    history = StateHistory(runner, STATE)
    recorded = history.from_view(shown(3), shown_version=3)
    assert recorded == RecordedState(3, "fp", SOURCES, guard="g")
    # The write's transaction version, and no rewrite, come from the record alone.
    assert history.newest_version() == 3
    assert not history.log_compaction_due()
    assert runner.reads == 0


def test_the_history_is_read_where_the_record_cannot_say():
    history = StateHistory(History([]), STATE)
    assert history.from_view({}, shown_version=3) is None
    assert history.from_view({RECORD_PROPERTY: "{"}, shown_version=3) is None
    # The view shows another version than its record names (an ALTER VIEW by hand).
    assert history.from_view(shown(3), shown_version=4) is None
    # Every LOG_CHECK_EVERY-th refresh, for the rewrite policy's counts.
    assert history.from_view(shown(3, LOG_CHECK_EVERY - 2), shown_version=3) is not None
    assert history.from_view(shown(3, LOG_CHECK_EVERY - 1), shown_version=3) is None
    # A merged state has no rewrite policy to count for.
    merged = history.from_view(shown(3, LOG_CHECK_EVERY - 1), shown_version=3, periodic=False)
    assert merged is not None


def test_a_record_that_did_not_hold_is_not_taken_again():
    history = StateHistory(History([refresh_commit(3)]), STATE)
    assert history.from_view(shown(3), shown_version=3) is not None
    history.forget_assumed()
    assert history.assumed is None
    assert history.from_view(shown(3), shown_version=3) is None
    assert history.recorded() == RecordedState(3, "fp", SOURCES, guard="g")


def test_a_write_on_the_record_counts_toward_the_next_history_read():
    history = StateHistory(History([]), STATE)
    history.from_view(shown(3, unchecked=1), shown_version=3)
    later = {"raw.t": {"version": 9}}
    metadata = commit_metadata("r4", STATE, "fp", [], guard="g")
    history.committed(4, {**metadata, "sources": later})
    written = read_record_property(history.published_record(None))
    assert written == (RecordedState(4, "fp", later, guard="g"), 2)


def test_a_refresh_that_read_the_history_starts_the_count_again():
    history = StateHistory(History([refresh_commit(3)]), STATE)
    recorded = history.recorded()
    assert read_record_property(history.published_record(recorded)) == (recorded, 0)
    history.committed(4, commit_metadata("r4", STATE, "fp", [], guard="g"))
    found = read_record_property(history.published_record(None))
    assert found is not None and found[0].state_version == 4 and found[1] == 0


def test_a_write_whose_version_this_refresh_did_not_learn_leaves_no_record():
    history = StateHistory(History([refresh_commit(3)]), STATE)
    history.recorded()
    assert history.published_record(None) is None


def test_a_write_made_on_the_views_record_is_checked_by_every_reader_of_the_history():
    # The append at 6 was made on the record of 3: the UPDATE at 4 lies under it.
    runner = History(
        [
            refresh_commit(3),
            [4, "UPDATE", None],
            [5, "OPTIMIZE", None],
            refresh_commit(6, on_record=3),
        ]
    )
    recorded = StateHistory(runner, STATE).recorded()
    assert recorded is not None and recorded.state_version == 6
    assert recorded.later_writes == ("UPDATE at version 4",)
    # Only maintenance between: nothing to say.
    runner.rows = [refresh_commit(3), [4, "OPTIMIZE", None], refresh_commit(5, on_record=3)]
    assert StateHistory(runner, STATE).recorded().later_writes == ()  # type: ignore[union-attr]
    # A rebuild starts over, whatever it was made on.
    runner.rows = [refresh_commit(3), [4, "UPDATE", None], refresh_commit(5, REPLACE, 3)]
    assert StateHistory(runner, STATE).recorded().later_writes == ()  # type: ignore[union-attr]


def test_the_history_is_read_back_to_the_record_a_write_was_made_on():
    runner = History([refresh_commit(3), [4, "UPDATE", None]])
    runner.rows = [refresh_commit(v) for v in range(3)] + runner.rows
    runner.rows += [[v, "OPTIMIZE", None] for v in range(5, 30)] + [refresh_commit(30, on_record=3)]
    recorded = StateHistory(runner, STATE).recorded()
    assert runner.limits == [RECENT_COMMITS, None]
    assert recorded is not None and recorded.later_writes == ("UPDATE at version 4",)


def test_the_write_on_a_record_names_it_in_its_commit():
    history = StateHistory(History([]), STATE)
    assert history.on_record() is None
    history.from_view(shown(3), shown_version=3)
    assert history.on_record() == 3
