"""delta/: commit metadata, history parsing and error classification, without Spark."""

from __future__ import annotations

import dataclasses
import json
import random
from decimal import Decimal

import pytest

from dbt.adapters.spark_ivm.delta.confs import (
    USER_METADATA_CONF,
    reset_commit_metadata,
    set_commit_metadata,
    under,
)
from dbt.adapters.spark_ivm.delta.errors import is_change_history_unavailable, is_concurrent_refresh
from dbt.adapters.spark_ivm.delta.history import (
    ESTIMATED_ROWS_KEY,
    METADATA_MARKER,
    RECOMPUTED_MARKER,
    CommitRows,
    commit_rows,
    describe_history,
)
from dbt.adapters.spark_ivm.delta.records import RecordedState, commit_metadata, parse_recorded
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, describe_detail
from dbt.adapters.spark_ivm.refresh import decision
from ivm_compiler import TableName
from ivm_compiler.reads import VersionRange

STATE = TableName(db="analytics", name="orders_by_customer__ivm_state")
OTHER_STATE = TableName(db="analytics", name="revenue__ivm_state")
SOURCE = TableName(db="shop", name="orders")
# DESCRIBE HISTORY's columns, in Delta's order (trimmed of the ones the refresh never reads).
HISTORY_COLUMNS = [
    "version",
    "timestamp",
    "userName",
    "operation",
    "operationMetrics",
    "userMetadata",
]


def refresh_metadata(state: TableName, refresh_id: str, fingerprint: str, version: int) -> str:
    """userMetadata as Delta stores it after the refresh's SET statement."""
    snapshot = SourceSnapshot(table=SOURCE, table_id="tid-1", version=version)
    metadata = commit_metadata(refresh_id, state, fingerprint, [snapshot])
    return json.dumps(metadata, sort_keys=True)


def history_row(version: object, operation: str, user_metadata: object) -> list[object]:
    return [version, "2024-05-01 10:00:00", "dbt", operation, "{}", user_metadata]


# -- parse_recorded -------------------------------------------------------------


def mixed_history() -> list[list[object]]:
    return [
        # Newest first, as DESCRIBE HISTORY answers; the test shuffles them anyway.
        history_row(12, "MERGE", refresh_metadata(OTHER_STATE, "r-foreign", "fp-other", 40)),
        history_row(11, "SET TBLPROPERTIES", "not json at all"),
        history_row(10, "WRITE", json.dumps({"team": "finance", "state": str(STATE)})),
        history_row(
            9, "MERGE", json.dumps({"spark_ivm": 2, "state": str(STATE), "fingerprint": "future"})
        ),
        history_row(8, "WRITE", json.dumps(["spark_ivm", 1])),
        history_row(7, "OPTIMIZE", None),
        history_row(6, "VACUUM END", ""),
        history_row(5, "MERGE", refresh_metadata(STATE, "r-new", "fp-current", 31)),
        history_row(4, "MERGE", refresh_metadata(STATE, "r-old", "fp-current", 30)),
        history_row(
            0, "CREATE OR REPLACE TABLE AS SELECT", refresh_metadata(STATE, "r-first", "fp-old", 1)
        ),
    ]


def test_parse_recorded_takes_the_newest_refresh_commit_of_this_state() -> None:
    rows = mixed_history()
    random.Random(7).shuffle(rows)
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, rows)
    assert recorded == RecordedState(
        state_version=5,
        fingerprint="fp-current",
        sources={"shop.orders": {"version": 31, "table_id": "tid-1"}},
        # Commits after the refresh that may have changed rows; OPTIMIZE, VACUUM and
        # property changes leave the data as it was.
        later_writes=(
            "WRITE at version 8",
            "MERGE at version 9",
            "WRITE at version 10",
            "MERGE at version 12",
        ),
        # The guard row holds the id of the refresh that made that commit.
        guard="r-new",
    )


def test_parse_recorded_without_later_writes() -> None:
    rows = [
        history_row(7, "OPTIMIZE", None),
        history_row(6, "SET TBLPROPERTIES", None),
        history_row(5, "MERGE", refresh_metadata(STATE, "r-new", "fp-current", 31)),
    ]
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, rows)
    assert recorded is not None and recorded.later_writes == ()


def test_parse_recorded_reads_mixed_case_names_of_older_commits() -> None:
    # Commits written before TableName lower-cased its parts spell the state
    # and the sources as the model named them; they still count as this state's.
    metadata = json.loads(refresh_metadata(STATE, "r-old", "fp", 31))
    metadata["state"] = str(STATE).upper()
    metadata["sources"] = {"Shop.Orders": metadata["sources"]["shop.orders"]}
    rows = [history_row(5, "MERGE", json.dumps(metadata))]
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, rows)
    assert recorded is not None and recorded.state_version == 5
    assert recorded.sources == {"shop.orders": {"version": 31, "table_id": "tid-1"}}


def test_parse_recorded_sorts_versions_as_numbers() -> None:
    # Versions may arrive as text or Decimal (agate); "10" sorts before "9" as text.
    rows = [
        history_row("9", "MERGE", refresh_metadata(STATE, "r9", "fp-9", 90)),
        history_row(Decimal(10), "MERGE", refresh_metadata(STATE, "r10", "fp-10", 100)),
    ]
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, rows)
    assert recorded is not None
    assert (recorded.state_version, recorded.fingerprint) == (10, "fp-10")


def test_parse_recorded_finds_columns_by_name() -> None:
    columns = ["userMetadata", "operation", "version"]
    rows = [[refresh_metadata(STATE, "r", "fp", 3), "MERGE", 2]]
    recorded = parse_recorded(STATE, columns, rows)
    assert recorded is not None and recorded.state_version == 2


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([], id="empty_history"),
        pytest.param(
            [row for row in mixed_history() if row[0] in (6, 7, 8, 9, 10, 11, 12)],
            id="only_foreign_and_garbage",
        ),
    ],
)
def test_parse_recorded_without_a_refresh_commit(rows: list[list[object]]) -> None:
    assert parse_recorded(STATE, HISTORY_COLUMNS, rows) is None


def test_parse_recorded_ignores_the_same_table_name_in_another_schema() -> None:
    elsewhere = TableName(db="staging", name=STATE.name)
    rows = [history_row(3, "MERGE", refresh_metadata(elsewhere, "r", "fp", 1))]
    assert parse_recorded(STATE, HISTORY_COLUMNS, rows) is None


# -- statements -----------------------------------------------------------------


def test_set_commit_metadata_escapes_semicolons() -> None:
    # SET takes its value up to the first ';' (Spark's SET parser); a table name
    # with a ';' in it must not end the statement.
    odd = TableName(db="analytics", name="a;b")
    snapshot = SourceSnapshot(table=TableName(db="shop", name="x;y"), table_id="t;1", version=3)
    metadata = commit_metadata("r-1", odd, "fp", [snapshot])
    statement = set_commit_metadata(metadata)
    prefix = f"SET {USER_METADATA_CONF}="
    assert statement.startswith(prefix)
    assert ";" not in statement
    value = statement[len(prefix) :]
    assert json.loads(value) == metadata
    # And what Delta records is read back by parse_recorded.
    recorded = parse_recorded(odd, HISTORY_COLUMNS, [history_row(1, "MERGE", value)])
    assert recorded == RecordedState(
        state_version=1,
        fingerprint="fp",
        sources={"shop.x;y": {"version": 3, "table_id": "t;1"}},
        guard="r-1",
    )


def test_set_commit_metadata_is_ascii_and_one_line() -> None:
    statement = set_commit_metadata({"spark_ivm": 1, "state": "analytics.café\nbar"})
    assert statement.isascii()
    assert "\n" not in statement


def test_commit_metadata_shape() -> None:
    snapshot = SourceSnapshot(table=SOURCE, table_id="tid-9", version=12)
    assert commit_metadata("r-7", STATE, "fp-7", [snapshot]) == {
        "spark_ivm": 1,
        "refresh_id": "r-7",
        "state": "analytics.orders_by_customer__ivm_state",
        "fingerprint": "fp-7",
        "sources": {"shop.orders": {"version": 12, "table_id": "tid-9"}},
        "guard": "r-7",
    }


def test_a_commit_that_leaves_the_guard_row_records_the_guard_it_left() -> None:
    # A window refresh whose change touches no partition commits no data: the
    # guard row still holds the previous refresh's id, and the next MERGE must
    # expect that one.
    snapshot = SourceSnapshot(table=SOURCE, table_id="tid-9", version=13)
    metadata = commit_metadata("r-8", STATE, "fp-7", [snapshot], guard="r-7")
    value = json.dumps(metadata, sort_keys=True)
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, [history_row(6, "SET TBLPROPERTIES", value)])
    assert recorded is not None and recorded.guard == "r-7"
    # A refresh commit from before the guard row: no guard (the refresh rebuilds).
    old = json.dumps({k: v for k, v in metadata.items() if k != "guard"})
    recorded = parse_recorded(STATE, HISTORY_COLUMNS, [history_row(6, "MERGE", old)])
    assert recorded is not None and recorded.guard is None


@pytest.mark.parametrize(
    "message",
    [
        "[USER_RAISED_EXCEPTION] ivm guard: analytics.m__ivm_state no longer holds refresh r-1",
        # Spark 3.5's RAISE_ERROR, as its cause chain shows it (no error class).
        (
            "[TASK_WRITE_FAILED] Task failed while writing rows to file:/w/m__ivm_state.\n"
            "Caused by: java.lang.RuntimeException: ivm guard: analytics.m__ivm_state no longer"
        ),
        "io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND] Files were added",
        "[DELTA_CONCURRENT_DELETE_READ] This transaction attempted to read one or more files",
        "io.delta.exceptions.ConcurrentDeleteDeleteException: files were deleted",
        "io.delta.exceptions.MetadataChangedException: [DELTA_METADATA_CHANGED]",
    ],
)
def test_concurrent_refresh_errors_are_recognised(message: str) -> None:
    assert is_concurrent_refresh(Exception(message))


@pytest.mark.parametrize(
    "message",
    [
        "[DIVIDE_BY_ZERO] Division by zero",
        "[DELTA_MISSING_CHANGE_DATA] Error getting change data for range [3, 5]",
        "[USER_RAISED_EXCEPTION] a model's own raise_error",
        "java.lang.RuntimeException: a model's own raise_error on Spark 3.5",
    ],
)
def test_other_errors_are_not_concurrent_refreshes(message: str) -> None:
    assert not is_concurrent_refresh(Exception(message))


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        (describe_detail(SOURCE), "DESCRIBE DETAIL `shop`.`orders`"),
        (
            describe_history(STATE),
            "DESCRIBE HISTORY `analytics`.`orders_by_customer__ivm_state`",
        ),
        (describe_history(SOURCE, limit=1), "DESCRIBE HISTORY `shop`.`orders` LIMIT 1"),
        (
            describe_detail(TableName(db="we`ird", name="t", catalog="spark_catalog")),
            "DESCRIBE DETAIL `spark_catalog`.`we``ird`.`t`",
        ),
        (reset_commit_metadata(), "RESET spark.databricks.delta.commitInfo.userMetadata"),
    ],
)
def test_statements(statement: str, expected: str) -> None:
    assert statement == expected


# -- under -----------------------------------------------------------------------


class Recording:
    def __init__(self) -> None:
        self.executed: list[str] = []

    def execute(self, sql: str) -> None:
        self.executed.append(sql)


def test_a_block_nested_in_another_gives_back_the_enclosing_value() -> None:
    runner = Recording()
    with under(runner, {"a": "1", "b": "2"}):
        with under(runner, {"a": "1", "b": "3", "c": "4"}):
            runner.execute("inner")
        runner.execute("outer")
    # "a" is already 1: neither set nor given back by the inner block.
    assert runner.executed == [
        "SET a=1",
        "SET b=2",
        "SET b=3",
        "SET c=4",
        "inner",
        "SET b=2",
        "RESET c",
        "outer",
        "RESET a",
        "RESET b",
    ]


def test_a_block_on_another_runner_sets_its_own_confs() -> None:
    # Another runner may be another session: the enclosing block set nothing there.
    outer, other = Recording(), Recording()
    with under(outer, {"a": "1"}), under(other, {"a": "1"}):
        pass
    assert outer.executed == ["SET a=1", "RESET a"]
    assert other.executed == ["SET a=1", "RESET a"]


def test_a_failed_block_gives_its_confs_back_and_leaves_no_block_open() -> None:
    runner = Recording()
    with pytest.raises(RuntimeError, match="failed"), under(runner, {"a": "1"}):
        raise RuntimeError("failed")
    with under(runner, {"a": "1"}):
        pass
    assert runner.executed == ["SET a=1", "RESET a", "SET a=1", "RESET a"]


# -- is_change_history_unavailable ------------------------------------------------

# Texts of the errors Spark 4.0.1 + Delta 4.0.1 raised for each situation, as str() of
# the Python exception in the embedded session (wrapped lines and Java frames trimmed).
HISTORY_GONE = [
    pytest.param(
        "[DELTA_MISSING_CHANGE_DATA] Error getting change data for range [0 , 4] as change data "
        "was not\nrecorded for version [0]. If you've enabled change data feed on this table,\n"
        "use `DESCRIBE HISTORY` to see when it was first enabled.\nOtherwise, to start recording "
        "change data, use `ALTER TABLE table_name SET TBLPROPERTIES\n"
        "(delta.enableChangeDataFeed=true)`.",
        id="cdf_not_recorded_for_the_window",
    ),
    pytest.param(
        "Cannot time travel Delta table to version 1. Available versions: [2, 6].",
        id="version_expired",
    ),
    pytest.param(
        "An error occurred while calling o229.collectToPython.\n: org.apache.spark.SparkException: "
        "[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file "
        "file:/warehouse/s.db/h/_change_data/cdc-00000-75c3e431.c000.snappy.parquet. File does not "
        "exist. It is possible the underlying files have been updated. SQLSTATE: KD001\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.fileNotExistError(...)\n"
        "Caused by: java.io.FileNotFoundException: File file:/warehouse/s.db/h/_change_data/"
        "cdc-00000-75c3e431.c000.snappy.parquet does not exist",
        id="vacuumed_change_file_with_java_cause",
    ),
    pytest.param(
        "An error occurred while calling o50.sql.\n: org.apache.spark.sql.delta."
        "DeltaFileNotFoundException: [DELTA_EMPTY_DIRECTORY] No file found in the directory: "
        "file:/warehouse/s.db/h/_delta_log.",
        id="log_files_removed",
    ),
    pytest.param(
        "Error running query: [FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading "
        "file file:/warehouse/s.db/h/_change_data/cdc-00000-75c3e431.c000.snappy.parquet. File "
        "does not exist. It is possible the underlying files have been updated. SQLSTATE: KD001",
        # Without the Java cause chain, as the Thrift server reports errors.
        id="vacuumed_change_file_top_message_only",
    ),
    pytest.param(
        "[DELTA_VERSIONS_NOT_CONTIGUOUS] Versions ([0, 1, 3]) are not contiguous.  A gap in the "
        "delta log between versions 1 and 3 was detected while trying to load version 3.",
        id="versions_not_contiguous",
    ),
]

NOT_HISTORY = [
    pytest.param(
        "[TABLE_OR_VIEW_NOT_FOUND] The table or view `shop`.`orders` cannot be found. "
        "SQLSTATE: 42P01",
        id="table_not_found",
    ),
    pytest.param(
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
        "`qty` cannot be resolved. SQLSTATE: 42703",
        id="unresolved_column",
    ),
    pytest.param("[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012", id="divide_by_zero"),
    pytest.param(
        "[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ConcurrentAppendException: Files were added to the "
        "root of the table by a concurrent update. Please try the operation again.",
        id="concurrent_append",
    ),
    pytest.param(
        "[DELTA_INVALID_CDC_RANGE] CDC range from start 9 to end 3 was invalid. End cannot be "
        "before start.",
        id="invalid_cdc_range",
    ),
    pytest.param(
        "Provided Start version(50) for reading change data is invalid. Start version cannot be "
        "greater than the latest version of the table(6).",
        id="start_beyond_latest",
    ),
]


@pytest.mark.parametrize("text", HISTORY_GONE)
def test_change_history_unavailable(text: str) -> None:
    assert is_change_history_unavailable(RuntimeError(text))


@pytest.mark.parametrize("text", NOT_HISTORY)
def test_other_errors_are_not_change_history(text: str) -> None:
    assert not is_change_history_unavailable(RuntimeError(text))


def test_classification_ignores_case() -> None:
    assert is_change_history_unavailable(Exception("CANNOT TIME TRAVEL delta table"))


def _history(*operations: str, metrics: dict | None = None) -> tuple[CommitRows, ...]:
    """Commits 1..n with these operations, a second apart, as DESCRIBE HISTORY gives them."""
    columns = ["version", "timestamp", "operation", "operationMetrics"]
    rows = [
        [v, f"2026-11-29 10:00:{v:02d}.5", op, metrics or {"numOutputRows": "3"}]
        for v, op in enumerate(operations, start=1)
    ]
    return commit_rows(columns, rows)


def test_a_window_of_compactions_only_preserves_data() -> None:
    pin = SourceSnapshot(
        TableName("db", "src"),
        "id",
        4,
        recent_commits=_history("WRITE", "OPTIMIZE", "VACUUM START", "VACUUM END"),
    )
    assert pin.only_preserving_data_after(1)
    assert not pin.only_preserving_data_after(0)  # the WRITE at version 1 is in the window


def test_a_window_not_covered_by_the_history_read_is_not_assumed_empty() -> None:
    pin = SourceSnapshot(TableName("db", "src"), "id", 9, recent_commits=_history("OPTIMIZE"))
    assert not pin.only_preserving_data_after(0)


def test_commit_metadata_records_the_columns_read() -> None:
    source = SourceSnapshot(TableName("db", "Src"), "id", 3)
    metadata = commit_metadata(
        "r",
        TableName("db", "m__ivm_state"),
        "f",
        [source],
        columns_read={TableName("db", "src"): {"k": "int"}},
    )
    # Table names are lower-cased (Spark's catalog is case-insensitive), so the
    # model's `Src` and the lineage's `src` are one source.
    assert metadata["sources"]["db.src"] == {
        "version": 3,
        "table_id": "id",
        "columns": {"k": "int"},
    }


# -- same_table and size_after: a pin read without DESCRIBE DETAIL ----------------


def _pin(*operations: str, version: int | None = None, **metrics: str) -> SourceSnapshot:
    commits = _history(*operations, metrics=metrics or None)
    return SourceSnapshot(
        TableName("db", "src"),
        None,
        len(operations) if version is None else version,
        recent_commits=commits,
        history_from=1,
    )


def test_the_table_recorded_is_told_by_its_commit_time() -> None:
    pin = _pin("WRITE", "WRITE", "DELETE")
    assert pin.same_table({"version": 2, "committed_at": "2026-11-29 10:00:02.500"})
    # Delta may move a commit 1 ms on to keep a history's times increasing.
    assert pin.same_table({"version": 2, "committed_at": "2026-11-29 10:00:02.501"})
    # The same version committed seconds apart: a table dropped and created again.
    assert pin.same_table({"version": 2, "committed_at": "2026-11-29 09:59:40.000"}) is False


def test_a_create_or_replace_since_the_recorded_version_is_another_table() -> None:
    pin = _pin("WRITE", "CREATE OR REPLACE TABLE AS SELECT", "WRITE")
    assert pin.same_table({"version": 1, "committed_at": "2026-11-29 10:00:01.500"}) is False
    assert pin.same_table({"version": 2, "committed_at": "2026-11-29 10:00:02.500"})


def test_a_recorded_version_past_the_table_is_another_table() -> None:
    pin = _pin("WRITE", "WRITE")
    assert pin.same_table({"version": 5, "committed_at": "2026-11-29 10:00:01.500"}) is False


def test_without_the_recorded_commit_the_ids_decide_or_nothing_does() -> None:
    pin = _pin("WRITE", "WRITE")
    # A state recorded before commit times were: only an id can tell.
    assert pin.same_table({"version": 1, "table_id": "a"}) is None
    identified = dataclasses.replace(pin, table_id="a")
    assert identified.same_table({"version": 1, "table_id": "a"})
    assert identified.same_table({"version": 1, "table_id": "b"}) is False
    # A recorded version older than the commits read.
    assert pin.same_table({"version": 0, "committed_at": "2026-11-29 10:00:00.500"}) is None


def test_the_size_is_the_recorded_one_plus_the_bytes_since() -> None:
    deletes = _pin("DELETE", "DELETE", numAddedBytes="100", numRemovedBytes="400")
    assert deletes.size_after({"version": 0, "size_bytes": 1000}) == 400
    assert deletes.size_after({"version": 1, "size_bytes": 1000}) == 700
    unread = _pin("DELETE", "DELETE", version=4, numAddedBytes="1", numRemovedBytes="1")
    assert unread.size_after({"version": 1, "size_bytes": 1000}) is None  # 3 and 4 not read
    assert deletes.size_after({"version": 2, "size_bytes": 1000}) == 1000
    assert deletes.size_after({"version": 1}) is None  # no size recorded
    merges = _pin("MERGE", "MERGE", numTargetBytesAdded="50", numTargetBytesRemoved="20")
    assert merges.size_after({"version": 1, "size_bytes": 10}) == 40
    appends = _pin("WRITE", "WRITE", numOutputBytes="64")
    assert appends.size_after({"version": 1, "size_bytes": 10}) == 74


def test_an_overwrite_without_its_removed_bytes_leaves_the_size_unknown() -> None:
    overwrite = _pin("WRITE", "WRITE", numOutputBytes="64", numRemovedFiles="3")
    assert overwrite.size_after({"version": 1, "size_bytes": 10}) is None
    unknown = _pin("WRITE", "RESTORE", numOutputBytes="64")
    assert unknown.size_after({"version": 1, "size_bytes": 10}) is None
    properties = _pin("WRITE", "SET TBLPROPERTIES", numOutputBytes="64")
    assert properties.size_after({"version": 1, "size_bytes": 10}) == 10
    # An UPDATE's numAddedBytes did not add up to the table's size on this
    # runtime: it is taken to leave the size as it was.
    update = _pin("WRITE", "UPDATE", numAddedBytes="64", numRemovedBytes="32")
    assert update.size_after({"version": 1, "size_bytes": 10}) == 10


def test_a_create_or_replace_sets_the_size_to_what_it_wrote() -> None:
    # As Delta reports one: what it wrote, and the bytes of the table it replaced.
    rebuilt = _pin(
        "WRITE", "CREATE OR REPLACE TABLE AS SELECT", numOutputBytes="64", numRemovedBytes="1000"
    )
    assert rebuilt.size_after({"version": 1, "size_bytes": 1000}) == 64
    emptied = _pin("WRITE", "CREATE OR REPLACE TABLE", numOutputBytes="64")
    assert emptied.size_after({"version": 1, "size_bytes": 1000}) == 0


def test_a_short_history_sizes_the_table_from_its_creation() -> None:
    columns = ["version", "timestamp", "operation", "operationMetrics"]
    rows = [
        [0, "2026-11-29 10:00:00", "CREATE TABLE", {}],
        [1, "2026-11-29 10:00:01", "WRITE", {"numOutputBytes": "64"}],
        [2, "2026-11-29 10:00:02", "DELETE", {"numAddedBytes": "8", "numRemovedBytes": "32"}],
    ]
    commits = commit_rows(columns, rows)
    whole = SourceSnapshot(TableName("db", "src"), None, 2, recent_commits=commits)
    assert whole.size_from_creation() == 64 - 24
    # Without version 0 among the commits read, the bytes before them are unknown.
    later = dataclasses.replace(whole, recent_commits=commits[:2], history_from=1)
    assert later.size_from_creation() is None


def test_commit_metadata_records_what_tells_the_table_and_its_size() -> None:
    pin = dataclasses.replace(_pin("WRITE", "WRITE"), size_bytes=77)
    entry = commit_metadata("r", STATE, "f", [pin])["sources"]["db.src"]
    assert entry == {"version": 2, "committed_at": "2026-11-29 10:00:02.500", "size_bytes": 77}
    assert pin.same_table(entry)


# -- an overwrite in a window: its change read net (reads.net_rows) ---------------


def _overwrites(parameters: list[object]) -> SourceSnapshot:
    """Commits 1..n, each a WRITE with these operation parameters."""
    columns = ["version", "timestamp", "operation", "operationParameters", "operationMetrics"]
    rows = [
        [v, f"2026-12-01 10:00:{v:02d}.5", "WRITE", p, {"numOutputRows": "40"}]
        for v, p in enumerate(parameters, start=1)
    ]
    commits = commit_rows(columns, rows)
    return SourceSnapshot(TableName("db", "m__ivm_state"), None, len(rows), recent_commits=commits)


def test_an_overwrite_is_told_from_its_mode_as_a_map_or_as_thrifts_text() -> None:
    session = _overwrites([{"mode": "Append"}, {"mode": "Overwrite", "partitionBy": "[]"}])
    thrift = _overwrites(['{"mode":"Append"}', '{"mode":"Overwrite","partitionBy":"[]"}'])
    for pin in (session, thrift):
        assert pin.overwritten(0) and pin.overwritten(1)
        assert not pin.overwritten(2)  # nothing after the overwrite
        # Its metrics count the rows written, not the rows it removed: the
        # window's change is of unknown size (ivm_strategy auto applies it).
        assert pin.changed_rows(1) is None
        assert pin.changed_rows(0) is None
    appends = _overwrites([{"mode": "Append"}, {"mode": "Append"}])
    assert not appends.overwritten(0)
    assert appends.changed_rows(0) == (80, None)


def test_a_version_written_whole_is_told_from_one_appended_to() -> None:
    # A log upstream at such a version is read without summing (recipe._reading_unsummed).
    overwritten = _overwrites([{"mode": "Append"}, {"mode": "Overwrite"}])
    assert overwritten.written_whole()
    assert not dataclasses.replace(overwritten, version=1).written_whole()
    assert not _overwrites([{"mode": "Overwrite"}, {"mode": "Append"}]).written_whole()
    # A compaction after the overwrite keeps its rows; history not reaching it says no.
    columns = ["version", "timestamp", "operation", "operationParameters", "operationMetrics"]
    rows = [
        [1, "2026-12-01 10:00:01.5", "CREATE OR REPLACE TABLE AS SELECT", {}, {}],
        [2, "2026-12-01 10:00:02.5", "OPTIMIZE", {}, {}],
    ]
    built = SourceSnapshot(STATE, None, 2, recent_commits=commit_rows(columns, rows))
    assert built.written_whole()
    assert not dataclasses.replace(built, recent_commits=built.recent_commits[:1]).written_whole()


def test_a_window_the_history_does_not_reach_is_not_taken_as_overwritten() -> None:
    pin = dataclasses.replace(_overwrites([{"mode": "Overwrite"}]), version=3)
    assert not pin.overwritten(0)  # versions 2 and 3 were not read: read the change as it is


def test_version_ranges_mark_an_overwritten_upstream() -> None:
    pin = _overwrites([{"mode": "Append"}, {"mode": "Overwrite"}])
    recorded = RecordedState(7, "f", {"db.m__ivm_state": {"version": 1}})
    (found,) = decision.version_ranges({pin.table: pin}, recorded).values()
    assert (found.recorded, found.pinned, found.overwritten) == (1, 2, True)
    recorded = RecordedState(7, "f", {"db.m__ivm_state": {"version": 2}})
    (found,) = decision.version_ranges({pin.table: pin}, recorded).values()
    assert not found.overwritten


def _recompute_overwrites(metadata: list[object]) -> SourceSnapshot:
    """Commits 1..n: an append, then overwrites whose userMetadata is each of `metadata`."""
    columns = [
        "version",
        "timestamp",
        "operation",
        "operationParameters",
        "operationMetrics",
        "userMetadata",
    ]
    rows = [
        [1, "2026-12-01 10:00:01.5", "WRITE", {"mode": "Append"}, {"numOutputRows": "40"}, None]
    ]
    for v, m in enumerate(metadata, start=2):
        text = json.dumps(m) if isinstance(m, dict) else m
        rows.append(
            [
                v,
                f"2026-12-01 10:00:{v:02d}.5",
                "WRITE",
                {"mode": "Overwrite"},
                {"numOutputRows": "40"},
                text,
            ]
        )
    commits = commit_rows(columns, rows)
    return SourceSnapshot(TableName("db", "m__ivm_state"), None, len(rows), recent_commits=commits)


RECOMPUTE_METADATA = {METADATA_MARKER: 1, RECOMPUTED_MARKER: True}


def test_a_recomputes_overwrite_is_sized_by_the_change_it_recorded() -> None:
    pin = _recompute_overwrites([{**RECOMPUTE_METADATA, ESTIMATED_ROWS_KEY: 82_414}])
    # Never taken for an exact count: a refresh that would apply it sums it first.
    assert pin.changed_rows(0) is None
    assert pin.estimated_rows(0) == 40 + 82_414
    assert pin.estimated_rows(1) == 82_414
    assert pin.estimated_rows(2) == 0


@pytest.mark.parametrize(
    "metadata",
    [
        RECOMPUTE_METADATA,  # no estimate (the change's size was unknown)
        {**RECOMPUTE_METADATA, RECOMPUTED_MARKER: False, ESTIMATED_ROWS_KEY: 5},
        {ESTIMATED_ROWS_KEY: 5},  # not a refresh's commit
        "not json",
        None,
    ],
)
def test_an_overwrite_without_a_recorded_estimate_stays_unknown(metadata: object) -> None:
    assert _recompute_overwrites([metadata]).estimated_rows(1) is None


def test_a_change_sized_by_an_estimate_says_so() -> None:
    pin = _recompute_overwrites([{**RECOMPUTE_METADATA, ESTIMATED_ROWS_KEY: 30_000}])
    size = decision.change_size({pin.table: pin}, {pin.table: VersionRange(1, 2, overwritten=True)})
    assert size is not None and (size.rows, size.estimated) == (30_000, True)
    # The sum, once counted, replaces it.
    size = decision.change_size(
        {pin.table: pin}, {pin.table: VersionRange(1, 2, overwritten=True)}, {pin.table: 12}
    )
    assert size is not None and (size.rows, size.estimated) == (12, False)
