"""A refresh's record: the commit metadata it writes with its data, and what it reads back.

Every commit a refresh makes to a state (or to a join state) carries, in its
userMetadata, the source versions the state reflects after it, with their
identity, size and the columns read, and the guard it leaves (commit_metadata;
confs.set_commit_metadata sets it on the session for the commit). The next
refresh starts from the newest such commit in the state's history
(parse_recorded -> RecordedState).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dbt.adapters.spark_ivm.delta.history import (
    DATA_PRESERVING_OPERATIONS,
    METADATA_MARKER,
    REPLACING_OPERATIONS,
    Rows,
    load_metadata,
)
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, source_identity
from ivm_compiler import TableName


@dataclass(frozen=True)
class RecordedState:
    """What a state table's newest refresh commit says it reflects."""

    state_version: int
    fingerprint: str
    # str(TableName) -> {"version": int, "committed_at": str, "table_id": str,
    # "size_bytes": int, "columns": {name: type}} (all but the version optional)
    sources: dict[str, dict[str, Any]]
    # Commits made after that refresh which may have changed the state's data
    # (e.g. an UPDATE by hand): "<operation> at version <n>", oldest first.
    later_writes: tuple[str, ...] = ()
    # The refresh id the state's guard row holds after that commit (emit.Guard);
    # None in states written before the guard row existed.
    guard: str | None = None
    # The state version whose record the commit was made on, when it took it
    # from the view (refresh/state_history.py): every commit between the two is in
    # later_writes unless it keeps the rows.
    on_record: int | None = None


def commit_metadata(
    refresh_id: str,
    state: TableName,
    fingerprint: str,
    sources: Sequence[SourceSnapshot],
    guard: str | None = None,
    columns_read: Mapping[TableName, Mapping[str, str]] | None = None,
    on_record: int | None = None,
) -> dict[str, Any]:
    """What a refresh commit records; `guard`: the guard row's id after it (default: this one).

    `columns_read`: the columns (name -> type) the model reads of each source,
    which the next refresh compares with the source's columns then.
    `on_record`: the state version whose record the write was made on, when
    the refresh took it from the view instead of the history (RecordedState).
    """
    read = {str(table).lower(): dict(columns) for table, columns in (columns_read or {}).items()}
    recorded = {}
    for source in sources:
        entry = source_identity(source)
        # How big it is, without a DESCRIBE DETAIL next time (size_after).
        if source.size_bytes is not None:
            entry["size_bytes"] = source.size_bytes
        if str(source.table).lower() in read:
            entry["columns"] = read[str(source.table).lower()]
        recorded[str(source.table)] = entry
    return {
        METADATA_MARKER: 1,
        "refresh_id": refresh_id,
        "state": str(state),
        "fingerprint": fingerprint,
        "sources": recorded,
        "guard": guard or refresh_id,
        **({"on_record": on_record} if on_record is not None else {}),
    }


def parse_recorded(state: TableName, columns: list[str], rows: Rows) -> RecordedState | None:
    """The newest commit in DESCRIBE HISTORY rows that a refresh of this state table made."""
    version_at = columns.index("version")
    metadata_at = columns.index("userMetadata")
    operation_at = columns.index("operation")
    later: list[str] = []
    ordered = sorted(rows, key=lambda r: int(r[version_at]), reverse=True)
    for at, row in enumerate(ordered):
        metadata = load_metadata(row[metadata_at])
        # Names are compared lower-cased: commits written before TableName
        # lower-cased its parts may spell the state or a source in mixed case.
        if metadata is None or str(metadata.get("state")).lower() != str(state):
            if str(row[operation_at]) not in DATA_PRESERVING_OPERATIONS:
                later.append(f"{row[operation_at]} at version {int(row[version_at])}")
            continue
        on_record = metadata.get("on_record")
        if on_record is not None and str(row[operation_at]) not in REPLACING_OPERATIONS:
            # Made on the record of version `on_record`: a commit in between
            # that changed the rows lies under this one's change.
            later += [
                f"{r[operation_at]} at version {int(r[version_at])}"
                for r in ordered[at + 1 :]
                if int(r[version_at]) > int(on_record)
                and str(r[operation_at]) not in DATA_PRESERVING_OPERATIONS
            ]
        return RecordedState(
            state_version=int(row[version_at]),
            fingerprint=str(metadata.get("fingerprint")),
            sources={str(k).lower(): v for k, v in (metadata.get("sources") or {}).items()},
            later_writes=tuple(sorted(later, key=_version_of)),
            guard=str(metadata["guard"]) if metadata.get("guard") else None,
            on_record=int(on_record) if on_record is not None else None,
        )
    return None


def _version_of(write: str) -> int:
    """The version of a later_writes entry ("<operation> at version <n>")."""
    return int(write.rsplit(" ", 1)[1])
