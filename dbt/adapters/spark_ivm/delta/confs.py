"""The session confs the plugin sets, resets and reads, and those a change runs under.

A commit's metadata is a session conf Delta writes into the commit
(set_commit_metadata), and Delta sets another to the version of the
session's last commit (LAST_COMMIT_CONF); COMMIT_LOCK keeps one commit of
this process from carrying another's metadata. A change over pinned sources
runs every statement under the confs `staging` chooses by the sources' sizes
(CHANGE_SETTINGS, no adaptive execution; over small sources
SMALL_SCAN_SETTINGS, their snapshots staged, each stage in one partition).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from dbt.adapters.spark_ivm.delta.history import Rows
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, total_size
from ivm_compiler import TableName

# Delta writes this session conf into the commitInfo of every commit made while
# it is set: the refresh uses it to record, in the same commit as its data, the
# source versions a state table reflects.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

# Over a Thrift server with singleSession every connection (each dbt thread's,
# and other clients') shares one SparkSession, so a session conf set for one
# commit is seen by any statement another runs meanwhile; so did every dbt
# thread of the embedded runtime before each connection had a session of its
# own (runtime/sessions.py). On a shared session the plugin's commits run under
# this lock (commit_lock): a refresh sets and resets its commit metadata inside
# it, and the commit log's appends wait for it, so no commit of this process's
# plugin carries another's metadata.
# (Delta's idempotent-write confs were tried for concurrent refreshes of one
# model and dropped for this reason: another thread's INSERT into a source,
# made while they were set, would be skipped as a repeat.)
COMMIT_LOCK = threading.Lock()


def commit_lock(shared_session: bool) -> AbstractContextManager[object]:
    """COMMIT_LOCK where the connection's Spark session is shared; otherwise no lock.

    A session of its own carries no other client's confs, and holding the
    lock there serialized every write of a multi-threaded run: at warehouse
    scale 1500 with 4 dbt threads (2026-12-04, f29e648) it was held for 287.1 s
    of the batch's 304.8 s, models waiting up to 30 s to begin a commit while
    another model's MERGE ran.
    """
    return COMMIT_LOCK if shared_session else nullcontext()


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


class _Executes(Protocol):
    def execute(self, sql: str) -> Any: ...


# The confs the open `under` blocks of each runner set, outermost first, per
# thread (a runner runs one model's statements, on one thread). A block
# nested in another gives a conf back the enclosing block's value, not the
# session's default: a stage's block inside a change's block that RESET
# adaptive execution would turn it back on for the rest of the change.
# Keyed by the runner, not the thread alone: a block on another runner may
# be another session, whose confs the enclosing block never set. An entry
# lives only while a block holds its runner, so its id is not reused.
_OPEN = threading.local()


def _blocks(runner: _Executes) -> list[Mapping[str, str]]:
    if not hasattr(_OPEN, "by_runner"):
        _OPEN.by_runner = {}
    by_runner: dict[int, list[Mapping[str, str]]] = _OPEN.by_runner
    return by_runner.setdefault(id(runner), [])


def _enclosing_value(blocks: list[Mapping[str, str]], key: str) -> str | None:
    """The value the innermost of `blocks` that sets `key` sets it to; None where none does.

    >>> _enclosing_value([{"a": "1"}, {"a": "2", "b": "3"}], "a"), _enclosing_value([], "a")
    ('2', None)
    """
    for block in reversed(blocks):
        if key in block:
            return block[key]
    return None


@contextmanager
def under(runner: _Executes, settings: Mapping[str, str]) -> Iterator[None]:
    """Session confs set for the statements of the block, whatever happened given back after it:
    the value an enclosing block on the same runner set, else the session's default.

    A conf the enclosing block already set to the same value is neither set nor given back.
    """
    blocks = _blocks(runner)
    changed = {k: v for k, v in settings.items() if _enclosing_value(blocks, k) != v}
    for key, value in changed.items():
        runner.execute(set_conf(key, value))
    blocks.append(changed)
    try:
        yield
    finally:
        blocks.pop()
        if not blocks:
            del _OPEN.by_runner[id(runner)]
        for key in changed:
            outer = _enclosing_value(blocks, key)
            runner.execute(reset_conf(key) if outer is None else set_conf(key, outer))


@contextmanager
def committing(
    runner: _Executes, metadata: Mapping[str, Any], shared_session: bool
) -> Iterator[None]:
    """The block's Delta commits carry `metadata`: set before it and reset after it, under
    commit_lock, so no other client's commit on a shared session takes it for its own."""
    with commit_lock(shared_session):
        runner.execute(set_commit_metadata(dict(metadata)))
        try:
            yield
        finally:
            runner.execute(reset_commit_metadata())


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
#
# And planned statically, as every change statement is (CHANGE_SETTINGS): an
# adaptive CACHE TABLE runs its shuffle stages while it builds its cached
# plan, holding that cache entry's lock, and every UNCACHE of any thread
# (a stage dropped) waits on each entry's lock while it re-checks them. On
# the warehouse at scale 6000 six drops of other models waited 77.9 s on the
# NTILE fallback's adaptive difference (bench/micro/uncache_wait.py: an
# UNCACHE waited 22.6-28.5 s on an adaptive CACHE TABLE, 0.1 s on a static
# one, 2026-12-07).
STAGE_SETTINGS = {
    "spark.sql.legacy.storeAnalyzedPlanForView": "true",
    ADAPTIVE_CONF: "false",
}

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
    # Whether a source is large (past SMALL_SOURCE_BYTES, or of unknown size).
    large: bool = False
    # Whether the state is written sorted by its key (ivm_compiler/layout.py):
    # sources of SORTED_STATE_BYTES or more, or of unknown size.
    sorted_states: bool = False
    # Whether key relations are read within the change's listed keys:
    # sources of KEY_RELATION_LIST_BYTES or more, or of unknown size.
    key_relation_lists: bool = False
    # Whether every state MERGE reads the change query's rows staged and is
    # bounded by their listed keys (writes.StateWrites._target_bounds):
    # sources of MERGE_LIST_BYTES or more, or of unknown size.
    merge_lists: bool = False


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

# Pinned sources of at least this many bytes have their states written
# sorted by key (layout.py): there a state of their rows spans tens of files
# of layout.ROWS_PER_FILE rows, which a MERGE bounded by the change's keys
# can skip. Below it a sorted state is a file or two per shuffle partition,
# and the sort a cost without a return: on the warehouse at scale 1500
# (sources of 16-150 MB; 2026-12-05, warehouse-scale1500-batch60-warm-
# exp-gc-nosort.md) the first build's executor tasks took 148.6 CPU s
# unsorted where 207.7 sorted, and the day's batch 229.7 where 232.9.
SORTED_STATE_BYTES = PARTITION_BYTES
# Sources from which a key relation (a semi, anti or outer join's distinct
# keys) is read within the change's listed keys (ivm_compiler/key_bounds.py):
# the list spares grouping the relation's input whole, and costs planning
# a literal per key in every term. Between the two measured sides, not tuned:
# the worked example's customers_to_chase (22.7 MB of sources, 4,943 keys)
# refreshed in 12.0 s with it where 7.0 s; the warehouse's slv_payments at
# scale 6000 (288 MB) took 4.5 executor CPU s where 33.4 (2026-12-06).
KEY_RELATION_LIST_BYTES = 64 * 1024 * 1024
# Sources from which every state MERGE stages its change query's rows and
# lists their keys in ON (writes.StateWrites._target_bounds): two statements
# more per refresh, for a MERGE that joins only the listed keys' state rows
# (bench/micro/merge_key_list.py: 8.5 s where 23.1 s on a 7.1 M-row state).
# The key relations' threshold, for the same trade, not tuned.
MERGE_LIST_BYTES = KEY_RELATION_LIST_BYTES

# Sources under this many bytes in all are read by a change without Delta's
# data skipping, as small sources are (SMALL_SCAN_SETTINGS), though with
# generated code and as many partitions as the cores. Skipping plans each
# scan with a Spark job of its own over the files' statistics. Below
# KEY_RELATION_LIST_BYTES a change's reads are bounded by key ranges at most,
# which prune files only where the change's keys cluster, and the files they
# could spare cost about what planning them does. The worked example (22.7 MB
# of sources, a change spread over its customers, 2026-12-07,
# bench/results/issue54/unskipped-sources-example.txt): revenue_by_segment's
# refresh statements replayed warm took 4.0-4.5 s without skipping against
# 5.1-5.7 s with it (its MERGE 1.70-1.74 s against 2.39-2.74 s), and
# customer_activity's change query planned in 0.25-0.38 s against 1.13-1.43 s.
UNSKIPPED_SOURCE_BYTES = KEY_RELATION_LIST_BYTES

# The confs of a change over small sources: CHANGE_SETTINGS, no data
# skipping (a large source's key-bounded reads, key_bounds.py, are what it
# makes cheap), SMALL_PARTITIONS shuffle partitions and no generated code.
SMALL_SCAN_SETTINGS = {
    **CHANGE_SETTINGS,
    DATA_SKIPPING_CONF: "false",
    SHUFFLE_PARTITIONS_CONF: str(SMALL_PARTITIONS),
    **INTERPRETED_SETTINGS,
}


def staging(
    pinned: Mapping[TableName, SourceSnapshot],
    parallelism: int = 1,
    state_deletion_vectors: bool = False,
) -> Staging:
    """How a change over `pinned` runs: without adaptive execution, the cheapest plan if small.

    Where every source's size is known (SourceSnapshot.size_bytes) and at
    most SMALL_SOURCE_BYTES: SMALL_SCAN_SETTINGS (interpreted only where
    every source is at most INTERPRETED_SOURCE_BYTES; with data skipping
    where a source or the state may have deletion vectors,
    `state_deletion_vectors`: Delta refuses to scan them without it,
    tables.may_have_deletion_vectors), every snapshot
    stageable, each stage in SMALL_PARTITIONS; elsewhere CHANGE_SETTINGS
    (without data skipping under UNSKIPPED_SOURCE_BYTES, vectors aside),
    with a shuffle partition per PARTITION_BYTES of sources where every
    size is known, and at least `parallelism` (the engine's cores: a
    change over a few hundred MB in one partition left a core idle in
    each of its shuffles).

    >>> small = SourceSnapshot(TableName("s", "t"), None, 3, size_bytes=5_000)
    >>> staged = staging({small.table: small})
    >>> staged.partitions, sorted(str(t) for t in staged.snapshots)
    (1, ['s.t'])
    >>> sorted(staged.settings.items())  # doctest: +NORMALIZE_WHITESPACE
    [('spark.databricks.delta.stats.skipping', 'false'), ('spark.sql.adaptive.enabled', 'false'),
     ('spark.sql.codegen.factoryMode', 'NO_CODEGEN'), ('spark.sql.codegen.wholeStage', 'false'),
     ('spark.sql.shuffle.partitions', '1')]
    >>> vectored = SourceSnapshot(small.table, None, 3, size_bytes=5_000, deletion_vectors=True)
    >>> DATA_SKIPPING_CONF in staging({small.table: vectored}).settings
    False
    >>> DATA_SKIPPING_CONF in staging({small.table: small}, state_deletion_vectors=True).settings
    False
    >>> mid = SourceSnapshot(TableName("s", "m"), None, 3, size_bytes=INTERPRETED_SOURCE_BYTES + 1)
    >>> "spark.sql.codegen.wholeStage" in staging({small.table: small, mid.table: mid}).settings
    False
    >>> large = SourceSnapshot(TableName("s", "l"), None, 3, size_bytes=2 * PARTITION_BYTES)
    >>> staging({small.table: small, large.table: large}).settings[SHUFFLE_PARTITIONS_CONF]
    '3'
    >>> staging({small.table: small, large.table: large}, parallelism=8).settings[SHUFFLE_PARTITIONS_CONF]
    '8'
    >>> unknown = SourceSnapshot(TableName("s", "u"), None, 3)
    >>> staging({small.table: small, large.table: large}).sorted_states
    True
    >>> mid_large = SourceSnapshot(TableName("s", "b"), None, 3, size_bytes=SMALL_SOURCE_BYTES + 1)
    >>> staging({mid_large.table: mid_large}).sorted_states
    False
    >>> staging({large.table: large, unknown.table: unknown})  # doctest: +NORMALIZE_WHITESPACE
    Staging(snapshots=frozenset(), partitions=None, settings={'spark.sql.adaptive.enabled': 'false'},
            change_rows=True, large=True, sorted_states=True, key_relation_lists=True,
            merge_lists=True)
    >>> staging({mid_large.table: mid_large}).settings[DATA_SKIPPING_CONF]
    'false'
    >>> staging({mid_large.table: mid_large}).key_relation_lists
    False
    >>> staging({mid_large.table: mid_large}).merge_lists
    False
    """
    if _all_small(pinned):
        settings = dict(SMALL_SCAN_SETTINGS)
        if any((s.size_bytes or 0) > INTERPRETED_SOURCE_BYTES for s in pinned.values()):
            settings = {k: v for k, v in settings.items() if k not in INTERPRETED_SETTINGS}
        if not skips_without_statistics(pinned, state_deletion_vectors):
            del settings[DATA_SKIPPING_CONF]
        return Staging(snapshot_sources(pinned), SMALL_PARTITIONS, settings)
    settings = dict(CHANGE_SETTINGS)
    if skips_without_statistics(pinned, state_deletion_vectors):
        settings[DATA_SKIPPING_CONF] = "false"
    total = _known_total(pinned)
    if total is not None:
        partitions = -(-total // PARTITION_BYTES)
        settings[SHUFFLE_PARTITIONS_CONF] = str(max(parallelism, partitions))
    sorted_states = bool(pinned) and (total is None or total >= SORTED_STATE_BYTES)
    return Staging(
        settings=settings,
        change_rows=True,
        large=bool(pinned),
        sorted_states=sorted_states,
        key_relation_lists=bool(pinned) and (total is None or total >= KEY_RELATION_LIST_BYTES),
        merge_lists=bool(pinned) and (total is None or total >= MERGE_LIST_BYTES),
    )


def skips_without_statistics(
    pinned: Mapping[TableName, SourceSnapshot], state_deletion_vectors: bool = False
) -> bool:
    """Whether a change over `pinned` turns data skipping off: small sources, or under UNSKIPPED_SOURCE_BYTES.

    Not where a source or the state may have deletion vectors: Delta 3.3 and
    4.0.1 refuse to scan those without it (tables.may_have_deletion_vectors).

    >>> mid = SourceSnapshot(TableName("s", "m"), None, 3, size_bytes=SMALL_SOURCE_BYTES + 1)
    >>> skips_without_statistics({mid.table: mid})
    True
    >>> skips_without_statistics({mid.table: mid}, state_deletion_vectors=True)
    False
    >>> large = SourceSnapshot(TableName("s", "l"), None, 3, size_bytes=UNSKIPPED_SOURCE_BYTES)
    >>> skips_without_statistics({mid.table: mid, large.table: large})
    False
    >>> unknown = SourceSnapshot(TableName("s", "u"), None, 3)
    >>> skips_without_statistics({mid.table: mid, unknown.table: unknown})
    False
    """
    vectors = state_deletion_vectors or any(s.deletion_vectors for s in pinned.values())
    if vectors or not pinned:
        return False
    if _all_small(pinned):
        return True
    total = _known_total(pinned)
    return total is not None and total < UNSKIPPED_SOURCE_BYTES


def _known_total(pinned: Mapping[TableName, SourceSnapshot]) -> int | None:
    """The sources' bytes together; None where there is none or a size is unknown."""
    if not pinned or any(s.size_bytes is None for s in pinned.values()):
        return None
    return total_size(pinned.values())


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
