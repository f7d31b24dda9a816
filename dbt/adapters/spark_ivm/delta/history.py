"""Delta Lake facts the refresh needs, read through SQL so both connection modes work.

Statements here are Delta commands that sqlglot does not model (DESCRIBE
DETAIL/HISTORY, SET of a session conf); identifiers in them are always rendered
quoted by sqlglot through TableName.sql(), never pasted from user input.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlglot import exp

from dbt.adapters.spark_ivm.refresh.schema_changes import SchemaCommit
from ivm_compiler import TableName
from ivm_compiler.emit import CANCELLED, EXHAUSTED, GUARD_FAILED
from ivm_compiler.errors import first_line
from ivm_compiler.sql import DIALECT

# Delta writes this session conf into the commitInfo of every commit made while
# it is set: the refresh uses it to record, in the same commit as its data, the
# source versions a state table reflects.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
METADATA_MARKER = "spark_ivm"
# In a recompute's commit metadata (an overwrite or a MERGE by key): the
# state's rows were computed whole from the sources, not patched by a change.
RECOMPUTED_MARKER = "recomputed"
# In an overwriting recompute's commit metadata: the changed rows of its
# inputs that made it recompute, which its readers take as their change's
# size instead of summing the overwrite (CommitRows.estimated_rows).
ESTIMATED_ROWS_KEY = "estimated_change_rows"

# Over a Thrift server with singleSession every connection (each dbt thread's,
# and other clients') shares one SparkSession, so a session conf set for one
# commit is seen by any statement another runs meanwhile; so did every dbt
# thread of the embedded runtime before each connection had a session of its
# own (runtime/sessions.py). The plugin's commits run under this lock: a refresh sets
# and resets its commit metadata inside it, and the commit log's appends wait
# for it, so no commit of this process's plugin carries another's metadata.
# (Delta's idempotent-write confs were tried for concurrent refreshes of one
# model and dropped for this reason: another thread's INSERT into a source,
# made while they were set, would be skipped as a repeat.)
COMMIT_LOCK = threading.Lock()

# Delta sets this session conf to the version of every commit the session
# makes. Where no other client shares the connection's Spark session (a Thrift
# server's session per connection, the embedded runtime's session per
# connection), the version a refresh's commit made is read
# from it: 0.03-0.06 s for unsetting it before the commit and reading it after,
# where the state's DESCRIBE HISTORY took 0.26-0.43 s (a Thrift server, 2026-11-29).
LAST_COMMIT_CONF = "spark.databricks.delta.lastCommitVersionInSession"
# A Spark Thrift Server with this conf true serves every connection from one
# session, whose confs are then shared like the embedded runtime's.
SINGLE_SESSION_CONF = "spark.sql.hive.thriftServer.singleSession"
# Delta's data skipping: each scan with a filter prunes its files by their
# statistics in a Spark job of its own while the statement is planned.
DATA_SKIPPING_CONF = "spark.databricks.delta.stats.skipping"
# Sources up to this size are read whole by a change statement: pruning their
# files saves at most reading them, about what planning the pruning costs
# (measured on the worked example's customers_to_chase, 20 scans of two
# 2,000-row sources: its change query planned in 3.5-4.2 s with data skipping,
# 0.85-0.93 s without; run in 7.3-7.5 s against 5.2-5.7 s).
SMALL_SOURCE_BYTES = 16 * 1024 * 1024
# Sources up to this size run a change interpreted (INTERPRETED_SETTINGS).
# Interpreted rows cost more than compiling their code once there are many:
# on warehouse scale 200 (raw sources of 2-10 MB), brz_orders' MERGE of a
# 29,000-row change into its 420,000-row state took 10.0-16.2 s interpreted
# against 4.3-6.6 s with generated code, both in one partition (2026-12-01).
INTERPRETED_SOURCE_BYTES = 1024 * 1024
# Adaptive query execution runs each shuffle and broadcast of a statement as a
# Spark job of its own, to re-plan between them (off for every change,
# CHANGE_SETTINGS); over small sources there is nothing to re-plan and each
# job costs its scheduling (customers_to_chase's
# change query, data skipping off: 45 jobs in 4.5-4.6 s with it, 23 jobs in
# 3.6-3.8 s without, 2026-11-30).
ADAPTIVE_CONF = "spark.sql.adaptive.enabled"
# A temporary view keeps the SQL text it was made from and analyzes it anew
# at every reference (Spark 3.1 on), so a stage read from twenty places of a
# statement had Delta resolve its change feed or snapshot twenty times:
# customers_to_chase's change query over its four stages spent 1.0-1.7 s in
# analysis, 0.27-0.6 s with the analyzed plan kept (warm, 2026-11-30). A stage
# holds what pinned versions fix, so its analyzed plan is what every
# reference must read; the data comes from the cache either way.
STAGE_SETTINGS = {"spark.sql.legacy.storeAnalyzedPlanForView": "true"}
SHUFFLE_PARTITIONS_CONF = "spark.sql.shuffle.partitions"
# Spark generates and compiles Java for each stage of a new statement shape
# (whole-stage codegen) and for its projections and orderings: over small
# sources that costs more than running them interpreted, and a refresh's
# statements are new shapes in every dbt process of the embedded runtime
# (the worked example's batch: 47.36 s of refreshes interpreted against
# 57.00 s, customers_to_chase's INSERT 2.77 s against 3.67 s, 2026-11-30).
# The tests run interpreted throughout (tests/conftest.py, SPEED_CONF).
INTERPRETED_SETTINGS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Where every source is small, each stage is coalesced into this many
# partitions and each shuffle of a change statement made into as many: a
# task per partition costs its scheduling and deserialization, and there is
# nothing to spread over the cores (customers_to_chase's change query ran 67
# tasks in 7 stages, 1.3 s of it deserializing tasks; with one partition
# 3.0-3.1 s warm against 3.9-4.8 s, 2026-11-30).
SMALL_PARTITIONS = 1

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


@dataclass(frozen=True)
class Staging:
    """How a change over pinned sources runs: its session confs, and what it stages.

    One value from one rule (`staging`): the confs every statement of the
    change runs under, from its first stage to its write (CHANGE_SETTINGS;
    where every source is small SMALL_SCAN_SETTINGS, snapshots staged and
    each stage coalesced).
    """

    # The sources whose pinned snapshot it may stage (snapshot_sources).
    snapshots: frozenset[TableName] = frozenset()
    # The partitions each stage is coalesced into; None: as many as it reads.
    partitions: int | None = None
    # Session confs every statement of the change runs under (none by default).
    settings: Mapping[str, str] = field(default_factory=dict)
    # Whether a plan with pre-aggregations caches its change query's rows
    # before the MERGE (emit.stage_change_rows): where a source is large.
    # Over small sources the MERGE's repeated reads of them cost less than
    # one more statement (TestRandomJoinChanges: 238 s of worker time with
    # it, 2026-12-01).
    change_rows: bool = False


# No snapshot staged, each stage in as many partitions as it reads, no confs.
NOTHING_STAGED = Staging()

# The confs of a change over any sources: no adaptive execution. A change
# statement reads its change feeds and each partner in one term per changed
# input; adaptive execution runs every shuffle and broadcast of it as a job
# of its own to re-plan between them, where the static plan already
# broadcasts the staged (cached, so measured) change. TPC-H SF 1
# (2026-12-01, bench/results/issue20/no-adaptive/): at 0.1 % batches 40-60 %
# fewer Spark jobs per refresh (Q3 32 -> 18) and times within the runs'
# noise; off for a whole session, Q3's refresh of a 10 % batch 19.01 ->
# 12.55 s.
CHANGE_SETTINGS = {ADAPTIVE_CONF: "false"}

# Bytes of pinned sources per shuffle partition of a change over large
# sources (adaptive execution, which would size them, is off there).
# Without it every shuffle of the change, its MERGE's included, ran Spark's
# 200 partitions and the MERGE wrote up to 200 files per refresh: on
# warehouse scale 200's fct_order_lines (8 MB of sources, 988 change rows
# into 600,000), 32.7-40.6 s and 200 files added, against 7.5-9.8 s and one
# file with one partition (two runs each, 2026-12-01). A change shuffles
# far fewer bytes than its sources hold (the change, the states and the
# key-bounded partners it reads), so a partition per 64 MB of sources,
# adaptive coalescing's target for shuffled bytes, was still too many:
# replaying TPC-H SF 5's MIN/MAX refresh (1.1 GB of sources, 92,545 state
# rows changed of 2.2 million) took 31.5-38.5 s in 16-17 partitions, 29.5 s
# in 3 and 23.5-28.2 s in 2 (2026-12-02, bench/micro/replay_refresh.py).
PARTITION_BYTES = 1024 * 1024 * 1024

# The confs of a change over small sources: CHANGE_SETTINGS, no data
# skipping (a large source's key-bounded reads, key_bounds.py, are what it
# makes cheap), SMALL_PARTITIONS shuffle partitions and no generated code.
SMALL_SCAN_SETTINGS = {
    **CHANGE_SETTINGS,
    DATA_SKIPPING_CONF: "false",
    SHUFFLE_PARTITIONS_CONF: str(SMALL_PARTITIONS),
    **INTERPRETED_SETTINGS,
}


def staging(pinned: Mapping[TableName, SourceSnapshot]) -> Staging:
    """How a change over `pinned` runs: without adaptive execution, the cheapest plan if small.

    Where every source's size is known (SourceSnapshot.size_bytes) and at
    most SMALL_SOURCE_BYTES: SMALL_SCAN_SETTINGS (interpreted only where
    every source is at most INTERPRETED_SOURCE_BYTES), every snapshot
    stageable, each stage in SMALL_PARTITIONS; elsewhere CHANGE_SETTINGS,
    with a shuffle partition per PARTITION_BYTES of sources where every
    size is known.

    >>> small = SourceSnapshot(TableName("s", "t"), None, 3, size_bytes=5_000)
    >>> staged = staging({small.table: small})
    >>> staged.partitions, sorted(str(t) for t in staged.snapshots)
    (1, ['s.t'])
    >>> sorted(staged.settings.items())  # doctest: +NORMALIZE_WHITESPACE
    [('spark.databricks.delta.stats.skipping', 'false'), ('spark.sql.adaptive.enabled', 'false'),
     ('spark.sql.codegen.factoryMode', 'NO_CODEGEN'), ('spark.sql.codegen.wholeStage', 'false'),
     ('spark.sql.shuffle.partitions', '1')]
    >>> mid = SourceSnapshot(TableName("s", "m"), None, 3, size_bytes=INTERPRETED_SOURCE_BYTES + 1)
    >>> "spark.sql.codegen.wholeStage" in staging({small.table: small, mid.table: mid}).settings
    False
    >>> large = SourceSnapshot(TableName("s", "l"), None, 3, size_bytes=2 * PARTITION_BYTES)
    >>> staging({small.table: small, large.table: large}).settings[SHUFFLE_PARTITIONS_CONF]
    '3'
    >>> unknown = SourceSnapshot(TableName("s", "u"), None, 3)
    >>> staging({large.table: large, unknown.table: unknown})
    Staging(snapshots=frozenset(), partitions=None, settings={'spark.sql.adaptive.enabled': 'false'}, change_rows=True)
    """
    if _all_small(pinned):
        settings = dict(SMALL_SCAN_SETTINGS)
        if any((s.size_bytes or 0) > INTERPRETED_SOURCE_BYTES for s in pinned.values()):
            settings = {k: v for k, v in settings.items() if k not in INTERPRETED_SETTINGS}
        return Staging(snapshot_sources(pinned), SMALL_PARTITIONS, settings)
    settings = dict(CHANGE_SETTINGS)
    if pinned and all(s.size_bytes is not None for s in pinned.values()):
        partitions = -(-total_size(pinned.values()) // PARTITION_BYTES)
        settings[SHUFFLE_PARTITIONS_CONF] = str(max(1, partitions))
    return Staging(settings=settings, change_rows=True)


def snapshot_sources(pinned: Mapping[TableName, SourceSnapshot]) -> frozenset[TableName]:
    """The sources whose pinned snapshot a change statement may stage: all where all are small.

    A stage reads its source whole (emit.stage_snapshots). Where every source
    is small the write reads them whole anyway (no data skipping,
    SMALL_SCAN_SETTINGS); where one is large, each partner read keeps its key
    bounds, which read less than a whole copy: staging any small source
    took TPC-H SF 1's Q10 from 28.4 MB read in 31 jobs to 86.4 MB in 37 (its
    customers, 150,000 rows), Q5 from 41 jobs to 53 (2026-11-30).

    >>> small = SourceSnapshot(TableName("s", "t"), None, 3, size_bytes=5_000)
    >>> large = SourceSnapshot(TableName("s", "l"), None, 3, size_bytes=SMALL_SOURCE_BYTES + 1)
    >>> sorted(str(t) for t in snapshot_sources({small.table: small}))
    ['s.t']
    >>> snapshot_sources({small.table: small, large.table: large})
    frozenset()
    """
    return frozenset(pinned) if _all_small(pinned) else frozenset()


def _all_small(pinned: Mapping[TableName, SourceSnapshot]) -> bool:
    """Whether there are sources and every one is small (small_sources): the small-model rules."""
    return bool(pinned) and small_sources(pinned) == set(pinned)


def small_sources(pinned: Mapping[TableName, SourceSnapshot]) -> frozenset[TableName]:
    """The pinned sources of known size at most SMALL_SOURCE_BYTES.

    >>> small = SourceSnapshot(TableName("s", "t"), None, 3, size_bytes=5_000)
    >>> large = SourceSnapshot(TableName("s", "l"), None, 3, size_bytes=SMALL_SOURCE_BYTES + 1)
    >>> unknown = SourceSnapshot(TableName("s", "u"), None, 3)
    >>> sorted(str(t) for t in small_sources({s.table: s for s in (small, large, unknown)}))
    ['s.t']
    """
    return frozenset(
        table
        for table, snapshot in pinned.items()
        if snapshot.size_bytes is not None and snapshot.size_bytes <= SMALL_SOURCE_BYTES
    )


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
    # The column-changing commits among those recent ones (refresh/schema_changes.py),
    # and the oldest version that history read covers.
    schema_commits: tuple[SchemaCommit, ...] = ()
    history_from: int = 0
    # The Delta table read for it, where that is not `table`: the state of an
    # upstream ivm model, whose pin is named after the model's view.
    delta_table: TableName | None = None

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


def _millis(text: str) -> float:
    return datetime.fromisoformat(text).timestamp() * 1000


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

# A property every Delta table has (SHOW TBLPROPERTIES lists its protocol).
DELTA_PROTOCOL_PROPERTY = "delta.minReaderVersion"
CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"


def describe_detail(table: TableName) -> str:
    return f"DESCRIBE DETAIL {table.sql()}"


def show_properties(table: TableName) -> str:
    """SHOW TBLPROPERTIES: (key, value) rows; a Delta table's protocol and configuration."""
    return f"SHOW TBLPROPERTIES {table.sql()}"


def describe_history(table: TableName, limit: int | None = None) -> str:
    return f"DESCRIBE HISTORY {table.sql()}" + (f" LIMIT {int(limit)}" if limit else "")


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
        elif overwrites:
            # Its metrics count the rows written, not the rows it removed.
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


def set_commit_metadata(metadata: dict[str, Any]) -> str:
    # SET takes the rest of the statement as the value; JSON escapes keep a ';'
    # from a table name from ending the statement early in any client.
    value = json.dumps(metadata, sort_keys=True, ensure_ascii=True).replace(";", "\\u003b")
    return f"SET {USER_METADATA_CONF}={value}"


def reset_commit_metadata() -> str:
    return reset_conf(USER_METADATA_CONF)


def set_conf(key: str, value: str) -> str:
    return f"SET {key}={value}"


def reset_conf(key: str) -> str:
    """RESET <key>: back to the value the session started with."""
    return f"RESET {key}"


def read_conf(key: str) -> str:
    """SET <key>: one row, (key, value); the value '<undefined>' when it is not set."""
    return f"SET {key}"


def forget_last_commit() -> str:
    """Unset LAST_COMMIT_CONF, so that only a commit made after it can set it."""
    return reset_conf(LAST_COMMIT_CONF)


def conf_value(columns: list[str], rows: Rows) -> str | None:
    """The value of a read_conf answer; None when the conf is not set.

    >>> conf_value(["key", "value"], [["k", "<undefined>"]]) is None
    True
    >>> conf_value(["key", "value"], [["k", "12"]])
    '12'
    """
    if not rows:
        return None
    value = str(rows[0][columns.index("value")])
    return None if value == "<undefined>" else value


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
        metadata = _load(row[metadata_at])
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


# Messages of Spark/Delta errors that mean "the change feed for that window is
# gone": the only safe answer is a full rebuild at the pinned version.
CHANGE_HISTORY_UNAVAILABLE = (
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_CHANGE_TABLE_FEED_DISABLED",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    # A window spanning a column rename, drop or type change of a column
    # mapping table (refresh/schema_changes.py finds renames and drops beforehand).
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE",
    # A vacuumed change file, as the Thrift server reports it (no Java cause chain).
    "FAILED_READ_FILE.FILE_NOT_EXIST",
    "VersionNotFoundException",
    "cannot time travel",
    "Error getting change data",
    "change data was not recorded",
    "FileNotFoundException",
    "is not available for version",
)


# A Spark or Delta error's class and message, e.g. "[DELTA_FILE_NOT_FOUND] ...".
_ERROR_CLASS_LINE = re.compile(r"\[[A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)?\][^\n]*")


def error_summary(error: BaseException, limit: int = 300) -> str:
    """The line of an error that says what Spark refused, for quoting it in a reason.

    Over Thrift a Spark error reaches the plugin wrapped by dbt-spark
    ("Database Error", the server's exception chain), so its first line says
    little; the line with the error class says what happened.

    >>> error_summary(RuntimeError("Database Error\\n  org.x.HiveSQLException: Error running "
    ...     "query: org.y.E: [DELTA_X_Y] it failed.\\n  at z"))
    '[DELTA_X_Y] it failed.'
    >>> error_summary(ValueError("no class here"))
    'no class here'
    """
    found = _ERROR_CLASS_LINE.search(str(error))
    return found.group(0).strip()[:limit] if found else first_line(error, limit=limit)


# How Spark's RAISE_ERROR starts the error it raises.
RAISED = "[USER_RAISED_EXCEPTION]"


def is_cancelling_removal(error: BaseException) -> bool:
    """Whether a state MERGE refused a removal that would cancel a group's moments.

    Only as the message RAISE_ERROR raised: a statement's other errors (a
    syntax error, say) may quote its SQL, which holds the message too.

    >>> is_cancelling_removal(Exception("[USER_RAISED_EXCEPTION] ivm cancelled: taking ..."))
    True
    >>> is_cancelling_removal(Exception("[USER_RAISED_EXCEPTION] ivm guard: a.m__ivm_state"))
    False
    >>> is_cancelling_removal(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm cancelled: ...')"))
    False
    """
    return f"{RAISED} {CANCELLED}" in str(error)


def is_exhausted(error: BaseException) -> bool:
    """Whether a state MERGE stopped at a group whose bounded MIN/MAX values ran out.

    >>> is_exhausted(Exception("[USER_RAISED_EXCEPTION] ivm exhausted: a group of ..."))
    True
    >>> is_exhausted(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm exhausted: ...')"))
    False
    """
    return f"{RAISED} {EXHAUSTED}" in str(error)


def is_change_history_unavailable(error: BaseException) -> bool:
    text = str(error)
    return any(marker.lower() in text.lower() for marker in CHANGE_HISTORY_UNAVAILABLE)


# Errors of a MERGE into a state that mean another refresh of the same model
# committed first: its guard check failed (emit.GUARD_FAILED), or Delta found
# a concurrent commit to the files it read (DeltaConcurrentModificationException
# and its subclasses, by class name and by error class).
CONCURRENT_REFRESH = (
    f"{RAISED} {GUARD_FAILED}:",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def is_concurrent_refresh(error: BaseException) -> bool:
    """Whether a state MERGE failed because another refresh committed to the state first.

    >>> is_concurrent_refresh(Exception("[USER_RAISED_EXCEPTION] ivm guard: a.m__ivm_state ..."))
    True
    >>> is_concurrent_refresh(Exception("io.delta.exceptions.ConcurrentAppendException: Files"))
    True
    >>> is_concurrent_refresh(Exception("[DIVIDE_BY_ZERO] Division by zero"))
    False
    >>> is_concurrent_refresh(Exception("[PARSE_SYNTAX_ERROR] ... RAISE_ERROR('ivm guard: a')"))
    False
    """
    text = str(error)
    return any(marker in text for marker in CONCURRENT_REFRESH)
