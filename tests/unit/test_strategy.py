"""ivm_strategy: sizing a change from commit metrics, and the incremental-or-recompute choice."""

from __future__ import annotations

import json

import pytest

from dbt.adapters.spark_ivm.delta.history import CommitRows, commit_rows
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot
from dbt.adapters.spark_ivm.refresh.strategy import (
    AUTO,
    BUILD,
    DEFAULT_ROW_COST_FACTOR,
    FLOOR_MARGIN,
    FLOOR_WEIGHED_BYTES,
    HANDOFF_FACTOR,
    HISTORY_LENGTH,
    INCREMENTAL,
    MIN_RECOMPUTE_ROWS,
    RECOMPUTE,
    ChangeSize,
    RefreshRecord,
    choose,
    estimate,
    history_with,
    parse_history,
)
from ivm_compiler import TableName

HISTORY_COLUMNS = ["version", "timestamp", "operation", "operationMetrics"]


def _history(*commits: tuple[int, str, dict[str, str]]) -> list[list]:
    # DESCRIBE HISTORY answers newest first; agate hands the metrics map over as JSON.
    return [
        [v, f"2026-11-29 10:00:{v:02d}", op, json.dumps(m)]
        for v, op, m in sorted(commits, reverse=True)
    ]


def test_commit_rows_count_change_feed_rows_per_operation():
    rows = commit_rows(
        HISTORY_COLUMNS,
        _history(
            (1, "WRITE", {"numOutputRows": "100", "numOutputBytes": "4000", "numFiles": "1"}),
            (2, "DELETE", {"numDeletedRows": "7", "numRemovedFiles": "1"}),
            (3, "UPDATE", {"numUpdatedRows": "5"}),
            (
                4,
                "MERGE",
                {
                    "numTargetRowsInserted": "3",
                    "numTargetRowsUpdated": "2",
                    "numTargetRowsDeleted": "1",
                    "numOutputRows": "900",  # copied rows too: not a change
                },
            ),
            (5, "OPTIMIZE", {"numRemovedFiles": "9"}),
            (6, "RESTORE", {"numRestoredFiles": "2"}),
            (7, "DELETE", {"numRemovedFiles": "3"}),  # no row count: unknown
        ),
    )
    by_version = {c.version: c for c in rows}
    assert [c.version for c in rows] == [7, 6, 5, 4, 3, 2, 1]
    assert by_version[1].rows == 100 and by_version[1].bytes_per_row == 40.0
    assert by_version[2].rows == 7
    assert by_version[3].rows == 10  # an update is a pre- and a post-image
    assert by_version[4].rows == 3 + 1 + 2 * 2
    assert by_version[5].rows == 0
    assert by_version[6].rows is None
    assert by_version[7].rows is None


def _snapshot(version: int, commits: tuple[CommitRows, ...]) -> SourceSnapshot:
    return SourceSnapshot(
        TableName("raw", "src"), "id", version, size_bytes=10_000, recent_commits=commits
    )


def test_a_window_is_sized_only_when_every_commit_in_it_is_known():
    commits = (
        CommitRows(5, 4),
        CommitRows(4, 6, bytes_per_row=50.0),
        CommitRows(3, None),
    )
    snapshot = _snapshot(5, commits)
    assert snapshot.changed_rows(after=3) == (10, 50.0)
    assert snapshot.changed_rows(after=4) == (4, None)
    assert snapshot.changed_rows(after=2) is None  # version 3's size is unknown
    assert snapshot.changed_rows(after=0) is None  # versions 1-2 were not read


def _records(*items: tuple[str, int, int, float]) -> list[RefreshRecord]:
    return [RefreshRecord(way, rows, size, seconds) for way, rows, size, seconds in items]


def test_without_a_recompute_in_the_history_auto_applies_the_change():
    change = ChangeSize(rows=10**9, source_bytes=10**6)
    assert estimate([], change) is None
    choice = choose(AUTO, [], change)
    assert choice.way == INCREMENTAL and "no recompute" in choice.reason


def test_defaults_scale_the_change_by_the_cost_of_recomputing():
    # A build took 10 s for 1e9 bytes: 1e-8 s per byte, 40 bytes per row by default.
    history = _records((RECOMPUTE, 0, 10**9, 10.0))
    small = estimate(history, ChangeSize(rows=10_000, source_bytes=10**9))
    assert small is not None
    assert small.recompute_seconds == pytest.approx(10.0)
    assert small.incremental_seconds == pytest.approx(1e-8 * 40 * DEFAULT_ROW_COST_FACTOR * 10_000)
    assert choose(AUTO, history, ChangeSize(rows=10_000, source_bytes=10**9)).way == INCREMENTAL
    # 1e9 bytes / 40 bytes per row = 25M rows; a tenth of that costs as much as recomputing.
    assert choose(AUTO, history, ChangeSize(rows=3_000_000, source_bytes=10**9)).way == RECOMPUTE


def test_the_history_of_incremental_refreshes_corrects_the_estimate():
    # This model's refreshes cost 2 s + 1 ms per changed row, and recomputing 30 s.
    history = _records(
        (RECOMPUTE, 0, 10**9, 30.0),
        (INCREMENTAL, 1_000, 10**9, 3.0),
        (INCREMENTAL, 5_000, 10**9, 7.0),
        (INCREMENTAL, 2_000, 10**9, 4.0),
    )
    found = estimate(history, ChangeSize(rows=9_000, source_bytes=10**9))
    assert found is not None and found.basis == "history"
    assert found.incremental_seconds == pytest.approx(11.0)
    assert choose(AUTO, history, ChangeSize(rows=9_000, source_bytes=10**9)).way == INCREMENTAL
    # 40,000 rows: about 42 s incremental against 30 s recompute.
    late = choose(AUTO, history, ChangeSize(rows=40_000, source_bytes=10**9))
    assert late.way == RECOMPUTE
    assert "incremental" in late.reason and "recompute" in late.reason


def test_far_beyond_the_history_the_slope_is_never_below_the_default():
    # Two small refreshes that cost the same: the fitted slope is 0.
    history = _records(
        (RECOMPUTE, 0, 10**9, 10.0),
        (INCREMENTAL, 100, 10**9, 2.0),
        (INCREMENTAL, 200, 10**9, 2.0),
    )
    near = estimate(history, ChangeSize(rows=300, source_bytes=10**9))
    assert near is not None and near.incremental_seconds == pytest.approx(2.0)
    far = estimate(history, ChangeSize(rows=10_000_000, source_bytes=10**9))
    assert far is not None and far.basis == "history, extrapolated"
    assert far.incremental_seconds > far.recompute_seconds


def test_refreshes_of_about_the_same_size_make_no_slope():
    # bench/ at SF 1: two batches of about 15k rows took 3.6 s and 2.4 s. A line
    # through them rose 0.2 s per row and put the next 12k rows at over a
    # minute, so auto recomputed (6.7 s) a model it refreshes in 2.4 s.
    history = _records(
        (RECOMPUTE, 0, 250 * 10**6, 6.7),
        (INCREMENTAL, 14_993, 250 * 10**6, 3.6),
        (INCREMENTAL, 14_987, 250 * 10**6, 2.4),
    )
    change = ChangeSize(rows=11_993, source_bytes=250 * 10**6)
    found = estimate(history, change)
    assert found is not None
    # A refresh of a larger change took 2.4 s: this one is taken to cost as much.
    assert found.basis == "history of as large a change"
    assert found.incremental_seconds == pytest.approx(2.4)
    assert choose(AUTO, history, change).way == INCREMENTAL
    # Past the largest change seen: its refresh plus the default for each row beyond it.
    default_per_row = 6.7 / (250 * 10**6) * 40 * DEFAULT_ROW_COST_FACTOR
    larger = estimate(history, ChangeSize(rows=20_000, source_bytes=250 * 10**6))
    assert larger is not None
    assert larger.basis == "history; default cost per row past the largest change seen"
    assert larger.incremental_seconds == pytest.approx(3.6 + default_per_row * (20_000 - 14_993))
    # Once a change twice the size of another was seen, the line is used.
    wider = [*history, *_records((INCREMENTAL, 30_000, 250 * 10**6, 4.0))]
    assert estimate(wider, change).basis == "history"  # type: ignore[union-attr]


def test_fixed_strategies_and_unknown_sizes():
    history = _records((RECOMPUTE, 0, 10, 1.0))
    huge = ChangeSize(rows=10**12, source_bytes=10)
    assert choose(INCREMENTAL, history, huge).way == INCREMENTAL
    assert choose(RECOMPUTE, history, ChangeSize(rows=1, source_bytes=10)).way == RECOMPUTE
    unknown = choose(AUTO, history, None)
    assert unknown.way == INCREMENTAL and "unknown" in unknown.reason


def test_the_history_keeps_the_newest_records_and_survives_bad_text():
    history: list[RefreshRecord] = []
    for i in range(HISTORY_LENGTH + 3):
        history = parse_history(history_with(history, RefreshRecord(INCREMENTAL, i, 100, 1.0)))
    assert len(history) == HISTORY_LENGTH
    assert history[-1].changed_rows == HISTORY_LENGTH + 2
    assert history[0].changed_rows == 3
    assert parse_history("not json") == []
    assert parse_history('[{"unexpected": 1}]') == []
    assert parse_history(None) == []


def test_small_changes_are_always_applied():
    # A tiny table: recomputing costs what any refresh costs, so the estimates
    # are noise; a change below MIN_RECOMPUTE_ROWS is applied anyway.
    history = _records((RECOMPUTE, 0, 2_000, 3.0), (INCREMENTAL, 4, 2_000, 2.5))
    change = ChangeSize(rows=MIN_RECOMPUTE_ROWS - 1, source_bytes=2_000)
    found = estimate(history, change)
    assert found is not None and found.incremental_seconds > found.recompute_seconds
    choice = choose(AUTO, history, change)
    assert choice.way == INCREMENTAL
    # The log says why the dearer way was taken.
    assert choice.reason.endswith(
        "; a change under 10,000 rows is applied unless its cheapest incremental refresh "
        "took 1.5 times the recompute"
    )


def test_a_small_change_is_recomputed_where_the_models_floor_is_dearer():
    # The worked example's customers_to_chase at 2 M lines: built in 2.4 s over
    # 23 MB of sources, its refresh of 5,000 changed lines took 5.5 s.
    size = 23 * 10**6
    change = ChangeSize(rows=5_000, source_bytes=size)
    built = _records((RECOMPUTE, 0, size, 2.4))
    # Without an incremental refresh seen, a small change is applied.
    assert choose(AUTO, built, change).way == INCREMENTAL
    history = [*built, *_records((INCREMENTAL, 5_000, size, 5.5))]
    choice = choose(AUTO, history, change)
    assert choice.way == RECOMPUTE
    assert "its cheapest incremental refresh took 5.5s" in choice.reason
    # Within FLOOR_MARGIN of the recompute, the floor is run-to-run spread.
    close = [*built, *_records((INCREMENTAL, 5_000, size, FLOOR_MARGIN * 2.4 - 0.1))]
    assert choose(AUTO, close, change).way == INCREMENTAL
    # The cheapest incremental refresh is the floor: one cheap run keeps it applied.
    mixed = [*history, *_records((INCREMENTAL, 4_000, size, 3.0))]
    assert choose(AUTO, mixed, change).way == INCREMENTAL
    # Where ivm models read it, a recompute also hands them its change, which
    # the builds it is estimated from never paid: applied.
    read = choose(AUTO, history, change, read_by_ivm_models=True)
    assert read.way == INCREMENTAL and "where ivm models read the state" in read.reason
    # Sources of at most FLOOR_WEIGHED_BYTES (16 MB): which way is dearer is chance, applied.
    small = FLOOR_WEIGHED_BYTES
    tiny = [RefreshRecord(r.way, r.changed_rows, small, r.seconds) for r in history]
    assert choose(AUTO, tiny, ChangeSize(rows=5_000, source_bytes=small)).way == INCREMENTAL


def test_a_day_like_the_last_is_estimated_at_the_last_days_seconds():
    # The warehouse at scale 6000 (2026-12-07, 3f5e202): fct_order_regions was
    # built in 49.4 s and refreshed a day's batch in 29.9 s. The next day's
    # change, about as large, was estimated at the floor plus the default per
    # row for every row (134.3 s, its own rows counted twice), recomputed in
    # 68.8 s. Estimated from the day before, it is applied.
    size = 900 * 10**6
    history = _records((BUILD, 0, size, 49.4), (INCREMENTAL, 52_000, size, 29.9))
    change = ChangeSize(rows=51_000, source_bytes=size)
    found = estimate(history, change)
    assert found is not None and found.incremental_seconds == pytest.approx(29.9)
    assert choose(AUTO, history, change).way == INCREMENTAL


def test_a_state_ivm_models_read_is_estimated_to_recompute_at_a_multiple_of_its_builds():
    # fct_payments on the warehouse (its readers four ivm models): built in
    # 11.5 s, refreshed in 30.0 s; a recompute estimated from the build
    # (11.3 s) took 59.0 s, handing its change on (in a batch run under a
    # compilation recording, which slowed every model).
    size = 300 * 10**6
    history = _records((BUILD, 0, size, 11.5), (INCREMENTAL, 30_000, size, 30.0))
    change = ChangeSize(rows=30_000, source_bytes=size)
    alone = estimate(history, change)
    read = estimate(history, change, read_by_ivm_models=True)
    assert alone is not None and read is not None
    assert read.recompute_seconds == pytest.approx(HANDOFF_FACTOR * alone.recompute_seconds)
    assert choose(AUTO, history, change).way == RECOMPUTE
    assert choose(AUTO, history, change, read_by_ivm_models=True).way == INCREMENTAL
    # Without an incremental refresh seen, a changed row costs what computing
    # ten rows' worth of source does, read or not: read, a change of a fifth of
    # the sources' rows is applied; alone, recomputed.
    fifth = ChangeSize(rows=size // 40 // 5, source_bytes=size)
    built = history[:1]
    assert choose(AUTO, built, fifth).way == RECOMPUTE
    assert choose(AUTO, built, fifth, read_by_ivm_models=True).way == INCREMENTAL
    # Once it has recomputed, its own recomputes' seconds are the estimate.
    recomputed = [*history, *_records((RECOMPUTE, 30_000, size, 59.0))]
    again = estimate(recomputed, change, read_by_ivm_models=True)
    assert again is not None and again.recompute_seconds == pytest.approx(59.0)
    # A changed row's default cost stays the build's computation, not the hand-off's.
    past = ChangeSize(rows=60_000, source_bytes=size)
    before, after = estimate(history, past), estimate(recomputed, past, read_by_ivm_models=True)
    assert before is not None and after is not None
    assert after.incremental_seconds == pytest.approx(before.incremental_seconds)
