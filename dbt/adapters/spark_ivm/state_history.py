"""The state table's history: what its newest refresh commit recorded, and its versions.

Every commit a refresh makes to a state carries, in its commit metadata, the
source versions the state reflects after it (delta.commit_metadata). This
module reads them back: the refresh's starting point, the version its view
should show after a commit, and the versions of recent refreshes (which
ivm_join_state: auto weighs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dbt.adapters.spark_ivm import delta
from dbt.adapters.spark_ivm.publish import Runner
from ivm_compiler import TableName

# The newest refresh commit is nearly always the newest commit; only
# maintenance commits (OPTIMIZE, VACUUM) by hand push it further back.
RECENT_COMMITS = 20

# A log state (ivm_compiler/log_state.py) is rewritten once the rows appended
# since its last rewrite outnumber both the rows that rewrite left and this
# (a few thousand partial rows cost a read next to nothing), or once that
# rewrite is older than the commits a refresh reads: so the log's files
# number at most RECENT_COMMITS.
MIN_LOG_ROWS = 10_000
# Besides CREATE OR REPLACE: a first build, and INSERT OVERWRITE (mode Overwrite).
REWRITING_OPERATIONS = frozenset({"CREATE TABLE AS SELECT", "WRITE"})


# A key and its flat value in a map rendered as text ("mode":"Append", "n":3).
_MAP_ENTRY = re.compile(r'"([^"]+)":"?([^",{}]*)"?')


def _as_map(value: Any) -> dict[str, Any]:
    """A history row's map column: a dict, or text where agate hands it over so.

    Over Thrift the text is JSON but for values that are JSON themselves,
    which the server leaves unescaped: `"properties":"{"spark_ivm.state_form":
    "log"}"` in a CREATE OR REPLACE's parameters. Such text is read entry by
    entry, the first of a repeated key kept (the outer map's come first).

    >>> _as_map('{"mode":"Append","partitionBy":"[]"}')["mode"]
    'Append'
    >>> _as_map('{"isManaged":"true","properties":"{"spark_ivm.state_form":"log"}"}')["isManaged"]
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


def compaction_due(columns: list[str], rows: Sequence[Sequence[Any]]) -> bool:
    """Whether the rows appended since a log state's last rewrite outgrow it (MIN_LOG_ROWS).

    `rows`: the state's newest commits, as DESCRIBE HISTORY gives them. True
    also when the last rewrite is not among them.
    """
    appended = 0
    for row in sorted(rows, key=lambda r: int(r[columns.index("version")]), reverse=True):
        operation = str(row[columns.index("operation")])
        parameters = _as_map(row[columns.index("operationParameters")])
        written = int(_as_map(row[columns.index("operationMetrics")]).get("numOutputRows") or 0)
        if operation == "WRITE" and str(parameters.get("mode")) == "Append":
            appended += written
        elif operation in delta.REPLACING_OPERATIONS or operation in REWRITING_OPERATIONS:
            return appended > max(written, MIN_LOG_ROWS)
    return True


def table_name_of(text: str) -> TableName:
    """'schema.name' (as commit metadata and view properties store it) -> TableName."""
    parts = text.split(".")
    return TableName(db=parts[-2] if len(parts) > 1 else None, name=parts[-1])


@dataclass
class StateHistory:
    runner: Runner
    state: TableName
    # The DESCRIBE HISTORY rows recorded() read (columns, rows).
    _rows: tuple[list[str], Sequence[Sequence[Any]]] | None = field(default=None, init=False)
    # The version of this refresh's own commit, when the session told it.
    _committed: int | None = field(default=None, init=False)

    def recorded(self) -> delta.RecordedState | None:
        """The newest refresh commit's record (None: no refresh commit in the history)."""
        for limit in (RECENT_COMMITS, None):
            columns, rows = self.runner.query(delta.describe_history(self.state, limit=limit))
            self._rows = (columns, rows)
            recorded = delta.parse_recorded(self.state, columns, rows)
            if recorded is not None or limit is None or len(rows) < limit:
                return recorded
        return None

    def committed(self, version: int) -> None:
        """This refresh's commit to the state made `version` (StateWrites.own_session)."""
        self._committed = version

    def latest_version(self) -> int:
        """The state's version after this refresh's commit: the commit's own, when known."""
        if self._committed is not None:
            return self._committed
        columns, rows = self.runner.query(delta.describe_history(self.state, limit=1))
        return int(rows[0][columns.index("version")])

    def newest_version(self) -> int | None:
        """The newest state version recorded() read (any operation); None before it ran."""
        if self._rows is None or not self._rows[1]:
            return None
        columns, rows = self._rows
        return max(int(row[columns.index("version")]) for row in rows)

    def log_compaction_due(self) -> bool:
        """Whether a log state's next write should rewrite it (compaction_due)."""
        return self._rows is None or compaction_due(*self._rows)

    def recent_refreshes(self) -> list[dict[TableName, int]]:
        """The source versions of the state's recent refresh commits, oldest first."""
        # recorded() read them at the start of this refresh.
        columns, rows = self._rows or self.runner.query(
            delta.describe_history(self.state, limit=RECENT_COMMITS)
        )
        found = []
        for row in sorted(rows, key=lambda r: int(r[columns.index("version")])):
            metadata = delta.load_metadata(row[columns.index("userMetadata")])
            if metadata is None or str(metadata.get("state")).lower() != str(self.state):
                continue
            found.append(
                {
                    table_name_of(name): int(entry["version"])
                    for name, entry in (metadata.get("sources") or {}).items()
                }
            )
        return found
