"""One refresh of one ivm model: pin, decide, apply, record, publish.

The recipe (DESIGN.md, "Flow of one refresh"):
1. compile the model (refusals happen here, before any SQL changes data);
2. pin the source at its latest Delta version and check it can feed changes;
3. read what the state table last recorded, in the commit of its own data;
4. decide: first build, full rebuild (and why), nothing to do, or incremental;
5. apply with one statement that commits data and recorded versions together;
6. publish: point the model's view at the new state version, at once or, for
   a consistency group, when every member has applied (publish.py).

Exactly once: the only statements that change the state are single Delta
commits (CREATE OR REPLACE TABLE ... AS SELECT, MERGE) carrying the source
versions they reflect in their commit metadata. A refresh stopped between any
two statements leaves the state at its last commit; the next run reads the
versions from that commit and applies exactly the window after it.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlglot import exp, parse_one

from dbt.adapters.spark_ivm import delta, join_states, schema_changes, strategy
from dbt.adapters.spark_ivm.groups import Staged
from dbt.adapters.spark_ivm.publish import Log, Publisher, Runner
from ivm_compiler import (
    InvalidSource,
    NotMaintainable,
    TableName,
    ViewPlan,
    compile_model,
    emit,
    key_bounds,
    names,
    nodes,
)
from ivm_compiler.compile import source_tables
from ivm_compiler.errors import first_line
from ivm_compiler.parse import parse_model, parse_statement
from ivm_compiler.plan import UpstreamModel, ViewClass
from ivm_compiler.reads import VersionRange
from ivm_compiler.sql import DIALECT
from ivm_compiler.view_classes import window as windows_rules

FALLBACK_FULL_REFRESH = "full_refresh"
FALLBACK_VALUES = (FALLBACK_FULL_REFRESH,)


@dataclass
class RefreshResult:
    """What a refresh did; the materialization stores it as the node's adapter response."""

    action: str  # build | rebuild | recompute | incremental | no_change | fallback
    reason: str
    source_versions: dict[str, int] = field(default_factory=dict)
    previous_versions: dict[str, int] = field(default_factory=dict)
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    seconds: float = 0.0

    @property
    def rows_affected(self) -> int:
        return self.rows_inserted + self.rows_updated + self.rows_deleted

    @property
    def message(self) -> str:
        versions = ", ".join(
            f"{name}@{self.previous_versions[name]}->{version}"
            if name in self.previous_versions
            else f"{name}@{version}"
            for name, version in self.source_versions.items()
        )
        if self.action == "incremental":
            counts = f"+{self.rows_inserted} ~{self.rows_updated} -{self.rows_deleted} state rows"
            return f"IVM incremental {counts} ({versions})"
        if self.action == "no_change":
            if self.reason != NO_SOURCE_COMMITS:
                return f"IVM no changes: {self.reason} ({versions})"
            return f"IVM no changes ({versions})"
        return f"IVM {self.action}: {self.reason} ({versions})"


@dataclass
class Refresh:
    runner: Runner
    log: Log
    model: str
    sql: str
    target: TableName
    state: TableName
    full_refresh: bool = False
    fallback: str | None = None
    # The relation's type ('table', 'view') if it exists, from dbt's relation cache.
    relation_exists: Callable[[TableName], str | None] = lambda table: None
    drop_relation: Callable[[TableName, str], None] = lambda table, kind: None
    catalog_columns: Callable[[TableName], list[tuple[str, str]]] = lambda table: []
    # persist_docs: the view carries the model's descriptions; it is then recreated
    # on every run, so edited descriptions show up without a rebuild.
    docs: emit.ViewDocs | None = None
    # The materialization of every dbt model this one refs, by "schema.identifier".
    upstream_materializations: dict[str, str] = field(default_factory=dict)
    # Publishes the refreshed state (alone, or with the model's consistency group)
    # and shares the group's source pins; None: the view is created directly.
    publisher: Publisher | None = None
    # ivm_strategy: auto | incremental | recompute (strategy.py).
    strategy: str = strategy.AUTO
    # ivm_join_state: none | auto | all | a list of aliases (join_states.py).
    join_state: str | list[str] = join_states.NONE
    # ivm_window_order_unique: the user vouches that every window's PARTITION BY
    # and ORDER BY pick out one row, so the plan's tie warnings are not logged.
    window_order_unique: bool = False
    # dbt's on_schema_change, for the model's own columns: 'fail' stops a
    # rebuild that would change them; the other values rebuild (an ivm model
    # always has its query's columns).
    on_schema_change: str = "ignore"
    # Tells dbt's relation cache about a relation the refresh created besides the
    # model's own (a plan node's view and state), so later lookups find it.
    relation_created: Callable[[TableName, str], None] = lambda table, kind: None
    # A plan node's refresh pins its sources through the model's refresh, so the
    # node and the model read every source at the same version.
    pins_from: Refresh | None = None
    _started: float = field(default_factory=time.monotonic, init=False, repr=False)
    # The model's refresh history (its view carries it) and this refresh's change size.
    _history: list[strategy.RefreshRecord] = field(default_factory=list, init=False, repr=False)
    _change: strategy.ChangeSize | None = field(default=None, init=False, repr=False)
    # Every source pinned in this refresh (by the model or its plan nodes), by lower-case name.
    _pins: dict[str, delta.SourceSnapshot] = field(default_factory=dict, init=False, repr=False)
    _split: nodes.Split | None = field(default=None, init=False, repr=False)
    # The state's DESCRIBE HISTORY rows recorded() read (columns, rows).
    _state_history: tuple[list[str], Sequence[Sequence[Any]]] | None = field(
        default=None, init=False, repr=False
    )

    def run(self) -> RefreshResult:
        started = self._started = time.monotonic()
        try:
            split = self.split()
            self._refresh_nodes(split)
            plan = self.compile(split)
        except NotMaintainable as refusal:
            # A refusal of SQL that compiled at the last refresh: a source
            # column the model reads may have been renamed or dropped since.
            self._raise_if_source_columns_changed(refusal)
            if self.fallback != FALLBACK_FULL_REFRESH:
                raise
            result = self._recompute(str(refusal))
            if self.publisher is not None:
                self.publisher.withdraw()
        else:
            result = self._maintain(plan)
        result.seconds = time.monotonic() - started
        return result

    def _raise_if_source_columns_changed(self, refusal: NotMaintainable) -> None:
        """Raise SourceSchemaChanged when a column the state was built on is gone."""
        if self.relation_exists(self.state) is None:
            return
        recorded = self.recorded()
        if recorded is None:
            return
        changes: list[schema_changes.ColumnChange] = []
        versions: dict[str, int] = {}
        for source, entry in recorded.sources.items():
            if not entry.get("columns"):
                continue
            table = table_name_of(source)
            try:
                current = self.catalog_columns(table)
            except Exception as error:  # noqa: BLE001 - a source that is gone: the refusal says it
                self.log.debug(f"{self.model}: cannot list the columns of {table}: {error}")
                continue
            if not current:
                continue  # no such table now: the refusal already says what is wrong
            after = int(entry["version"])
            found = schema_changes.read_column_changes(
                source, entry["columns"], current, self._schema_commits_after(table, after)
            )
            gone = [c for c in found if c.kind in ("renamed", "dropped")]
            if gone:
                changes.extend(gone)
                versions[source] = after
        if changes:
            raise schema_changes.SourceSchemaChanged(
                self.model, changes, versions, first_line(refusal, limit=300)
            ) from refusal

    def _schema_commits_after(
        self, table: TableName, after: int, snapshot: delta.SourceSnapshot | None = None
    ) -> tuple[schema_changes.SchemaCommit, ...]:
        """The column-changing commits of `table` after version `after`.

        A pin's recent history usually covers the window; a longer one (or no
        pin yet) reads the table's whole history.
        """
        if snapshot is not None and snapshot.history_from <= after + 1:
            commits = snapshot.schema_commits
        else:
            columns, rows = self.runner.query(delta.describe_history(table))
            commits = schema_changes.schema_commits(columns, rows)
        return tuple(c for c in commits if c.version > after)

    def split(self) -> nodes.Split:
        """The model's query and its plan nodes (CTEs and subqueries that cannot be merged)."""
        self._split = nodes.split_nodes(self.model, self.sql, self.target, self.catalog_columns)
        return self._split

    def compile(self, split: nodes.Split | None = None) -> ViewPlan:
        """The model's plan; raises NotMaintainable before any SQL changes data.

        With plan nodes, their views must exist (the run refreshes them first).
        """
        split = split or self.split()
        tables = source_tables(parse_model(self.model, split.sql))
        if split.nodes:
            tables += source_tables(parse_statement(self.model, self.sql))
        upstreams = self._upstream_models(list(dict.fromkeys(tables)))
        return compile_model(
            self.model,
            split.sql,
            _SparkCatalog(self),
            upstreams,
            written=self.sql if split.nodes else None,
        )

    def _refresh_nodes(self, split: nodes.Split) -> None:
        """Refresh each plan node, in order, as an ivm model of its own, at this refresh's pins."""
        for node in split.nodes:
            state = state_of(node.relation)
            node_refresh = Refresh(
                runner=self.runner,
                log=self.log,
                model=f"{self.model} (CTE {node.name})",
                sql=node.sql,
                target=node.relation,
                state=state,
                full_refresh=self.full_refresh,
                relation_exists=self.relation_exists,
                drop_relation=self.drop_relation,
                catalog_columns=self.catalog_columns,
                upstream_materializations=self.upstream_materializations,
                strategy=self.strategy,
                window_order_unique=self.window_order_unique,
                relation_created=self.relation_created,
                pins_from=self,
            )
            result = node_refresh.run()
            self.relation_created(state, "table")
            self.relation_created(node.relation, "view")
            self.log.info(f"{self.model}: CTE {node.name}: {result.message}")

    # -- the ivm path -------------------------------------------------------

    def _maintain(self, plan: ViewPlan) -> RefreshResult:
        for warning in () if self.window_order_unique else plan.tie_warnings:
            self.log.warning(warning)
        pinned = {table: self.pin(table, plan.upstreams.get(table)) for table in plan.tables}
        if isinstance(self.join_state, list):
            # An ivm_join_state alias that cannot keep a join state stops the
            # refresh here, before anything is written.
            self.join_states(pinned).chosen(plan, building=False)
        target_type = self.relation_exists(self.target)
        if target_type not in (None, "view"):
            # The model was materialized as something else before (e.g. 'table').
            self.log.info(
                f"{self.model}: replacing the {target_type} {self.target} with the ivm view"
            )
            self.drop_relation(self.target, target_type)
            target_type = None

        state_exists = self.relation_exists(self.state) is not None
        recorded = self.recorded() if state_exists else None
        shown_version = self.published_version(target_type)
        reason = self._rebuild_reason(plan, pinned, state_exists, recorded)
        if reason not in (None, FIRST_BUILD) and not self.full_refresh and target_type == "view":
            reason = self._with_model_columns(plan, reason)
        if reason is not None:
            action = "build" if reason == FIRST_BUILD else "rebuild"
            if action == "rebuild" and not self.full_refresh:
                self.log.warning(f"{self.model}: rebuilding fully: {reason}")
            return self._build(plan, pinned, action, reason, shown_version)

        assert recorded is not None
        windows = {
            table: VersionRange(
                recorded=int(recorded.sources[str(table)]["version"]), pinned=snapshot.version
            )
            for table, snapshot in pinned.items()
        }
        result = RefreshResult(
            action="no_change",
            reason=NO_SOURCE_COMMITS,
            source_versions={str(t): s.version for t, s in pinned.items()},
            previous_versions={str(t): w.recorded for t, w in windows.items()},
        )
        if any(window.changed for window in windows.values()) and all(
            pinned[table].only_preserving_data_after(window.recorded)
            for table, window in windows.items()
            if window.changed
        ):
            # Nothing to apply, and the state keeps recording the versions it
            # was computed at (they hold the same rows as the pinned ones).
            result.reason = "only commits that keep the rows as they were (OPTIMIZE, VACUUM)"
        elif any(window.changed for window in windows.values()):
            if plan.view_class is ViewClass.WINDOW and not plan.window_partition:
                reason = (
                    "its window functions have no PARTITION BY column in common, so any "
                    "change may alter every row"
                )
                self.log.info(f"{self.model}: recomputing: {reason}")
                return self._build(plan, pinned, "recompute", reason, shown_version)
            choice = self._choose(pinned, windows, target_type)
            if choice.way == strategy.RECOMPUTE:
                self.log.info(f"{self.model}: recomputing instead of applying: {choice.reason}")
                return self._build(plan, pinned, "recompute", choice.reason, shown_version)
            if choice.estimate is not None:
                self.log.debug(f"{self.model}: applying the change: {choice.reason}")
            try:
                if plan.view_class is ViewClass.WINDOW:
                    touched = self._touched_partitions(plan, windows)
                    if len(touched) > windows_rules.MAX_TOUCHED_PARTITIONS:
                        reason = (
                            f"the change touches more than {windows_rules.MAX_TOUCHED_PARTITIONS} "
                            "window partitions"
                        )
                        self.log.info(f"{self.model}: recomputing instead of applying: {reason}")
                        return self._build(plan, pinned, "recompute", reason, shown_version)
                    self._apply_partitions(plan, pinned, touched, result, recorded)
                else:
                    self._apply_changes(plan, pinned, windows, result, recorded)
            except ConcurrentRefresh:
                raise
            except Exception as error:
                if not delta.is_change_history_unavailable(error):
                    raise
                changed = ", ".join(
                    f"{table} between versions {w.recorded + 1} and {w.pinned}"
                    if w.changed
                    else f"{table} at version {w.recorded}"
                    for table, w in windows.items()
                )
                reason = (
                    f"the change feed or an old version of {changed} can no longer be read "
                    f"({delta.error_summary(error)})"
                )
                self.log.warning(f"{self.model}: rebuilding fully: {reason}")
                return self._build(plan, pinned, "rebuild", reason, shown_version)
        state_version = (
            self._state_version() if result.action == "incremental" else recorded.state_version
        )
        self._publish(plan, result, pinned, state_version, shown_version)
        return result

    def _choose(
        self,
        pinned: dict[TableName, delta.SourceSnapshot],
        windows: dict[TableName, VersionRange],
        target_type: str | None,
    ) -> strategy.Choice:
        """Apply the change or recompute (ivm_strategy); remembers the change's size."""
        if target_type == "view":
            self._load_history()
        rows = 0
        per_row: list[float] = []
        for table, window in windows.items():
            if not window.changed:
                continue
            changed = pinned[table].changed_rows(after=window.recorded)
            if changed is None:
                self._change = None
                return strategy.choose(self.strategy, self._history, None)
            rows += changed[0]
            per_row.extend([changed[1]] if changed[1] else [])
        self._change = strategy.ChangeSize(
            rows=rows,
            source_bytes=sum(s.size_bytes for s in pinned.values()),
            bytes_per_row=max(per_row) if per_row else None,
        )
        return strategy.choose(self.strategy, self._history, self._change)

    def _load_history(self) -> None:
        properties = self._properties(self.target)
        self._history = strategy.parse_history(properties.get(strategy.HISTORY_PROPERTY))

    def _properties(self, relation: TableName) -> dict[str, str]:
        _, rows = self.runner.query(f"SHOW TBLPROPERTIES {relation.sql()}")
        return {str(row[0]): str(row[1]) for row in rows}

    def _history_after(
        self, result: RefreshResult, pinned: dict[TableName, delta.SourceSnapshot]
    ) -> str | None:
        """The history property the published view carries after this refresh."""
        if result.action == "incremental":
            way = strategy.INCREMENTAL
        elif result.action in ("build", "rebuild", "recompute"):
            way = strategy.RECOMPUTE
        else:  # nothing ran that says what a refresh costs
            return strategy.history_with(self._history, None) if self._history else None
        record = strategy.RefreshRecord(
            way=way,
            changed_rows=self._change.rows if self._change else 0,
            source_bytes=sum(s.size_bytes for s in pinned.values()),
            seconds=round(time.monotonic() - self._started, 3),
        )
        return strategy.history_with(self._history, record)

    def _state_version(self) -> int:
        columns, rows = self.runner.query(delta.describe_history(self.state, limit=1))
        return int(rows[0][columns.index("version")])

    def _publish(
        self,
        plan: ViewPlan,
        result: RefreshResult,
        pinned: dict[TableName, delta.SourceSnapshot],
        state_version: int,
        shown_version: int | None,
    ) -> None:
        """Show the state at `state_version` through the view, now or with the model's group."""
        if shown_version == state_version and self.docs is not None and not self._history:
            # The view is created again for its docs: keep the history it carries.
            self._load_history()
        history = self._history_after(result, pinned)
        published = emit.Published(
            state_version=state_version,
            source_versions={s.table: s.version for s in self._recorded_pins(pinned)},
            properties={strategy.HISTORY_PROPERTY: history} if history else {},
        )
        view_sql = emit.create_view(plan, self.state, self.target, self.docs, published)
        shown = shown_version == state_version
        if shown and self.docs is not None:
            # Same state, maybe new descriptions: not a publication, so not held back.
            self.runner.execute(view_sql)
        elif shown_version is None:
            # No view showing a version yet (a first build, or a view from before
            # views were pinned): no reader has seen an earlier state to stay
            # consistent with, and a later member may read this one through its
            # view, so it is shown at once, even in a group.
            self.runner.execute(view_sql)
            shown = True
        staged = Staged(
            model_id=self.model,
            relation=self.target,
            state=self.state,
            state_version=state_version,
            view_sql=view_sql,
            action=result.action,
            seconds=time.monotonic() - self._started,
            source_versions={str(t): s.version for t, s in pinned.items()},
            published=shown,
            publish_sql=tuple(
                emit.publish_view(plan, self.state, self.target, published, self.docs)
            ),
        )
        if self.publisher is None:
            for statement in () if shown else staged.publish_sql:
                self.runner.execute(statement)
            return
        self.publisher.publish(staged)

    def _rebuild_reason(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        state_exists: bool,
        recorded: delta.RecordedState | None,
    ) -> str | None:
        if not state_exists:
            return FIRST_BUILD
        if self.full_refresh:
            return "--full-refresh"
        if recorded is None:
            return (
                f"the state table {self.state} has no refresh commit in its history "
                "(created or rewritten outside dbt, or its history expired)"
            )
        if recorded.later_writes:
            return (
                f"the state table {self.state} was written outside dbt after its last refresh "
                f"({', '.join(recorded.later_writes)})"
            )
        window = self._schema_commits_in_window(plan, pinned, recorded)
        changed = self._read_columns_changed(plan, pinned, recorded, window)
        if changed:
            return "a column it reads changed since the last refresh: " + "; ".join(
                c.describe() for c in changed
            )
        blocking = [
            (table, commit)
            for table, commits in window.items()
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
            return f"the state table {self.state} has no guard row to check its MERGE against"
        for table, snapshot in pinned.items():
            previous = recorded.sources.get(str(table))
            if previous is None:
                return f"the model now reads {table}, which its state does not reflect"
            wholesale = self._wholesale(table)
            replaced = previous.get("table_id") != snapshot.table_id or int(
                previous["version"]
            ) != int(snapshot.version)
            if wholesale and replaced:
                return (
                    f"{table} is a dbt '{wholesale}' model, replaced as a whole by every run, "
                    "so it is read again in full (materialize it as 'ivm' to propagate only "
                    "its changes)"
                )
            if previous.get("table_id") != snapshot.table_id:
                if table in plan.upstreams:
                    # CREATE OR REPLACE gives a Delta table a new id.
                    return f"the upstream ivm model {table} was rebuilt since the last refresh"
                return f"{table} was dropped and recreated since the last refresh"
            if int(previous["version"]) > snapshot.version:
                return f"{table} is at version {snapshot.version}, older than the recorded one"
        return None

    def _with_model_columns(self, plan: ViewPlan, reason: str) -> str:
        """The rebuild's reason, with the model's column changes if any (on_schema_change)."""
        before = self.catalog_columns(self.target)
        after = [(output.name, output.data_type) for output in plan.outputs]
        if not before or not schema_changes.columns_differ(before, after):
            return reason
        if self.on_schema_change == "fail":
            raise schema_changes.ModelColumnsChanged(self.model, before, after)
        return (
            f"{reason}; the model's columns change "
            f"({schema_changes.describe_column_diff(before, after)})"
        )

    def _schema_commits_in_window(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        recorded: delta.RecordedState,
    ) -> dict[TableName, tuple[schema_changes.SchemaCommit, ...]]:
        """Each source's column-changing commits after the version the state recorded.

        Read once per refresh for both checks below (a long window reads the
        table's whole history). Commits past the pin are kept: the columns the
        plan compiled against are the catalog's, which may already show them.
        Left out: sources that were re-created (another check names that) and
        upstream ivm models, whose state never changes its columns in place (a
        rebuild gives it a new table id).
        """
        window = {}
        for table, snapshot in pinned.items():
            entry = recorded.sources.get(str(table)) or {}
            if table in plan.upstreams or entry.get("table_id") != snapshot.table_id:
                continue
            after = int(entry.get("version", snapshot.version))
            if snapshot.version > after:
                window[table] = self._schema_commits_after(table, after, snapshot)
        return window

    def _read_columns_changed(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        recorded: delta.RecordedState,
        window: dict[TableName, tuple[schema_changes.SchemaCommit, ...]],
    ) -> list[schema_changes.ColumnChange]:
        """Columns the state was computed from that are retyped, or another column now.

        (A column renamed or dropped while still named by the SQL cannot
        compile; under `SELECT *` it changes the model's own columns, which
        the fingerprint and on_schema_change handle.)
        """
        changes = []
        for table, snapshot in pinned.items():
            entry = recorded.sources.get(str(table)) or {}
            read = entry.get("columns")
            if not read or entry.get("table_id") != snapshot.table_id:
                continue
            now = plan.source_columns.get(table, {})
            changes.extend(
                c
                for c in schema_changes.read_column_changes(
                    str(table), read, list(now.items()), window.get(table, ())
                )
                if c.kind in ("retyped", "replaced")
                and c.column.lower() in {n.lower() for n in now}
            )
        return changes

    def _upstream_models(self, tables: list[TableName]) -> dict[TableName, UpstreamModel]:
        """The sources that are ivm models: views that name their state table."""
        found = {}
        for table in tables:
            if self.relation_exists(table) != "view":
                continue
            state = self._properties(table).get(emit.STATE_PROPERTY)
            if not state:
                continue  # a plain view: pin() explains why it cannot be read
            text = view_text(self.runner, table)
            assert text is not None, f"{table} is a view without a view text"
            view = parse_one(text, read=DIALECT)
            assert isinstance(view, exp.Select), f"{table}'s view text is not a SELECT"
            state_table = table_name_of(state)
            found[table] = UpstreamModel(
                state=state_table,
                view=view,
                published_version=version_read(view, state_table),
            )
        return found

    def published_version(self, target_type: str | None) -> int | None:
        """The state version the model's view shows (None: no view, or one not pinned)."""
        text = view_text(self.runner, self.target) if target_type == "view" else None
        if text is None:
            return None
        return version_read(parse_one(text, read=DIALECT), self.state)

    def _wholesale(self, table: TableName) -> str | None:
        """'table' or 'seed' when the source is a dbt model that every run replaces entirely."""
        materialized = self.upstream_materializations.get(str(table).lower())
        return materialized if materialized in WHOLESALE_MATERIALIZATIONS else None

    def pin(self, table: TableName, upstream: UpstreamModel | None = None) -> delta.SourceSnapshot:
        """The version of `table` this refresh reads: one per consistency group and run.

        An upstream ivm model of the same group is read at the state its own
        refresh just wrote (it publishes in the same commit); any other
        upstream ivm model at the state its view shows.
        """
        key = str(table).lower()
        if key not in self._pins:
            # A node's pins are its model's, and are also what the node records.
            pinned = (
                self.pins_from.pin(table, upstream)
                if self.pins_from is not None
                else self._pin_for_run(table, upstream)
            )
            self._pins[key] = replace(pinned, table=table)
        return self._pins[key]

    def _pin_for_run(
        self, table: TableName, upstream: UpstreamModel | None
    ) -> delta.SourceSnapshot:
        progress = self.publisher.progress if self.publisher else None
        key = str(table).lower()
        same_group = progress is not None and key in {
            str(m.relation).lower() for m in progress.group.members
        }
        if progress is None or same_group:
            return self._pin_now(table, upstream, use_published=not same_group)
        assert self.publisher is not None and self.publisher.group_run is not None
        with self.publisher.group_run.lock:
            if not progress.pins:
                self._pin_group_inputs(progress.group.base_inputs)
            if key not in progress.pins:
                progress.pins[key] = self._pin_now(table, upstream, use_published=True)
            return progress.pins[key]

    def _recorded_pins(
        self, pinned: dict[TableName, delta.SourceSnapshot]
    ) -> list[delta.SourceSnapshot]:
        """What the state records: its own inputs, then the sources only its plan nodes read.

        With those, the recorded versions name every table of the query as
        written, which is what the model must equal (and what tests recompute).
        """
        # The model's nodes, and theirs, are all named `<model>__ivm_cte_...`.
        node_prefix = f"{self.target}{nodes.NODE_INFIX}".lower()
        read = {str(t).lower() for t in pinned}
        through_nodes = [
            snapshot
            for key, snapshot in self._pins.items()
            if key not in read and not key.startswith(node_prefix)
        ]
        return [*pinned.values(), *through_nodes]

    def _pin_group_inputs(self, inputs: dict[str, str]) -> None:
        """Pin every plain input of the group at once, when its first member starts.

        Inputs that cannot be pinned here (a view, a non-Delta table) are left
        to the member that reads them, whose refresh then explains the problem.
        """
        assert self.publisher is not None and self.publisher.progress is not None
        for key, materialized in inputs.items():
            schema, _, name = key.rpartition(".")
            table = TableName(db=schema or None, name=name)
            try:
                self.publisher.progress.pins[key] = self._pin_delta(
                    table, needs_change_feed=materialized not in WHOLESALE_MATERIALIZATIONS
                )
            except InvalidSource:
                continue

    def _pin_now(
        self, table: TableName, upstream: UpstreamModel | None, use_published: bool
    ) -> delta.SourceSnapshot:
        described = upstream.state if upstream else table
        snapshot = self._pin_delta(described, needs_change_feed=self._wholesale(table) is None)
        version = snapshot.version
        if upstream is not None and use_published and upstream.published_version is not None:
            # What the upstream's readers see; a newer state of it is not committed yet.
            version = upstream.published_version
        return replace(snapshot, table=table, version=version)

    def _pin_delta(self, table: TableName, needs_change_feed: bool) -> delta.SourceSnapshot:
        try:
            columns, rows = self.runner.query(delta.describe_detail(table))
        except Exception as error:
            raise InvalidSource(
                self.model,
                str(table),
                f"cannot be described as a Delta table ({first_line(error, limit=300)})",
                "read a Delta table (a view or a non-Delta table has no change data feed)",
            ) from error
        detail = dict(zip(columns, rows[0]))
        if str(detail.get("format", "")).lower() != "delta":
            raise InvalidSource(
                self.model,
                str(table),
                f"is a {detail.get('format')} table, not a Delta table",
                "set file_format='delta' on that dbt model"
                if str(table).lower() in self.upstream_materializations
                else "convert it with CONVERT TO DELTA, or read a Delta copy of it",
            )
        properties = detail.get("properties") or {}
        if isinstance(properties, str):  # agate hands maps over as JSON text
            properties = json.loads(properties)
        feed = str(properties.get("delta.enableChangeDataFeed", "false")).lower() == "true"
        if needs_change_feed and not feed:
            raise InvalidSource(
                self.model,
                str(table),
                "does not have the Delta change data feed enabled",
                f"run ALTER TABLE {table.sql()} SET TBLPROPERTIES "
                "(delta.enableChangeDataFeed = true), then build again",
            )
        # The newest commits, not just the newest version: their row counts size
        # the change for ivm_strategy: auto without reading any data.
        history_columns, history = self.runner.query(
            delta.describe_history(table, limit=RECENT_COMMITS)
        )
        version = int(history[0][history_columns.index("version")])
        return delta.SourceSnapshot(
            table=table,
            table_id=str(detail.get("id")),
            version=version,
            size_bytes=int(detail.get("sizeInBytes") or 0),
            recent_commits=delta.commit_rows(history_columns, history),
            schema_commits=schema_changes.schema_commits(history_columns, history),
            history_from=min(int(row[history_columns.index("version")]) for row in history),
        )

    def recorded(self) -> delta.RecordedState | None:
        # The newest refresh commit is nearly always the newest commit; only
        # maintenance commits (OPTIMIZE, VACUUM) by hand push it further back.
        for limit in (20, None):
            columns, rows = self.runner.query(delta.describe_history(self.state, limit=limit))
            self._state_history = (columns, rows)
            recorded = delta.parse_recorded(self.state, columns, rows)
            if recorded is not None or limit is None or len(rows) < limit:
                return recorded
        return None

    def _build(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        action: str,
        reason: str,
        shown_version: int | None,
    ) -> RefreshResult:
        # A view still shows the state's old version (time travel reads it with
        # its old columns) until the new one is published: no drop needed even
        # when the model's columns change.
        refresh_id = uuid.uuid4().hex
        self._commit(
            emit.create_state(
                plan, self.state, {t: s.version for t, s in pinned.items()}, refresh_id
            ),
            self._metadata(refresh_id, plan, pinned),
        )
        self.join_states(pinned).build(plan, pinned)
        result = RefreshResult(
            action=action,
            reason=reason,
            source_versions={str(t): s.version for t, s in pinned.items()},
        )
        self._publish(plan, result, pinned, self._state_version(), shown_version)
        if action != "recompute":
            # A rebuild follows a change of the SQL, which may have dropped a CTE.
            self._drop_nodes(keep=self._split.nodes if self._split else ())
        return result

    def _drop_nodes(self, keep: Sequence[nodes.PlanNode]) -> None:
        """Drop the model's plan nodes but those in `keep` (and the nodes of those)."""
        if self.target.db is None or not re.fullmatch(r"\w+", self.target.name):
            return  # SHOW VIEWS ... LIKE takes a pattern, where other characters have meanings
        prefix = f"{self.target.name}{nodes.NODE_INFIX}".lower()
        current = [str(n.relation.name).lower() for n in keep]
        columns, rows = self.runner.query(delta.show_views_like(self.target.db, f"{prefix}*"))
        for row in rows:
            name = str(row[columns.index("viewName")]).lower()
            # A current node's own nodes are named after it, and are current too.
            if any(name == c or name.startswith(f"{c}{nodes.NODE_INFIX}") for c in current):
                continue
            stale = TableName(db=self.target.db, name=name)
            self.log.info(f"{self.model}: dropping {stale}, a plan node the model no longer has")
            self.drop_relation(stale, "view")
            self.drop_relation(state_of(stale), "table")

    def _apply_changes(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        windows: dict[TableName, VersionRange],
        result: RefreshResult,
        recorded: delta.RecordedState,
    ) -> None:
        refresh_id = uuid.uuid4().hex
        metadata = self._metadata(refresh_id, plan, pinned)
        guard = self._guard(recorded, refresh_id)
        bounds = self.join_key_bounds(plan, windows)
        kept_states = self.join_states(pinned)
        try:
            join_reads, kept = kept_states.prepare(plan, windows, pinned, bounds)
        except Exception as error:
            if delta.is_concurrent_refresh(error):
                raise ConcurrentRefresh(self.model, self.state, error) from error
            raise
        self._record_merge(
            emit.merge_changes(plan, self.state, windows, guard, bounds, join_reads),
            metadata,
            result,
        )
        kept_states.drop_unkept(plan, kept)

    def join_states(self, pinned: dict[TableName, delta.SourceSnapshot]) -> join_states.JoinStates:
        """The model's join states (ivm_join_state), sized by the pinned sources."""

        def facts(table: TableName) -> join_states.SourceFacts | None:
            snapshot = pinned.get(table)
            if snapshot is None:
                return None
            return join_states.SourceFacts(
                size_bytes=snapshot.size_bytes, column_count=len(self.catalog_columns(table))
            )

        return join_states.JoinStates(
            runner=self.runner,
            log=self.log,
            model=self.model,
            target=self.target,
            setting=self.join_state,
            relation_exists=self.relation_exists,
            drop_relation=self.drop_relation,
            relation_created=self.relation_created,
            source_facts=facts,
            commit=self._commit,
            recent_refreshes=self._recent_refreshes,
        )

    def _recent_refreshes(self) -> list[dict[TableName, int]]:
        """The source versions of the state's recent refresh commits, oldest first."""
        # recorded() read them at the start of this refresh.
        columns, rows = self._state_history or self.runner.query(
            delta.describe_history(self.state, limit=20)
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

    def join_key_bounds(
        self, plan: ViewPlan, windows: dict[TableName, VersionRange]
    ) -> key_bounds.Bounds:
        """The change's join-key ranges, which narrow the MERGE's partner reads (key_bounds.py)."""
        probe = emit.probe_join_keys(plan, windows)
        if probe is None:
            return {}
        sql, keys = probe
        _, rows = self.runner.query(sql)
        bounds = key_bounds.parse_probe(keys, rows[0])
        self.log.debug(
            f"{self.model}: join partners read within "
            + ", ".join(f"{t}.{c} in [{lo}, {hi}]" for (t, c), (lo, hi) in bounds.items())
        )
        return bounds

    def _touched_partitions(
        self, plan: ViewPlan, windows: dict[TableName, VersionRange]
    ) -> list[windows_rules.PartitionKey]:
        """The partition keys a WINDOW model's change touches (at most one over the limit)."""
        _, rows = self.runner.query(emit.probe_partitions(plan, windows))
        return windows_rules.parse_probe(rows)

    def _apply_partitions(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        touched: list[windows_rules.PartitionKey],
        result: RefreshResult,
        recorded: delta.RecordedState,
    ) -> None:
        """Recompute a WINDOW model's touched partitions with one MERGE (rules/windows.py)."""
        refresh_id = uuid.uuid4().hex
        result.action = "incremental"
        # With no touched partition the commit changes no data and leaves the
        # guard row as it was, so it records the guard it read; a concurrent
        # refresh doing the same records the same nothing.
        metadata = self._metadata(
            refresh_id, plan, pinned, guard=None if touched else recorded.guard
        )
        if not touched:
            # Every change row failed the model's WHERE: nothing to recompute,
            # but the window is consumed, so record the versions.
            self._commit(emit.record_refresh(self.state, refresh_id), metadata)
            result.reason = "the changes touch no window partition"
            return
        statement = emit.merge_partitions(
            plan,
            self.state,
            {t: s.version for t, s in pinned.items()},
            touched,
            self._guard(recorded, refresh_id),
        )
        self.log.debug(f"{self.model}: recomputing {len(touched)} window partitions")
        self._record_merge(statement, metadata, result)

    def _metadata(
        self,
        refresh_id: str,
        plan: ViewPlan,
        pinned: dict[TableName, delta.SourceSnapshot],
        guard: str | None = None,
    ) -> dict[str, Any]:
        """The commit metadata of a refresh: versions, fingerprint, columns read, guard."""
        return delta.commit_metadata(
            refresh_id,
            self.state,
            plan.fingerprint,
            self._recorded_pins(pinned),
            guard=guard,
            columns_read=plan.source_columns,
        )

    def _guard(self, recorded: delta.RecordedState, refresh_id: str) -> emit.Guard:
        assert recorded.guard is not None  # _rebuild_reason rebuilds a state without one
        return emit.Guard(read=recorded.guard, write=refresh_id)

    def _record_merge(
        self, statement: str, metadata: dict[str, Any], result: RefreshResult
    ) -> None:
        """Run a guarded MERGE (emit.Guard); it always commits, as it moves the guard row.

        When another refresh of the model committed after this one read the
        state, the MERGE fails having written nothing: the model's error says
        so (the other refresh applied the change, or a newer one).
        """
        try:
            columns, rows = self._commit(statement, metadata)
        except Exception as error:
            if delta.is_concurrent_refresh(error):
                raise ConcurrentRefresh(self.model, self.state, error) from error
            raise
        # Delta's MERGE answers with one row of counts (num_affected_rows, ...);
        # the guard row's move is one of the updated rows, not a model row.
        merged = dict(zip(columns, rows[0])) if rows else {}
        result.action = "incremental"
        result.rows_inserted = int(merged.get("num_inserted_rows") or 0)
        result.rows_updated = max(int(merged.get("num_updated_rows") or 0) - 1, 0)
        result.rows_deleted = int(merged.get("num_deleted_rows") or 0)
        if result.rows_affected == 0:
            # The changes cancelled out: the commit only moved the guard row and
            # recorded the new versions, so the next refresh does not read this
            # window again.
            result.reason = "source changes cancelled out"

    def _commit(
        self, statement: str, metadata: dict[str, Any]
    ) -> tuple[list[str], Sequence[Sequence[Any]]]:
        """Run one committing statement with the refresh's metadata attached to its commit."""
        with delta.COMMIT_LOCK:
            self.runner.execute(delta.set_commit_metadata(metadata))
            try:
                return self.runner.query(statement)
            finally:
                self.runner.execute(delta.reset_commit_metadata())

    # -- the fallback path --------------------------------------------------

    def _recompute(self, refusal: str) -> RefreshResult:
        """Clear the ivm relations; the materialization then builds the model as a table."""
        self.log.warning(
            f"{self.model}: recomputing fully because ivm_fallback='full_refresh': {refusal}"
        )
        if self.relation_exists(self.target) == "view":
            self.drop_relation(self.target, "view")
        if self.relation_exists(self.state):
            self.drop_relation(self.state, "table")
        self._drop_nodes(keep=())
        self.join_states({}).drop_others(keep=())
        return RefreshResult(action="fallback", reason=refusal)


FIRST_BUILD = "first build"
NO_SOURCE_COMMITS = "no source commits since the last refresh"


class ConcurrentRefresh(Exception):
    """Another refresh of the same model committed to its state after this one read it."""

    def __init__(self, model: str, state: TableName, error: BaseException) -> None:
        self.model = model
        super().__init__(
            f"Model '{model}': another refresh of this model committed to {state} after this "
            "run read it, so this run applied nothing (its change is already applied, or "
            f"will be by the next run) ({first_line(error, limit=300)}). Fix: re-run to pick "
            "up later changes; do not refresh one model from two dbt invocations at once."
        )


# Commits of a source read when it is pinned: a window longer than this
# (refreshes far apart) has an unknown size, and `auto` then applies it.
RECENT_COMMITS = 20

# dbt materializations that rewrite their whole relation on every run: a
# dependent ivm model rebuilds after each of their runs, as recomputation is
# what reading their change feed (if any) would cost anyway.
WHOLESALE_MATERIALIZATIONS = ("table", "seed")


def state_of(relation: TableName) -> TableName:
    """The Delta table behind an ivm model's (or plan node's) view."""
    return TableName(db=relation.db, name=f"{relation.name}{names.STATE_SUFFIX}")


def view_text(runner: Runner, view: TableName) -> str | None:
    """The SELECT a view was defined with, as Spark stores it."""
    _, rows = runner.query(f"DESCRIBE TABLE EXTENDED {view.sql()}")
    return next((str(row[1]) for row in rows if str(row[0]) == "View Text"), None)


def version_read(view: exp.Expression, state: TableName) -> int | None:
    """The VERSION AS OF at which a view reads `state`, if it pins one."""
    for node in view.find_all(exp.Table):
        if TableName.of(node) == state and node.args.get("version") is not None:
            return int(node.args["version"].expression.name)
    return None


def table_name_of(text: str) -> TableName:
    """'schema.name' (as the view property stores it) -> TableName."""
    parts = text.split(".")
    return TableName(db=parts[-2] if len(parts) > 1 else None, name=parts[-1])


class _SparkCatalog:
    """The compiler's Catalog, answered by Spark through the refresh's runner."""

    def __init__(self, refresh: Refresh) -> None:
        self._refresh = refresh

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        return self._refresh.catalog_columns(table)

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        columns, rows = self._refresh.runner.query(f"DESCRIBE QUERY {sql}")
        name_at, type_at = columns.index("col_name"), columns.index("data_type")
        return [(str(row[name_at]), str(row[type_at])) for row in rows]
