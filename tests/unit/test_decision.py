"""decision.decide: every branch of what a refresh does, without Spark.

Each case is the facts a refresh would have read (pins, the state's newest
refresh commit, its history) and the action and reason it must reach.
"""

from __future__ import annotations

import dataclasses

import pytest

from dbt.adapters.spark_ivm.delta.history import CommitRows
from dbt.adapters.spark_ivm.delta.records import RecordedState
from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot
from dbt.adapters.spark_ivm.refresh import strategy
from dbt.adapters.spark_ivm.refresh.decision import (
    FALLBACK_TABLE,
    FIRST_BUILD,
    NO_COMMON_PARTITION,
    NO_SOURCE_COMMITS,
    ONLY_PRESERVING_COMMITS,
    Facts,
    decide,
    version_ranges,
)
from dbt.adapters.spark_ivm.settings import Action, RefreshSettings, Strategy
from ivm_compiler import TableName, ViewPlan
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.reads import VersionRange
from tests.unit.test_compile import (
    GROUPED_DESCRIBE,
    GROUPED_PROBE,
    GROUPED_SQL,
    ORDERS_TABLE,
    compile_with,
)

STATE = TableName("analytics", "m__ivm_state")


@pytest.fixture(scope="module")
def plan() -> ViewPlan:
    compiled, _ = compile_with(GROUPED_SQL, GROUPED_DESCRIBE, GROUPED_PROBE)
    return compiled


def pin(version: int, table_id: str = "orders-id", commits=(), size: int = 10_000):
    return {
        ORDERS_TABLE: SourceSnapshot(
            ORDERS_TABLE, table_id, version, size_bytes=size, recent_commits=tuple(commits)
        )
    }


def recorded(plan: ViewPlan, version: int = 5, **changes) -> RecordedState:
    state = RecordedState(
        state_version=3,
        fingerprint=plan.fingerprint,
        sources={str(ORDERS_TABLE): {"version": version, "table_id": "orders-id"}},
        guard="g",
    )
    return dataclasses.replace(state, **changes)


def facts(plan: ViewPlan | None = None, **fields) -> Facts:
    base = {"state": STATE, "state_exists": True}
    if plan is not None:
        base["recorded"] = recorded(plan)
    return Facts(**{**base, **fields})


def written(version: int, rows: int | None, preserves: bool = False) -> CommitRows:
    return CommitRows(version, rows, preserves_data=preserves)


INCREMENTAL_ONLY = RefreshSettings(strategy=Strategy.INCREMENTAL)
SETTINGS = RefreshSettings()


def test_no_state_is_a_first_build(plan):
    found = decide(plan, pin(7), Facts(STATE, state_exists=False), RefreshSettings())
    assert (found.action, found.reason) == (Action.BUILD, FIRST_BUILD)
    assert found.builds and not found.ranges


def test_full_refresh_rebuilds(plan):
    found = decide(plan, pin(7), facts(plan), RefreshSettings(full_refresh=True))
    assert (found.action, found.reason) == (Action.REBUILD, "--full-refresh")


@pytest.mark.parametrize(
    ("fields", "reason", "names_the_state"),
    [
        ({"recorded": None}, "has no refresh commit in its history", True),
        (
            {"later_writes": ("UPDATE at version 4",)},
            "was written outside dbt after its last refresh (UPDATE at version 4)",
            True,
        ),
        ({"fingerprint": "other"}, "the model's SQL or its columns changed", False),
        ({"guard": None}, "has no guard row", True),
        (
            {"sources": {}},
            f"the model now reads {ORDERS_TABLE}, which its state does not",
            False,
        ),
        (
            {"sources": {str(ORDERS_TABLE): {"version": 5, "table_id": "old-id"}}},
            f"{ORDERS_TABLE} was dropped and recreated since the last refresh",
            False,
        ),
        (
            {"sources": {str(ORDERS_TABLE): {"version": 9, "table_id": "orders-id"}}},
            f"{ORDERS_TABLE} is at version 7, older than the recorded one",
            False,
        ),
    ],
)
def test_a_state_that_cannot_be_brought_forward_is_rebuilt(plan, fields, reason, names_the_state):
    state_record = None if "recorded" in fields else recorded(plan, **fields)
    found = decide(plan, pin(7), facts(recorded=state_record), RefreshSettings())
    assert found.action is Action.REBUILD
    assert reason in found.reason
    assert (str(STATE) in found.reason) == names_the_state


def test_a_retyped_column_the_model_reads_rebuilds(plan):
    columns = {"customer": "string", "qty": "int", "amount": "decimal(10,2)"}
    sources = {str(ORDERS_TABLE): {"version": 5, "table_id": "orders-id", "columns": columns}}
    retyped = {**columns, "qty": "bigint"}
    state_record = recorded(plan, sources=sources)
    plan = dataclasses.replace(plan, source_columns={ORDERS_TABLE: retyped})
    found = decide(plan, pin(7), facts(recorded=state_record), RefreshSettings())
    assert found.action is Action.REBUILD
    assert "a column it reads changed" in found.reason and "qty" in found.reason


def test_a_rename_in_the_range_rebuilds_because_the_feed_cannot_cross_it(plan):
    rename = SchemaCommit(6, "RENAME COLUMN", {"oldColumnPath": "x", "newColumnPath": "y"})
    found = decide(
        plan,
        pin(7),
        facts(plan, schema_commits={ORDERS_TABLE: (rename,)}),
        RefreshSettings(),
    )
    assert found.action is Action.REBUILD
    assert "cannot be read across a column rename or drop" in found.reason


def test_a_rebuilt_upstream_ivm_model_rebuilds(plan):
    upstream = UpstreamModel(state=TableName("a", "up__ivm_state"), view=None)  # type: ignore[arg-type]
    plan = dataclasses.replace(plan, upstreams={ORDERS_TABLE: upstream})
    found = decide(plan, pin(7, table_id="new-id"), facts(plan), RefreshSettings())
    assert (
        found.reason == f"the upstream ivm model {ORDERS_TABLE} was rebuilt since the last refresh"
    )


def timed(version: int, second: int, operation: str = "WRITE") -> CommitRows:
    """A commit as a pin read from DESCRIBE HISTORY alone sees it (no table id)."""
    return CommitRows(
        version, 1, operation=operation, committed_at=f"2026-11-29 10:00:{second:02d}.000"
    )


@pytest.mark.parametrize(
    ("commits", "reason"),
    [
        ([timed(5, 5), timed(6, 6), timed(7, 7)], None),
        # Version 5 committed later than the one recorded: the table was created again.
        ([timed(5, 40), timed(6, 41), timed(7, 42)], "was dropped and recreated"),
        (
            [timed(5, 5), timed(6, 6, "CREATE OR REPLACE TABLE AS SELECT"), timed(7, 7)],
            "was dropped and recreated",
        ),
    ],
)
def test_a_source_is_told_from_a_recreated_one_by_its_history(plan, commits, reason):
    sources = {str(ORDERS_TABLE): {"version": 5, "committed_at": "2026-11-29 10:00:05.000"}}
    snapshot = SourceSnapshot(ORDERS_TABLE, None, 7, recent_commits=tuple(commits))
    found = decide(
        plan,
        {ORDERS_TABLE: snapshot},
        facts(recorded=recorded(plan, sources=sources)),
        INCREMENTAL_ONLY,
    )
    if reason is None:
        assert found.action is Action.INCREMENTAL
    else:
        assert found.action is Action.REBUILD and reason in found.reason


AT_5 = "2026-11-29 10:00:05.000"
READ_COLUMNS = {"customer": "string", "qty": "int", "amount": "decimal(10,2)"}


def replaced_table(plan, *, size: int = 10_000, columns=READ_COLUMNS, recorded_at=AT_5):
    """A dbt `table` model rerun twice since the state's record at version 5."""
    # A replace's change-feed rows are unknown (delta.history.commit_rows).
    replace = "CREATE OR REPLACE TABLE AS SELECT"
    commits = (
        timed(5, 5),
        dataclasses.replace(timed(6, 6, replace), rows=None),
        dataclasses.replace(timed(7, 7, replace), rows=None),
    )
    snapshot = SourceSnapshot(ORDERS_TABLE, None, 7, size_bytes=size, recent_commits=commits)
    entry = {"version": 5, "committed_at": recorded_at, "columns": columns}
    state = recorded(plan, sources={str(ORDERS_TABLE): entry})
    return {ORDERS_TABLE: snapshot}, facts(recorded=state, wholesale={ORDERS_TABLE: "table"})


def test_a_replaced_table_model_is_read_as_the_difference_of_its_versions(plan):
    pinned, read = replaced_table(plan)
    found = decide(plan, pinned, read, SETTINGS)
    # Its size is unknown until the difference is summed (recipe: staged_net_changes).
    assert found.action is Action.INCREMENTAL and found.change is None
    assert found.ranges[ORDERS_TABLE] == VersionRange(5, 7, overwritten=True, replaced=True)
    summed = decide(plan, pinned, read, SETTINGS, net_rows={ORDERS_TABLE: 4})
    assert summed.action is Action.INCREMENTAL and summed.change.rows == 4
    same = decide(plan, pin(5), facts(plan, wholesale={ORDERS_TABLE: "table"}), SETTINGS)
    assert same.action is Action.NO_CHANGE


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"recorded_at": "2026-11-29 10:00:45.000"},
            "its log no longer holds the recorded version",
        ),
        (
            {"columns": {**READ_COLUMNS, "qty": "bigint"}},
            "the columns the model reads of it changed",
        ),
        ({"columns": None}, "the columns the model read of it were not recorded"),
    ],
)
def test_a_replaced_table_model_whose_difference_cannot_be_read_rebuilds(plan, changes, reason):
    found = decide(plan, *replaced_table(plan, **changes), SETTINGS)
    assert found.action is Action.REBUILD
    assert "is a dbt 'table' model, replaced as a whole by every run" in found.reason
    assert reason in found.reason


def test_a_large_replaced_table_model_read_alone_is_recomputed_under_auto(plan):
    # Its difference reads it twice; a recompute reads it once.
    pinned, read = replaced_table(plan, size=10**9)
    found = decide(plan, pinned, read, SETTINGS)
    assert found.action is Action.RECOMPUTE
    assert "reading the difference of the replaced" in found.reason
    assert decide(plan, pinned, read, INCREMENTAL_ONLY).action is Action.INCREMENTAL
    # Once summed, its exact size decides.
    summed = decide(plan, pinned, read, SETTINGS, net_rows={ORDERS_TABLE: 4})
    assert summed.action is Action.INCREMENTAL


def test_a_fallback_table_written_in_place_is_read_as_a_source(plan):
    sources = {str(ORDERS_TABLE): {"version": 5, "committed_at": AT_5}}
    commits = (timed(5, 5), timed(6, 6, "MERGE"), timed(7, 7, "SET TBLPROPERTIES"))
    snapshot = SourceSnapshot(ORDERS_TABLE, None, 7, recent_commits=commits)
    state = recorded(plan, sources=sources)
    in_place = facts(recorded=state, wholesale={ORDERS_TABLE: FALLBACK_TABLE})
    found = decide(plan, {ORDERS_TABLE: snapshot}, in_place, SETTINGS)
    assert found.action is Action.INCREMENTAL and not found.ranges[ORDERS_TABLE].overwritten


def test_a_fallback_table_built_anew_rebuilds_its_reader(plan):
    sources = {str(ORDERS_TABLE): {"version": 5, "committed_at": AT_5}}
    commits = (timed(5, 5), timed(6, 6, "CREATE OR REPLACE TABLE AS SELECT"))
    snapshot = SourceSnapshot(ORDERS_TABLE, None, 6, recent_commits=commits)
    state = recorded(plan, sources=sources)
    rebuilt = facts(recorded=state, wholesale={ORDERS_TABLE: FALLBACK_TABLE})
    found = decide(plan, {ORDERS_TABLE: snapshot}, rebuilt, SETTINGS)
    assert found.action is Action.REBUILD
    assert "is an ivm model built as a table by ivm_fallback" in found.reason
    assert "built anew since the last refresh" in found.reason


def test_no_commit_since_the_record_is_no_change(plan):
    found = decide(plan, pin(5), facts(plan), RefreshSettings())
    assert (found.action, found.reason) == (Action.NO_CHANGE, NO_SOURCE_COMMITS)
    assert found.ranges == {ORDERS_TABLE: VersionRange(recorded=5, pinned=5)}


def test_only_compactions_since_the_record_is_no_change(plan):
    compactions = [written(7, 0, preserves=True), written(6, 0, preserves=True)]
    found = decide(plan, pin(7, commits=compactions), facts(plan), RefreshSettings())
    assert (found.action, found.reason) == (Action.NO_CHANGE, ONLY_PRESERVING_COMMITS)


def test_a_window_model_without_a_common_partition_recomputes(plan):
    window_plan = dataclasses.replace(plan, view_class=plan.view_class.WINDOW, window_partition=())
    found = decide(window_plan, pin(7), facts(plan), INCREMENTAL_ONLY)
    assert (found.action, found.reason) == (Action.RECOMPUTE, NO_COMMON_PARTITION)
    assert found.choice is None


def test_a_change_is_applied_with_its_size_from_the_commits(plan):
    commits = [written(7, 3), written(6, 2)]
    found = decide(plan, pin(7, commits=commits), facts(plan), INCREMENTAL_ONLY)
    assert found.action is Action.INCREMENTAL
    assert found.change == strategy.ChangeSize(rows=5, source_bytes=10_000)
    assert found.ranges == {ORDERS_TABLE: VersionRange(recorded=5, pinned=7)}


def test_a_commit_without_row_counts_leaves_the_size_unknown(plan):
    found = decide(
        plan, pin(7, commits=[written(7, None), written(6, 2)]), facts(plan), RefreshSettings()
    )
    assert found.action is Action.INCREMENTAL and found.change is None
    assert "unknown" in found.reason


def test_strategy_recompute_recomputes_a_change(plan):
    settings = RefreshSettings(strategy=Strategy.RECOMPUTE)
    found = decide(plan, pin(7, commits=[written(7, 1), written(6, 1)]), facts(plan), settings)
    assert found.action is Action.RECOMPUTE and found.builds
    assert found.choice is not None and found.reason == "ivm_strategy is 'recompute'"


def test_auto_recomputes_a_change_its_history_says_is_cheaper(plan):
    history = [
        strategy.RefreshRecord(strategy.RECOMPUTE, 0, 10_000, 1.0),
        strategy.RefreshRecord(strategy.INCREMENTAL, 10, 10_000, 3.0),
        strategy.RefreshRecord(strategy.INCREMENTAL, 100_000, 10_000, 300.0),
    ]
    big = [written(7, 200_000), written(6, 0)]
    found = decide(plan, pin(7, commits=big), facts(plan, history=history), RefreshSettings())
    assert found.action is Action.RECOMPUTE
    assert "200,000 changed rows" in found.reason


def test_version_ranges_start_a_source_the_state_never_read_at_its_pin(plan):
    state_record = recorded(plan, sources={})
    ranges = version_ranges(pin(7), state_record)
    assert ranges == {ORDERS_TABLE: VersionRange(recorded=7, pinned=7)}


def test_a_models_dear_floor_recomputes_a_small_change_unless_ivm_models_read_it(plan):
    # 100 MB of sources, a 6-row change; built in 2 s, its one refresh took 5 s.
    size = 100 * 10**6
    pinned = pin(7, commits=[timed(6, 6), timed(7, 7)], size=size)
    history = (
        strategy.RefreshRecord(strategy.RECOMPUTE, 0, size, 2.0),
        strategy.RefreshRecord(strategy.INCREMENTAL, 6, size, 5.0),
    )
    found = decide(plan, pinned, facts(plan, history=history), RefreshSettings(change_feed=False))
    assert found.action is Action.RECOMPUTE
    assert "its cheapest incremental refresh took 5.0s" in found.reason
    # Read by ivm models (dbt's graph names them, or may: change_feed), it applies.
    read = decide(plan, pinned, facts(plan, history=history), RefreshSettings(change_feed=True))
    assert read.action is Action.INCREMENTAL
    assert "where ivm models read the state" in read.reason
