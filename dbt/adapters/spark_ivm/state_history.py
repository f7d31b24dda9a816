"""The state table's history: what its newest refresh commit recorded, and its versions.

Every commit a refresh makes to a state carries, in its commit metadata, the
source versions the state reflects after it (delta.commit_metadata). This
module reads them back: the refresh's starting point, the version its view
should show after a commit, and the versions of recent refreshes (which
ivm_join_state: auto weighs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dbt.adapters.spark_ivm import delta
from dbt.adapters.spark_ivm.publish import Runner
from ivm_compiler import TableName

# The newest refresh commit is nearly always the newest commit; only
# maintenance commits (OPTIMIZE, VACUUM) by hand push it further back.
RECENT_COMMITS = 20


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
