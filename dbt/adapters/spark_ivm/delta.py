"""Delta Lake facts the refresh needs, read through SQL so both connection modes work.

Statements here are Delta commands that sqlglot does not model (DESCRIBE
DETAIL/HISTORY, SET of a session conf); identifiers in them are always rendered
quoted by sqlglot through TableName.sql(), never pasted from user input.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ivm_compiler import TableName

# Delta writes this session conf into the commitInfo of every commit made while
# it is set: the refresh uses it to record, in the same commit as its data, the
# source versions a state table reflects.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
METADATA_MARKER = "spark_ivm"

Rows = Sequence[Sequence[Any]]
Query = Callable[[str], tuple[list[str], Rows]]


@dataclass(frozen=True)
class SourceSnapshot:
    """A source table pinned at the start of a refresh."""

    table: TableName
    table_id: str
    version: int


@dataclass(frozen=True)
class RecordedState:
    """What a state table's newest refresh commit says it reflects."""

    state_version: int
    fingerprint: str
    # str(TableName) -> {"version": int, "table_id": str}
    sources: dict[str, dict[str, Any]]
    # Commits made after that refresh which may have changed the state's data
    # (e.g. an UPDATE by hand): "<operation> at version <n>", oldest first.
    later_writes: tuple[str, ...] = ()


# Operations on a state table that leave its rows as they were: commits of these
# after a refresh do not make the recorded versions untrue.
DATA_PRESERVING_OPERATIONS = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}
)


def describe_detail(table: TableName) -> str:
    return f"DESCRIBE DETAIL {table.sql()}"


def describe_history(table: TableName, limit: int | None = None) -> str:
    return f"DESCRIBE HISTORY {table.sql()}" + (f" LIMIT {int(limit)}" if limit else "")


def set_commit_metadata(metadata: dict[str, Any]) -> str:
    # SET takes the rest of the statement as the value; JSON escapes keep a ';'
    # from a table name from ending the statement early in any client.
    value = json.dumps(metadata, sort_keys=True, ensure_ascii=True).replace(";", "\\u003b")
    return f"SET {USER_METADATA_CONF}={value}"


def reset_commit_metadata() -> str:
    return f"RESET {USER_METADATA_CONF}"


def commit_metadata(
    refresh_id: str, state: TableName, fingerprint: str, sources: Sequence[SourceSnapshot]
) -> dict[str, Any]:
    return {
        METADATA_MARKER: 1,
        "refresh_id": refresh_id,
        "state": str(state),
        "fingerprint": fingerprint,
        "sources": {str(s.table): {"version": s.version, "table_id": s.table_id} for s in sources},
    }


def parse_recorded(state: TableName, columns: list[str], rows: Rows) -> RecordedState | None:
    """The newest commit in DESCRIBE HISTORY rows that a refresh of this state table made."""
    version_at = columns.index("version")
    metadata_at = columns.index("userMetadata")
    operation_at = columns.index("operation")
    later: list[str] = []
    for row in sorted(rows, key=lambda r: int(r[version_at]), reverse=True):
        metadata = _load(row[metadata_at])
        if metadata is None or metadata.get("state") != str(state):
            if str(row[operation_at]) not in DATA_PRESERVING_OPERATIONS:
                later.append(f"{row[operation_at]} at version {int(row[version_at])}")
            continue
        return RecordedState(
            state_version=int(row[version_at]),
            fingerprint=str(metadata.get("fingerprint")),
            sources=dict(metadata.get("sources") or {}),
            later_writes=tuple(reversed(later)),
        )
    return None


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


# Messages of Spark/Delta errors that mean "the change feed for that window is
# gone": the only safe answer is a full rebuild at the pinned version.
CHANGE_HISTORY_UNAVAILABLE = (
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_CHANGE_TABLE_FEED_DISABLED",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    # A vacuumed change file, as the Thrift server reports it (no Java cause chain).
    "FAILED_READ_FILE.FILE_NOT_EXIST",
    "VersionNotFoundException",
    "cannot time travel",
    "Error getting change data",
    "change data was not recorded",
    "FileNotFoundException",
    "is not available for version",
)


def is_change_history_unavailable(error: BaseException) -> bool:
    text = str(error)
    return any(marker.lower() in text.lower() for marker in CHANGE_HISTORY_UNAVAILABLE)
