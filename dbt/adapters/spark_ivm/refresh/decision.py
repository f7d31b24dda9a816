"""What a refresh does: build, rebuild, recompute, apply the change, or nothing.

A pure function of what the refresh read before writing anything: the plan,
the pinned sources, the state's newest refresh commit, the model's refresh
history and settings. `ivm_explain` calls it too, so the two never disagree
about the version ranges a refresh would read or why it would rebuild.
Nothing here talks to Spark: every branch is unit-tested without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dbt.adapters.spark_ivm.delta.records import RecordedState
from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, total_size
from dbt.adapters.spark_ivm.refresh import handoff, schema_changes, strategy
from dbt.adapters.spark_ivm.settings import Action, RefreshSettings, Strategy
from ivm_compiler import TableName, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange

FIRST_BUILD = "first build"
NO_SOURCE_COMMITS = "no source commits since the last refresh"
ONLY_PRESERVING_COMMITS = "only commits that keep the rows as they were (OPTIMIZE, VACUUM)"
NO_COMMON_PARTITION = (
    "its window functions have no PARTITION BY column in common, so any change may alter every row"
)

# dbt materializations that replace their whole relation on every run
# (CREATE OR REPLACE): a dependent ivm model reads what changed as the
# difference between the relation's rows at its recorded version and at its
# pin, which the Delta log keeps (reads.stage_net_change), or recomputes
# where reading the relation twice costs more (weigh_replaced).
WHOLESALE_MATERIALIZATIONS = ("table", "seed")
# An ivm model the compiler refuses, built as a table by ivm_fallback: written
# in place, so read through its change feed like a source, unless it was
# built anew (refresh/fallback.py says when; Facts.wholesale names it so).
FALLBACK_TABLE = "ivm_fallback"


@dataclass(frozen=True)
class Facts:
    """What the refresh read about the model's relations before deciding."""

    state: TableName
    # Whether the state table exists, and what it last recorded (None: no refresh commit).
    state_exists: bool
    recorded: RecordedState | None = None
    # Each source's column-changing commits after its recorded version (delta/schema_history.py).
    schema_commits: Mapping[TableName, tuple[SchemaCommit, ...]] = field(default_factory=dict)
    # The dbt materialization of each source that is a 'table' or 'seed' model.
    wholesale: Mapping[TableName, str] = field(default_factory=dict)
    # The model's refresh history (ivm_strategy: auto weighs it).
    history: Sequence[strategy.RefreshRecord] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    # Per source, the versions the state reflects and the pinned ones (empty for builds).
    ranges: Mapping[TableName, VersionRange] = field(default_factory=dict)
    # For a change: what ivm_strategy chose and why, and the change's size.
    choice: strategy.Choice | None = None
    change: strategy.ChangeSize | None = None

    @property
    def builds(self) -> bool:
        """Whether the state is computed from the sources (create_state)."""
        return self.action in (Action.BUILD, Action.REBUILD, Action.RECOMPUTE)


def version_ranges(
    pinned: Mapping[TableName, SourceSnapshot], recorded: RecordedState
) -> dict[TableName, VersionRange]:
    """Per source: the version the state reflects (the pin, for a source it never read) -> the pin.

    >>> snapshot = SourceSnapshot(TableName("raw", "t"), "id", 7)
    >>> state = RecordedState(3, "f", {"raw.t": {"version": 5, "table_id": "id"}})
    >>> list(version_ranges({snapshot.table: snapshot}, state).values())
    [VersionRange(recorded=5, pinned=7)]
    """
    ranges = {}
    for table, snapshot in pinned.items():
        after = int(recorded.sources.get(str(table), {}).get("version", snapshot.version))
        replaced = snapshot.replaced(after)
        ranges[table] = VersionRange(
            after,
            snapshot.version,
            overwritten=snapshot.overwritten(after) or replaced,
            replaced=replaced,
        )
    return ranges


def decide(
    plan: ViewPlan,
    pinned: Mapping[TableName, SourceSnapshot],
    facts: Facts,
    settings: RefreshSettings,
    net_rows: Mapping[TableName, int] = {},
) -> Decision:
    """The refresh's action and its reason; see the module docstring.

    `net_rows`: per overwritten relation, the rows of its change summed per
    row (emit.stage_net_changes), which its commit metrics cannot tell.
    """
    reason = rebuild_reason(plan, pinned, facts, settings)
    if reason is not None:
        return Decision(Action.BUILD if reason == FIRST_BUILD else Action.REBUILD, reason)
    assert facts.recorded is not None
    ranges = version_ranges(pinned, facts.recorded)
    changed = {table: r for table, r in ranges.items() if r.changed}
    if not changed:
        return Decision(Action.NO_CHANGE, NO_SOURCE_COMMITS, ranges)
    if all(pinned[t].only_preserving_data_after(r.recorded) for t, r in changed.items()):
        # Nothing to apply, and the state keeps recording the versions it was
        # computed at (they hold the same rows as the pinned ones).
        return Decision(Action.NO_CHANGE, ONLY_PRESERVING_COMMITS, ranges)
    if plan.view_class is ViewClass.WINDOW and not plan.window_partition:
        return Decision(Action.RECOMPUTE, NO_COMMON_PARTITION, ranges)
    costlier = weigh_replaced(pinned, changed, facts.history, net_rows, settings)
    if costlier is not None:
        return Decision(Action.RECOMPUTE, costlier, ranges)
    change = change_size(pinned, changed, net_rows)
    choice = strategy.choose(
        settings.strategy, facts.history, change, read_by_ivm_models=settings.change_feed
    )
    action = Action.RECOMPUTE if choice.way == Strategy.RECOMPUTE else Action.INCREMENTAL
    return Decision(action, choice.reason, ranges, choice, change)


def change_size(
    pinned: Mapping[TableName, SourceSnapshot],
    changed: Mapping[TableName, VersionRange],
    net_rows: Mapping[TableName, int] = {},
) -> strategy.ChangeSize | None:
    """The change's rows from the sources' commit metrics; None when a commit does not say.

    A relation in `net_rows` counts those rows (an overwritten relation's
    summed change) instead of its commits'. Otherwise an upstream's
    recompute that overwrote its state counts the change it estimated
    (SourceSnapshot.estimated_rows), and the size says so: a refresh that
    would apply it sums the overwrite first and decides again, exactly.

    >>> table = TableName("m", "up")
    >>> snapshot = SourceSnapshot(table, "id", 7, size_bytes=800)
    >>> change_size({table: snapshot}, {table: VersionRange(5, 7, overwritten=True)}) is None
    True
    >>> change_size({table: snapshot}, {table: VersionRange(5, 7, overwritten=True)}, {table: 12})
    ChangeSize(rows=12, source_bytes=800, bytes_per_row=None, estimated=False)
    """
    rows = 0
    per_row: list[float] = []
    estimated = False
    for table, window in changed.items():
        if table in net_rows:
            rows += net_rows[table]
            continue
        if window.replaced:
            return None  # no change feed to count: known once its difference is summed
        counted = pinned[table].changed_rows(after=window.recorded)
        if counted is None:
            estimate = pinned[table].estimated_rows(after=window.recorded)
            if estimate is None:
                return None
            rows, estimated = rows + estimate, True
            continue
        rows += counted[0]
        per_row.extend([counted[1]] if counted[1] else [])
    return strategy.ChangeSize(
        rows=rows,
        source_bytes=total_size(pinned.values()),
        bytes_per_row=max(per_row) if per_row else None,
        estimated=estimated,
    )


def rebuild_reason(
    plan: ViewPlan,
    pinned: Mapping[TableName, SourceSnapshot],
    facts: Facts,
    settings: RefreshSettings,
) -> str | None:
    """Why the state must be computed from the sources again; None: it can be brought forward."""
    state = f"the state table {facts.state}"
    if not facts.state_exists:
        return FIRST_BUILD
    if settings.full_refresh:
        return "--full-refresh"
    recorded = facts.recorded
    if recorded is None:
        return (
            f"{state} has no refresh commit in its history "
            "(created or rewritten outside dbt, or its history expired)"
        )
    if recorded.later_writes:
        return (
            f"{state} was written outside dbt after its last refresh "
            f"({', '.join(recorded.later_writes)})"
        )
    changed = schema_changes.read_columns_changed(plan, pinned, recorded, facts.schema_commits)
    if changed:
        return "a column it reads changed since the last refresh: " + "; ".join(
            c.describe() for c in changed
        )
    blocking = [
        (table, commit)
        for table, commits in facts.schema_commits.items()
        for commit in commits
        if commit.blocks_change_feed and commit.version <= pinned[table].version
    ]
    if blocking:
        return (
            "the change feed cannot be read across a column rename or drop ("
            + "; ".join(f"{table}: {commit.describe()}" for table, commit in blocking)
            + "), so the sources are read again in full"
        )
    if recorded.fingerprint != plan.fingerprint:
        return "the model's SQL or its columns changed since the state was built"
    if recorded.guard is None:
        # Only a commit made by hand with refresh metadata gets here (the
        # state format version is in the fingerprint).
        return f"{state} has no guard row to check its MERGE against"
    return _source_replaced(plan, pinned, recorded, facts.wholesale)


def _source_replaced(
    plan: ViewPlan,
    pinned: Mapping[TableName, SourceSnapshot],
    recorded: RecordedState,
    wholesale: Mapping[TableName, str],
) -> str | None:
    """Why a source cannot be read as a change since the recorded version, if it cannot."""
    for table, snapshot in pinned.items():
        previous = recorded.sources.get(str(table))
        if previous is None:
            return f"the model now reads {table}, which its state does not reflect"
        materialized = wholesale.get(table)
        same_table = snapshot.same_table(previous) is True
        if materialized == FALLBACK_TABLE and not same_table:
            return (
                f"{table} is an ivm model built as a table by ivm_fallback (its query cannot "
                "be maintained), and it was built anew since the last refresh (its log says "
                "why: a first build, other columns, --full-refresh), so it is read again in full"
            )
        moved = int(previous["version"]) != int(snapshot.version)
        if materialized in WHOLESALE_MATERIALIZATIONS and (moved or not same_table):
            unreadable = _difference_unreadable(plan, table, snapshot, previous)
            if unreadable is not None:
                return (
                    f"{table} is a dbt '{materialized}' model, replaced as a whole by every run, "
                    f"and {unreadable}, so it is read again in full (materialize it as 'ivm' "
                    "to propagate only its changes)"
                )
            continue  # its change: the difference of its two versions
        if not same_table:
            if table in plan.upstreams:
                # Its rebuild is a CREATE OR REPLACE of its state (same_table).
                return f"the upstream ivm model {table} was rebuilt since the last refresh"
            return f"{table} was dropped and recreated since the last refresh"
        if int(previous["version"]) > snapshot.version:
            return f"{table} is at version {snapshot.version}, older than the recorded one"
    return None


def _difference_unreadable(
    plan: ViewPlan, table: TableName, snapshot: SourceSnapshot, previous: Mapping[str, Any]
) -> str | None:
    """Why a replaced `table` model's change cannot be read from its two versions, if it cannot.

    The recorded version must still be in the table's log (replaced, not
    dropped and created again), and the columns the model reads must be
    what they were there: the difference reads them at both versions.
    """
    if not snapshot.continues(previous):
        return "its log no longer holds the recorded version (dropped and created again)"
    read = previous.get("columns")
    if not read:
        return "the columns the model read of it were not recorded"
    now = {name.lower(): kind for name, kind in plan.source_columns.get(table, {}).items()}
    before = {str(name).lower(): str(kind) for name, kind in read.items()}
    if set(now) - set(before) or any(
        schema_changes.normal_type(now[name]) != schema_changes.normal_type(kind)
        for name, kind in before.items()
        if name in now
    ):
        return "the columns the model reads of it changed"
    return None


def weigh_replaced(
    pinned: Mapping[TableName, SourceSnapshot],
    changed: Mapping[TableName, VersionRange],
    history: Sequence[strategy.RefreshRecord],
    net_rows: Mapping[TableName, int],
    settings: RefreshSettings,
) -> str | None:
    """Why recomputing beats reading a replaced relation's difference, if it does.

    The difference reads the relation at two versions, every row twice
    (then sums them per row); a recompute reads every source once. Under
    ivm_strategy 'auto', where the replaced relations hold at least
    strategy.MIN_WEIGHED_BYTES (smaller, both ways cost about their floor)
    and reading them twice is estimated to cost more than
    recomputing (seconds per byte from the model's history, or bytes alone
    without one), the model recomputes. Once a difference was read
    (`net_rows`), its exact size decides as any change's does.

    >>> table = TableName("m", "dim")
    >>> big = SourceSnapshot(table, None, 7, size_bytes=10**9)
    >>> replaced = {table: VersionRange(5, 7, True, replaced=True)}
    >>> print(weigh_replaced({table: big}, replaced, [], {}, RefreshSettings()))
    reading the difference of the replaced m.dim reads 2,000,000,000 bytes (its rows at two versions), more than the 1,000,000,000 a recompute reads
    """
    if settings.strategy != Strategy.AUTO:
        return None
    replaced = [t for t, r in changed.items() if r.replaced and t not in net_rows]
    if not replaced:
        return None
    twice = 2 * sum(pinned[t].size_bytes or 0 for t in replaced)
    total = total_size(pinned.values())
    if twice < 2 * strategy.MIN_WEIGHED_BYTES or twice <= total:
        return None
    names = ", ".join(str(t) for t in replaced)
    seconds = handoff.write_seconds(history, 1)
    if seconds is None:
        return (
            f"reading the difference of the replaced {names} reads {twice:,} bytes (its rows "
            f"at two versions), more than the {total:,} a recompute reads"
        )
    return (
        f"reading the difference of the replaced {names}: estimated {seconds * twice:.1f}s "
        f"(its {twice // 2:,} bytes twice) vs {seconds * total:.1f}s recompute (history)"
    )
