"""The state table's history: what its newest refresh commit recorded, and its versions.

Every commit a refresh makes to a state carries, in its commit metadata, the
source versions the state reflects after it (delta.records.commit_metadata). This
module reads them back: the refresh's starting point, the version its view
should show after a commit, and the versions of recent refreshes (which
ivm_join_state: auto weighs).

Reading the history is a DESCRIBE HISTORY, 0.2-0.4 s however small the
table. The model's view carries the record of the state version it shows
(RECORD_PROPERTY), and a log state's refresh starts from that instead
(`from_view`), checking it with its write: the write carries Delta's
transaction id with the version the record names, so Delta skips it when any
refresh committed after that version (a group member not yet published, a
run that stopped before publishing, another invocation), and the version it
made must follow the record's at once, or something else committed between
them (an UPDATE by hand): the refresh then reads the history and rebuilds the
model before its view moves. The write names in its commit the record it was
made on (delta.records.RecordedState.on_record), so that a run stopped before that
check leaves it to the next run's reading of the history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dbt.adapters.spark_ivm.consistency.publish import Runner
from dbt.adapters.spark_ivm.delta.history import (
    REPLACING_OPERATIONS,
    describe_history,
    history_map,
    load_metadata,
)
from dbt.adapters.spark_ivm.delta.records import RecordedState, parse_recorded
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

# The view property holding the record of the state version the view shows.
RECORD_PROPERTY = "spark_ivm.state_record"
# A log state's history is read on every LOG_CHECK_EVERY-th refresh all the
# same: the rewrite policy counts the rows appended since the last rewrite,
# which only the history says (an INSERT answers with no counts). Between two
# reads at most LOG_CHECK_EVERY - 1 appends go uncounted.
LOG_CHECK_EVERY = 5


def record_property(recorded: RecordedState, unchecked: int) -> str:
    """RECORD_PROPERTY's value: `recorded`, and the refreshes made since the history was read.

    >>> recorded = RecordedState(4, "f", {"raw.t": {"version": 2}}, guard="g")
    >>> read_record_property(record_property(recorded, 1)) == (recorded, 1)
    True
    >>> read_record_property("not json") is None
    True
    """
    return json.dumps(
        {
            "state_version": recorded.state_version,
            "fingerprint": recorded.fingerprint,
            "sources": recorded.sources,
            "guard": recorded.guard,
            "unchecked": unchecked,
        },
        sort_keys=True,
    )


def read_record_property(text: str | None) -> tuple[RecordedState, int] | None:
    """record_property's (record, unchecked), or None for anything else."""
    try:
        found = json.loads(text or "")
        recorded = RecordedState(
            state_version=int(found["state_version"]),
            fingerprint=str(found["fingerprint"]),
            sources={str(k).lower(): dict(v) for k, v in found["sources"].items()},
            guard=str(found["guard"]) if found.get("guard") else None,
        )
        return recorded, int(found["unchecked"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def compaction_due(columns: list[str], rows: Sequence[Sequence[Any]]) -> bool:
    """Whether the rows appended since a log state's last rewrite outgrow it (MIN_LOG_ROWS).

    `rows`: the state's newest commits, as DESCRIBE HISTORY gives them. True
    also when the last rewrite is not among them.
    """
    appended = 0
    for row in sorted(rows, key=lambda r: int(r[columns.index("version")]), reverse=True):
        operation = str(row[columns.index("operation")])
        parameters = history_map(row[columns.index("operationParameters")])
        written = int(history_map(row[columns.index("operationMetrics")]).get("numOutputRows") or 0)
        if operation == "WRITE" and str(parameters.get("mode")) == "Append":
            appended += written
        elif operation in REPLACING_OPERATIONS or operation in REWRITING_OPERATIONS:
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
    # The version of this refresh's own commit, when the session told it, and its record.
    _committed: int | None = field(default=None, init=False)
    _committed_record: RecordedState | None = field(default=None, init=False)
    # The record the model's view carries, taken for the history's (from_view),
    # and the refreshes made on such records since the history was last read.
    assumed: RecordedState | None = field(default=None, init=False)
    _unchecked: int = field(default=0, init=False)
    # Set once the view's record did not hold: only the history says.
    _history_only: bool = field(default=False, init=False)

    def recorded(self) -> RecordedState | None:
        """The newest refresh commit's record (None: no refresh commit in the history).

        A commit made on a view's record (RecordedState.on_record) is read
        with every commit back to that record's, which lie under its change.
        """
        for limit in (RECENT_COMMITS, None):
            columns, rows = self.runner.query(describe_history(self.state, limit=limit))
            self._rows = (columns, rows)
            recorded = parse_recorded(self.state, columns, rows)
            if limit is None or len(rows) < limit:
                return recorded
            oldest = min(int(row[columns.index("version")]) for row in rows)
            if recorded is not None and (
                recorded.on_record is None or recorded.on_record >= oldest
            ):
                return recorded
        return None

    def from_view(
        self, view_properties: dict[str, str], shown_version: int | None, periodic: bool = True
    ) -> RecordedState | None:
        """The record of the state version the view shows, taken for the history's.

        None where the history must be read: no record, a view showing
        another version, the LOG_CHECK_EVERY-th refresh (`periodic`: a log
        state, whose rewrite policy counts from the history), or a record
        that did not hold in this refresh.
        """
        if self._history_only or self._rows is not None:
            return None
        found = read_record_property(view_properties.get(RECORD_PROPERTY))
        if found is None:
            return None
        recorded, unchecked = found
        if recorded.state_version != shown_version:
            return None
        if periodic and unchecked + 1 >= LOG_CHECK_EVERY:
            return None
        self.assumed, self._unchecked = recorded, unchecked
        return recorded

    def forget_assumed(self) -> None:
        """Go on from the history: the view's record did not hold (module docstring)."""
        self.assumed = None
        self._history_only = True

    def on_record(self) -> int | None:
        """The state version whose record this refresh's writes are made on, if the view's."""
        return self.assumed.state_version if self.assumed is not None else None

    def committed(self, version: int, metadata: dict[str, Any]) -> None:
        """This refresh's commit to the state made `version` (StateWrites.own_session)."""
        self._committed = version
        self._committed_record = RecordedState(
            state_version=version,
            fingerprint=str(metadata.get("fingerprint")),
            sources={str(k).lower(): v for k, v in (metadata.get("sources") or {}).items()},
            guard=str(metadata["guard"]) if metadata.get("guard") else None,
        )

    @property
    def wrote(self) -> bool:
        """Whether this refresh committed to the state, as far as its session told it."""
        return self._committed is not None

    def published_record(self, unwritten: RecordedState | None) -> str | None:
        """RECORD_PROPERTY of the view after this refresh.

        `unwritten`: the record the refresh started from, when it wrote
        nothing (the view shows the same version). None when the record of
        the version shown is not known: a write on a shared session, whose
        version this refresh did not learn.
        """
        # Refreshes since the history was read: none if this one read it.
        unchecked = 0 if self._rows is not None else self._unchecked
        if unwritten is not None:
            return record_property(unwritten, unchecked)
        if self._committed_record is None:
            return None
        on_record = self.assumed is not None and self._rows is None
        return record_property(self._committed_record, unchecked + 1 if on_record else unchecked)

    def latest_version(self) -> int:
        """The state's version after this refresh's commit: the commit's own, when known."""
        if self._committed is not None:
            return self._committed
        columns, rows = self.runner.query(describe_history(self.state, limit=1))
        return int(rows[0][columns.index("version")])

    def newest_version(self) -> int | None:
        """The newest state version recorded() read (any operation), or the view's record named.

        None before either.
        """
        if self._rows is None or not self._rows[1]:
            return self.assumed.state_version if self.assumed is not None else None
        columns, rows = self._rows
        return max(int(row[columns.index("version")]) for row in rows)

    def log_compaction_due(self) -> bool:
        """Whether a log state's next write should rewrite it (compaction_due).

        Never on the view's record: the history is read for it every
        LOG_CHECK_EVERY-th refresh.
        """
        if self.assumed is not None:
            return False
        return self._rows is None or compaction_due(*self._rows)

    def recent_refreshes(self) -> list[dict[TableName, int]]:
        """The source versions of the state's recent refresh commits, oldest first."""
        # recorded() read them at the start of this refresh.
        columns, rows = self._rows or self.runner.query(
            describe_history(self.state, limit=RECENT_COMMITS)
        )
        found = []
        for row in sorted(rows, key=lambda r: int(r[columns.index("version")])):
            metadata = load_metadata(row[columns.index("userMetadata")])
            if metadata is None or str(metadata.get("state")).lower() != str(self.state):
                continue
            found.append(
                {
                    table_name_of(name): int(entry["version"])
                    for name, entry in (metadata.get("sources") or {}).items()
                }
            )
        return found
