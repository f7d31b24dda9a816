"""What a table is: its properties and details, and a source as a refresh pins it.

SHOW TBLPROPERTIES tells a Delta table and its change feed, DESCRIBE DETAIL
its id and size, SHOW VIEWS/TABLES the relations a schema holds. A
SourceSnapshot is one source as pinning read it (refresh/pins.py): its
version, its newest commits (history.py) and, where read, its id and size;
source_identity is what a refresh records of it to tell the table from a
re-created one later (SourceSnapshot.same_table). Identifiers are rendered
quoted by sqlglot, never pasted from user input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlglot import exp

from dbt.adapters.spark_ivm.delta.history import CommitRows
from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit
from ivm_compiler import TableName
from ivm_compiler.layout import DELETION_VECTORS_PROPERTY
from ivm_compiler.sql import DIALECT

# Two reads of one commit's time agree to the millisecond but for Delta's
# making a history's times increase (it moves a commit that shares its
# predecessor's millisecond 1 ms on, depending on where the read starts). A
# table re-created and brought back to a recorded version commits it after the
# refresh that recorded it ended, which is seconds later.
SAME_COMMIT_MILLISECONDS = 100


@dataclass(frozen=True)
class SourceSnapshot:
    """A source table pinned at the start of a refresh.

    A pin is read from SHOW TBLPROPERTIES and DESCRIBE HISTORY, not from
    DESCRIBE DETAIL, which builds the snapshot's file list (0.8-1.5 s right
    after a commit, where the others take 0.06 and 0.2-0.4 s): a refresh that
    reads a source only through its change feed never needs that list. So the
    table's id is known only where a refresh had to read DETAIL, and its size
    where DETAIL was read or the history carries the recorded one forward
    (Pins.complete says when).
    """

    table: TableName
    table_id: str | None
    version: int
    # The table's size (DESCRIBE DETAIL sizeInBytes, or the recorded size plus
    # what the commits since added), None where neither was read; and its
    # newest commits, newest first (what ivm_strategy: auto sizes a change with).
    size_bytes: int | None = None
    recent_commits: tuple[CommitRows, ...] = ()
    # The column-changing commits among those recent ones (schema_history.py),
    # and the oldest version that history read covers.
    schema_commits: tuple[SchemaCommit, ...] = ()
    history_from: int = 0
    # The Delta table read for it, where that is not `table`: the state of an
    # upstream ivm model, whose pin is named after the model's view.
    delta_table: TableName | None = None
    # Whether its files may carry deletion vectors (may_have_deletion_vectors).
    deletion_vectors: bool = False

    def _window(self, after: int) -> list[CommitRows] | None:
        """The commits after version `after` up to this pin; None if not all were read."""
        window = [c for c in self.recent_commits if after < c.version <= self.version]
        return window if len(window) == self.version - after else None

    def overwritten(self, after: int) -> bool:
        """Whether a commit after version `after` up to this pin overwrote the table.

        False also where the history read does not reach back that far: the
        change is then read as it is, which is right, only larger.
        """
        return any(c.overwrites for c in self._window(after) or ())

    def replaced(self, after: int) -> bool:
        """Whether a commit after version `after` up to this pin replaced the table (CREATE OR REPLACE).

        How dbt rebuilds a `table` model: its change feed cannot be read
        across the replace, but its log keeps the versions before it.
        """
        return any(c.replaces_table for c in self._window(after) or ())

    def continues(self, entry: Mapping[str, Any]) -> bool:
        """Whether a recorded entry's version is in this table's log, replaces since or not.

        A CREATE OR REPLACE keeps the log, and the recorded version's commit
        time with it; a table dropped and created again has other commit
        times (same_table). False where the history read cannot say.
        """
        version = int(entry["version"])
        recorded_at, now_at = entry.get("committed_at"), self.committed_at(version)
        if version > self.version or recorded_at is None or now_at is None:
            return False
        return abs(_millis(str(recorded_at)) - _millis(now_at)) <= SAME_COMMIT_MILLISECONDS

    def changed_rows(self, after: int) -> tuple[int, float | None] | None:
        """Change-feed rows after version `after` up to this pin, and bytes per row if known.

        None when a commit in that window is not among the recent ones read,
        or does not say how many rows it changed.
        """
        rows = self._rows(after, estimates=False)
        if rows is None:
            return None
        sizes = [c.bytes_per_row for c in self._window(after) or () if c.bytes_per_row]
        return rows, (max(sizes) if sizes else None)

    def estimated_rows(self, after: int) -> int | None:
        """changed_rows' count with each overwrite's estimate standing in for its rows.

        None when a commit in the window says neither.
        """
        return self._rows(after, estimates=True)

    def _rows(self, after: int, estimates: bool) -> int | None:
        """The window's change-feed rows; with `estimates`, an overwrite's estimate for its rows."""
        window = self._window(after)
        if window is None:
            return None
        counts = [c.estimated_rows if c.rows is None and estimates else c.rows for c in window]
        return None if any(n is None for n in counts) else sum(n or 0 for n in counts)

    def written_whole(self) -> bool:
        """Whether the pinned version's rows were written by one commit, none appended after it.

        The newest commit up to the pin that changed rows created, replaced or
        overwrote the table (CommitRows.writes_whole); compactions and
        property changes after it keep its rows. A log state so written holds
        one row per row of the model with a positive count (its build or its
        rewrite), which readers need not sum (reads.table_at_version). False
        where the history read does not reach that commit.
        """
        for commit in sorted(self.recent_commits, key=lambda c: c.version, reverse=True):
            if commit.version > self.version or commit.preserves_data:
                continue
            return commit.writes_whole
        return False

    def only_preserving_data_after(self, after: int) -> bool:
        """Whether every commit after version `after` up to this pin left the rows as they were.

        Such a window (compactions, vacuums, property changes) has no change
        to apply; reading its change feed would find none.
        """
        window = self._window(after)
        return window is not None and all(c.preserves_data for c in window)

    def committed_at(self, version: int) -> str | None:
        """When `version` of this table was committed, if the history read covers it."""
        return next((c.committed_at for c in self.recent_commits if c.version == version), None)

    def same_table(self, entry: Mapping[str, Any]) -> bool | None:
        """Whether a recorded entry's version is this table's, not a dropped or replaced one's.

        A table dropped and created again under the same name has other commit
        times at the same versions; a CREATE OR REPLACE (how dbt rebuilds a
        `table` model and the plugin a state) continues the log with a commit
        that replaces it. None: neither the history read nor the ids can tell.
        """
        version = int(entry["version"])
        if version > self.version:
            return bool(entry.get("table_id") == self.table_id) if self.table_id else False
        recorded_at, now_at = entry.get("committed_at"), self.committed_at(version)
        window = self._window(version)
        if recorded_at is not None and now_at is not None and window is not None:
            apart = abs(_millis(str(recorded_at)) - _millis(now_at))
            return apart <= SAME_COMMIT_MILLISECONDS and not any(c.replaces_table for c in window)
        if entry.get("table_id") is not None and self.table_id is not None:
            return bool(entry["table_id"] == self.table_id)
        return None

    def size_after(self, entry: Mapping[str, Any]) -> int | None:
        """The recorded size plus the bytes each commit since added; None if one does not say."""
        recorded = entry.get("size_bytes")
        version = int(entry["version"])
        window = self._window(version) if version <= self.version else None
        if recorded is None or window is None or any(c.bytes_added is None for c in window):
            return None
        size = int(recorded)
        for commit in sorted(window, key=lambda c: c.version):
            size = (0 if commit.replaces_table else size) + (commit.bytes_added or 0)
        return max(0, size)

    def size_from_creation(self) -> int | None:
        """The bytes every commit since the table's creation added, if the history read has all."""
        return self.size_after({"version": -1, "size_bytes": 0}) if self.history_from == 0 else None


def versions_of(pinned: Mapping[TableName, SourceSnapshot]) -> dict[TableName, int]:
    """Each pinned source's version: what a refresh reads and records."""
    return {table: snapshot.version for table, snapshot in pinned.items()}


def total_size(snapshots: Iterable[SourceSnapshot]) -> int:
    """The pinned sources' bytes together (a source of unknown size counts none)."""
    return sum(s.size_bytes or 0 for s in snapshots)


def _millis(text: str) -> float:
    return datetime.fromisoformat(text).timestamp() * 1000


def source_identity(source: SourceSnapshot) -> dict[str, Any]:
    """A pinned version, with what tells its table from a re-created one's (same_table).

    >>> commit = CommitRows(3, rows=1, committed_at="2026-11-29 20:41:45.120")
    >>> source_identity(SourceSnapshot(TableName("raw", "t"), None, 3, recent_commits=(commit,)))
    {'version': 3, 'committed_at': '2026-11-29 20:41:45.120'}
    """
    entry: dict[str, Any] = {"version": source.version}
    for key, value in (
        ("committed_at", source.committed_at(source.version)),
        ("table_id", source.table_id),
    ):
        if value is not None:
            entry[key] = value
    return entry


# A property every Delta table has (SHOW TBLPROPERTIES lists its protocol).
DELTA_PROTOCOL_PROPERTY = "delta.minReaderVersion"

CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"

# Listed by SHOW TBLPROPERTIES where the table's protocol supports deletion
# vectors; it stays after the vectors are turned off (their files may still
# carry some), and a CREATE OR REPLACE keeps it, as it keeps the protocol.
DELETION_VECTORS_FEATURE = "delta.feature.deletionVectors"


def may_have_deletion_vectors(properties: Mapping[str, str]) -> bool:
    """Whether a table's files may carry deletion vectors, by its SHOW TBLPROPERTIES.

    Delta 3.3 and 4.0.1 refuse to scan such a table without data skipping
    ("Cannot work with a non-pinned table snapshot of the TahoeFileIndex":
    only data skipping pins the snapshot a scan reads deletion vectors
    from), vectors written or not (delta.confs.staging keeps it on).

    >>> may_have_deletion_vectors({"delta.feature.deletionVectors": "supported"})
    True
    >>> may_have_deletion_vectors({"delta.enableDeletionVectors": "true"})
    True
    >>> may_have_deletion_vectors({"delta.minReaderVersion": "1"})
    False
    """
    enabled = properties.get(DELETION_VECTORS_PROPERTY, "false").lower() == "true"
    return enabled or DELETION_VECTORS_FEATURE in properties


def describe_detail(table: TableName) -> str:
    return f"DESCRIBE DETAIL {table.sql()}"


def show_properties(table: TableName) -> str:
    """SHOW TBLPROPERTIES: (key, value) rows; a Delta table's protocol and configuration."""
    return f"SHOW TBLPROPERTIES {table.sql()}"


def turn_on_change_feed(table: TableName) -> str:
    """ALTER TABLE ... SET TBLPROPERTIES (delta.enableChangeDataFeed = true)."""
    return (
        f"ALTER TABLE {table.sql()} SET TBLPROPERTIES "
        f"({exp.Literal.string('delta.enableChangeDataFeed').sql(dialect=DIALECT)} = 'true')"
    )


def show_views_like(schema: str, pattern: str) -> str:
    """SHOW VIEWS of a schema whose names match a pattern (`*` any characters, `|` or)."""
    return (
        f"SHOW VIEWS IN {exp.to_identifier(schema, quoted=True).sql(dialect=DIALECT)} "
        f"LIKE {exp.Literal.string(pattern).sql(dialect=DIALECT)}"
    )


def show_tables_like(schema: str, pattern: str) -> str:
    """SHOW TABLES of a schema whose names match a pattern (`*` any characters, `|` or)."""
    return (
        f"SHOW TABLES IN {exp.to_identifier(schema, quoted=True).sql(dialect=DIALECT)} "
        f"LIKE {exp.Literal.string(pattern).sql(dialect=DIALECT)}"
    )
