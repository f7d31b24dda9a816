"""A table's commits as DESCRIBE HISTORY shows them, and the commit metadata the plugin's carry.

Each commit's operation and metrics size a change without reading any data
(CommitRows: the change-feed rows it made, the bytes it wrote, whether it kept
the rows as they were, overwrote or replaced the table). The JSON a refresh's
commit carries in its userMetadata (records.py) is told from other commits'
by METADATA_MARKER and read back by load_metadata. Statements here are Delta
commands sqlglot does not model; identifiers in them are rendered quoted by
sqlglot through TableName.sql(), never pasted from user input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ivm_compiler import TableName

# The key every commit metadata a refresh writes carries (commit_metadata),
# which tells its commits from any other's (load_metadata).
METADATA_MARKER = "spark_ivm"

# In a recompute's commit metadata (an overwrite or a MERGE by key): the
# state's rows were computed whole from the sources, not patched by a change.
RECOMPUTED_MARKER = "recomputed"

# In an overwriting recompute's commit metadata: the changed rows of its
# inputs that made it recompute, which its readers take as their change's
# size instead of summing the overwrite (CommitRows.estimated_rows).
ESTIMATED_ROWS_KEY = "estimated_change_rows"

Rows = Sequence[Sequence[Any]]

Query = Callable[[str], tuple[list[str], Rows]]


@dataclass(frozen=True)
class CommitRows:
    """One commit as DESCRIBE HISTORY shows it: what it changed, from its operation metrics."""

    version: int
    # None: the operation's metrics do not say (the change's size is unknown).
    rows: int | None
    # Bytes per row written, when the commit wrote rows and says how many bytes.
    bytes_per_row: float | None = None
    # An OPTIMIZE, VACUUM or property change: the rows are what they were.
    preserves_data: bool = False
    operation: str = ""
    # When it was committed (commit_time), which tells this table's commit
    # from another table's of the same version.
    committed_at: str | None = None
    # Bytes its files added less those it removed (None: the metrics do not say);
    # for a CREATE OR REPLACE, the bytes of the table it leaves.
    bytes_added: int | None = None
    # An INSERT OVERWRITE (a recompute of an ivm state, a log state's rewrite):
    # its change-feed rows are every row the table had, deleted, and every row
    # it has, inserted, most of them the same row both ways.
    overwrites: bool = False
    # For a recompute's overwrite: what its metadata estimates the change to
    # be (ESTIMATED_ROWS_KEY), where `rows` cannot say.
    estimated_rows: int | None = None

    @property
    def replaces_table(self) -> bool:
        """A CREATE OR REPLACE: the table's rows, columns and id start over at this version."""
        return self.operation in REPLACING_OPERATIONS

    @property
    def writes_whole(self) -> bool:
        """The table's rows after this commit are all this commit wrote (a create, replace or
        overwrite), none appended to earlier ones."""
        return self.overwrites or self.operation in CREATING_OPERATIONS


# Operations on a state table that leave its rows as they were: commits of these
# after a refresh do not make the recorded versions untrue.
DATA_PRESERVING_OPERATIONS = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}
)


# Operations that start a table over in its own log: Delta gives it a new id.
REPLACING_OPERATIONS = frozenset(
    {
        "CREATE OR REPLACE TABLE",
        "REPLACE TABLE",
        "CREATE OR REPLACE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
    }
)
# ... and, with a plain CREATE, the operations that write a table's first rows.
CREATING_OPERATIONS = REPLACING_OPERATIONS | {"CREATE TABLE", "CREATE TABLE AS SELECT"}


def describe_history(table: TableName, limit: int | None = None) -> str:
    return f"DESCRIBE HISTORY {table.sql()}" + (f" LIMIT {int(limit)}" if limit else "")


# Operations that add rows and count them in numOutputRows (MERGE counts copied
# rows there too, so its own metrics are used instead).
_APPENDING_OPERATIONS = frozenset(
    {
        "WRITE",
        "STREAMING UPDATE",
        "CREATE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
        "CREATE OR REPLACE TABLE AS SELECT",
        "COPY INTO",
    }
)


# A key and its flat value in a map rendered as text ("mode":"Append", "n":3).
_MAP_ENTRY = re.compile(r'"([^"]+)":"?([^",{}]*)"?')


def history_map(value: Any) -> dict[str, Any]:
    """A history row's map column: a dict, or text where agate hands it over so.

    Over Thrift the text is JSON but for values that are JSON themselves,
    which the server leaves unescaped: `"properties":"{"spark_ivm.state_form":
    "log"}"` in a CREATE OR REPLACE's parameters. Such text is read entry by
    entry, the first of a repeated key kept (the outer map's come first).

    >>> history_map('{"mode":"Append","partitionBy":"[]"}')["mode"]
    'Append'
    >>> history_map('{"isManaged":"true","properties":"{"spark_ivm.state_form":"log"}"}')["isManaged"]
    'true'
    """
    if not isinstance(value, str):
        return dict(value or {})
    if not value.strip():
        return {}
    try:
        return dict(json.loads(value))
    except json.JSONDecodeError:
        found: dict[str, Any] = {}
        for key, entry in _MAP_ENTRY.findall(value):
            found.setdefault(key, entry)
        return found


def commit_rows(columns: list[str], rows: Rows) -> tuple[CommitRows, ...]:
    """Each DESCRIBE HISTORY row's change-feed row count (an update is two rows), newest first."""
    version_at = columns.index("version")
    operation_at = columns.index("operation")
    metrics_at = columns.index("operationMetrics")
    timestamp_at = columns.index("timestamp")
    metadata_at = columns.index("userMetadata") if "userMetadata" in columns else None
    parameters_at = (
        columns.index("operationParameters") if "operationParameters" in columns else None
    )
    found = []
    for row in sorted(rows, key=lambda r: int(r[version_at]), reverse=True):
        operation = str(row[operation_at])
        metrics = history_map(row[metrics_at])
        parameters = history_map(row[parameters_at]) if parameters_at is not None else {}
        overwrites = operation == "WRITE" and str(parameters.get("mode")) == "Overwrite"

        def count(*names: str, metrics: dict[str, Any] = metrics) -> int | None:
            """The sum of the named metrics; None if the commit lacks one of them."""
            values = [metrics.get(name) for name in names]
            present = [int(v) for v in values if v is not None]
            return sum(present) if len(present) == len(values) else None

        changed: int | None = None
        if operation in DATA_PRESERVING_OPERATIONS:
            changed = 0
        elif operation == "MERGE":
            merged = count("numTargetRowsInserted", "numTargetRowsDeleted")
            updated = count("numTargetRowsUpdated")
            changed = None if merged is None or updated is None else merged + 2 * updated
        elif operation == "DELETE":
            changed = count("numDeletedRows")
        elif operation == "UPDATE":
            updated = count("numUpdatedRows")
            changed = None if updated is None else 2 * updated
        elif overwrites or operation in REPLACING_OPERATIONS:
            # Its metrics count the rows written, not the rows it removed (a
            # replace has no change feed at all: readers of a dbt `table`
            # model read its difference from two versions, reads.stage_net_change).
            changed = None
        elif operation in _APPENDING_OPERATIONS:
            changed = count("numOutputRows")
        written = count("numOutputRows") if operation in _APPENDING_OPERATIONS else None
        written_bytes = count("numOutputBytes")
        per_row = written_bytes / written if written and written_bytes else None
        found.append(
            CommitRows(
                int(row[version_at]),
                changed,
                per_row,
                preserves_data=operation in DATA_PRESERVING_OPERATIONS,
                operation=operation,
                committed_at=commit_time(row[timestamp_at]),
                bytes_added=_bytes_added(operation, count),
                overwrites=overwrites,
                estimated_rows=_estimated_rows(row[metadata_at])
                if overwrites and metadata_at is not None
                else None,
            )
        )
    return tuple(found)


def _estimated_rows(user_metadata: Any) -> int | None:
    """The change a recompute's overwrite estimated in its commit metadata, if it did.

    >>> _estimated_rows('{"spark_ivm": 1, "recomputed": true, "estimated_change_rows": 82414}')
    82414
    >>> _estimated_rows('{"spark_ivm": 1, "recomputed": true}') is None
    True
    """
    metadata = _load(user_metadata) or {}
    estimate = metadata.get(ESTIMATED_ROWS_KEY)
    return int(estimate) if metadata.get(RECOMPUTED_MARKER) and estimate is not None else None


# The metrics that say how many bytes of data files an operation added and
# removed, where they add up to DESCRIBE DETAIL's size (checked on this
# runtime, 2026-11-29, tests/functional/test_source_pins.py: WRITE, INSERT
# OVERWRITE and REPLACE WHERE, DELETE, MERGE, CREATE OR REPLACE ... AS
# SELECT). An UPDATE's numAddedBytes did not add up (1,638 bytes added where
# the table grew by 3,429 less the 3,505 removed); an UPDATE rewrites rows in
# place, so it is taken to leave the size as it was: the size only weighs a
# recomputation for ivm_strategy: auto, and reading DETAIL after every
# UPDATE would cost a second where the estimate is off by a few bytes a row.
_BYTE_METRICS = {
    "MERGE": ("numTargetBytesAdded", "numTargetBytesRemoved"),
    "DELETE": ("numAddedBytes", "numRemovedBytes"),
    "OPTIMIZE": ("numAddedBytes", "numRemovedBytes"),
}


# A CREATE (OR REPLACE) without AS SELECT leaves an empty table.
_REPLACING_EMPTY = frozenset({"CREATE TABLE", "CREATE OR REPLACE TABLE", "REPLACE TABLE"})

# Operations that write no data files (or, for UPDATE, see above).
_NO_FILE_OPERATIONS = frozenset(
    {
        "UPDATE",
        "VACUUM START",
        "VACUUM END",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD COLUMNS",
        "CHANGE COLUMN",
    }
)


def _bytes_added(operation: str, count: Callable[..., int | None]) -> int | None:
    """Bytes of files a commit added less those it removed; None where its metrics do not say."""
    if operation in _NO_FILE_OPERATIONS or operation in _REPLACING_EMPTY:
        return 0
    if operation in _BYTE_METRICS:
        added, removed = (count(name) for name in _BYTE_METRICS[operation])
        return None if added is None or removed is None else added - removed
    if operation in REPLACING_OPERATIONS:
        return count("numOutputBytes")  # the whole table it leaves (size_after)
    if operation in _APPENDING_OPERATIONS:
        # An append; an overwrite also removes files, and says so.
        removed = count("numRemovedBytes")
        if count("numRemovedFiles") and removed is None:
            return None
        written = count("numOutputBytes")
        return None if written is None else written - (removed or 0)
    return None


def commit_time(value: Any) -> str:
    """A DESCRIBE HISTORY timestamp as text to the millisecond, alike in both modes.

    A session hands over a datetime, a Thrift server text.

    >>> commit_time("2026-11-29 20:41:45.12")
    '2026-11-29 20:41:45.120'
    >>> commit_time(datetime(2026, 11, 29, 20, 41, 45, 120999))
    '2026-11-29 20:41:45.120'
    """
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=None).isoformat(sep=" ", timespec="milliseconds")


def load_metadata(value: Any) -> dict[str, Any] | None:
    """A commit's userMetadata as a refresh wrote it (commit_metadata), or None."""
    return _load(value)


def _load(value: Any) -> dict[str, Any] | None:
    if not value or not isinstance(value, str):
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or loaded.get(METADATA_MARKER) != 1:
        return None
    return loaded
