"""Pinning sources: the Delta version of each source a refresh reads, read once.

A refresh reads every source at the version pinned here (DESIGN.md: reading
at exact versions is what rules out the ECA paper's anomalies). A pin is one
SHOW TBLPROPERTIES (a Delta table? its change feed?) and one DESCRIBE HISTORY
of its newest commits (the version; the commit times that tell the recorded
table from a re-created one; the row and byte counts that size a change for
ivm_strategy: auto). The members of a consistency group share one pin per
input; a plan node shares its model's pins. `Pins.complete` then adds what
one refresh needs beyond that, reading DESCRIBE DETAIL only where the history
cannot say.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dbt.adapters.spark_ivm.consistency.groups import GroupProgress, Staged
from dbt.adapters.spark_ivm.consistency.publish import Log, Publisher, Runner
from dbt.adapters.spark_ivm.delta import tables
from dbt.adapters.spark_ivm.delta.history import commit_rows, describe_history
from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit, schema_commits
from dbt.adapters.spark_ivm.refresh import upstreams
from dbt.adapters.spark_ivm.refresh.decision import FALLBACK_TABLE, WHOLESALE_MATERIALIZATIONS
from ivm_compiler import InvalidSource, TableName, nodes
from ivm_compiler.errors import first_line
from ivm_compiler.plan import UpstreamModel

# Commits of a source read when it is pinned: a window longer than this
# (refreshes far apart) has an unknown size, and `auto` then applies it.
RECENT_COMMITS = 20


@dataclass
class InvocationPins:
    """The sources pinned in one dbt invocation, shared by every model it refreshes.

    Only sources (relations that are no dbt model): dbt models may be
    rewritten during the invocation, before the models reading them run.
    Reading a source at the version an earlier model of the invocation pinned
    is as exact as pinning it again; it saves a DESCRIBE DETAIL and a
    DESCRIBE HISTORY per source per model (0.25 s measured on this runtime),
    and every model of one `dbt build` then reads a source at one version.
    """

    invocation_id: str
    _pins: dict[str, tables.SourceSnapshot] = field(default_factory=dict)
    # Each source's SHOW TBLPROPERTIES, which both the compile and the pin read.
    _properties: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str) -> tables.SourceSnapshot | None:
        with self._lock:
            return self._pins.get(key)

    def keep(self, key: str, snapshot: tables.SourceSnapshot) -> tables.SourceSnapshot:
        """Keep `snapshot` unless another model pinned the source meanwhile; the one kept."""
        with self._lock:
            return self._pins.setdefault(key, snapshot)

    def properties(self, key: str) -> dict[str, str] | None:
        with self._lock:
            return self._properties.get(key)

    def keep_properties(self, key: str, properties: dict[str, str]) -> None:
        with self._lock:
            self._properties.setdefault(key, properties)


@dataclass
class Pins:
    """The sources one refresh (with its plan nodes) pinned, by lower-case name."""

    runner: Runner
    log: Log
    model: str
    # The model's view: its plan nodes' pins are named after it.
    target: TableName
    # The materialization of every dbt model the model refs, by lower-case "schema.identifier".
    upstream_materializations: Mapping[str, str] = field(default_factory=dict)
    # Shares the group's pins (None: the model pins on its own).
    publisher: Publisher | None = None
    # A plan node pins through its model, so both read every source at one version.
    parent: Pins | None = None
    # The invocation's pins of sources, shared by its models (None: pin anew).
    invocation: InvocationPins | None = None
    # A relation's type ('table', 'view') if it exists.
    relation_type: Callable[[TableName], str | None] = lambda table: None
    _pins: dict[str, tables.SourceSnapshot] = field(default_factory=dict, init=False)
    _properties: dict[str, dict[str, str]] = field(default_factory=dict, init=False)

    def wholesale(self, table: TableName) -> str | None:
        """How a dbt model read otherwise than an ivm model's view is built; None for any other.

        'table' or 'seed' (replaced by every run: read as the difference of
        two versions), or FALLBACK_TABLE for an ivm model built as a table by
        ivm_fallback (its relation is a table, not a view; written in place,
        so read through its change feed unless it was built anew).
        """
        materialized = self.upstream_materializations.get(str(table).lower())
        if materialized in WHOLESALE_MATERIALIZATIONS:
            return materialized
        if materialized == "ivm" and self.relation_type(table) not in (None, "view"):
            return FALLBACK_TABLE
        return None

    def pin(self, table: TableName, upstream: UpstreamModel | None = None) -> tables.SourceSnapshot:
        """The version of `table` this refresh reads: one per consistency group and run.

        An upstream ivm model of the same group is read at the state its own
        refresh just wrote (it publishes in the same commit); any other
        upstream ivm model at the state its view shows.
        """
        key = str(table).lower()
        if key not in self._pins:
            pinned = (
                self.parent.pin(table, upstream)
                if self.parent is not None
                else self._pin_for_run(table, upstream)
            )
            self._pins[key] = replace(pinned, table=table)
        return self._pins[key]

    def recorded(
        self, pinned: Mapping[TableName, tables.SourceSnapshot]
    ) -> list[tables.SourceSnapshot]:
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

    def schema_commits_after(
        self, table: TableName, after: int, snapshot: tables.SourceSnapshot | None = None
    ) -> tuple[SchemaCommit, ...]:
        """The column-changing commits of `table` after version `after`.

        A pin's recent history usually covers the window; a longer one (or no
        pin yet) reads the table's whole history.
        """
        if snapshot is not None and snapshot.history_from <= after + 1:
            commits = snapshot.schema_commits
        else:
            columns, rows = self.runner.query(describe_history(table))
            commits = schema_commits(columns, rows)
        return tuple(c for c in commits if c.version > after)

    def same_group(self, table: TableName) -> bool:
        """Whether `table` is a member of the model's consistency group in this run."""
        progress = self.publisher.progress if self.publisher else None
        return progress is not None and str(table).lower() in {
            str(m.relation).lower() for m in progress.group.members
        }

    def _pin_for_run(
        self, table: TableName, upstream: UpstreamModel | None
    ) -> tables.SourceSnapshot:
        progress = self.publisher.progress if self.publisher else None
        key = str(table).lower()
        same_group = self.same_group(table)
        if progress is None:
            return self._pin_now(table, upstream, use_published=True)
        assert self.publisher is not None and self.publisher.group_run is not None
        if same_group:
            return self._pin_member(progress, table, upstream)
        with self.publisher.group_run.lock:
            if not progress.pins:
                self._pin_group_inputs(progress.pins, progress.group.base_inputs)
            if key not in progress.pins:
                progress.pins[key] = self._pin_now(table, upstream, use_published=True)
            return progress.pins[key]

    def _pin_member(
        self, progress: GroupProgress, table: TableName, upstream: UpstreamModel | None
    ) -> tables.SourceSnapshot:
        """A member of the model's own group, at the state its refresh in this run wrote.

        Pinned once for the group: a member is read only by the models after
        it in the DAG, so every reader pins it after its refresh, whose state
        no later model of the run rewrites. The warehouse's gold group read
        fct_orders' state eleven times in a day's batch, each a SHOW
        TBLPROPERTIES and a DESCRIBE HISTORY (a Spark job, 0.3-0.8 s).
        """
        assert self.publisher is not None and self.publisher.group_run is not None
        key = str(table).lower()
        lock = self.publisher.group_run.lock
        with lock:
            kept = progress.member_pins.get(key)
        if kept is not None:
            return replace(kept, table=table)
        pinned = self._pin_now(table, upstream, use_published=False)
        with lock:
            return progress.member_pins.setdefault(key, pinned)

    def _pin_group_inputs(
        self, pins: dict[str, tables.SourceSnapshot], inputs: Mapping[str, str]
    ) -> None:
        """Pin every plain input of the group at once, when its first member starts.

        Inputs that cannot be pinned here (a view, a non-Delta table) are left
        to the member that reads them, whose refresh then explains the problem.
        """
        for key, materialized in inputs.items():
            schema, _, name = key.rpartition(".")
            table = TableName(db=schema or None, name=name)
            try:
                if materialized == "source":
                    pins[key] = self._source(table)
                else:
                    pins[key] = self.describe(
                        table, needs_change_feed=materialized not in WHOLESALE_MATERIALIZATIONS
                    )
            except InvalidSource:
                continue

    def _source(self, table: TableName) -> tables.SourceSnapshot:
        """A source's snapshot: the invocation's, or a new one it keeps for its other models."""
        key = str(table).lower()
        kept = self.invocation.get(key) if self.invocation else None
        if kept is not None:
            return replace(kept, table=table)
        snapshot = self.describe(table, needs_change_feed=True)
        return self.invocation.keep(key, snapshot) if self.invocation else snapshot

    def _pin_now(
        self, table: TableName, upstream: UpstreamModel | None, use_published: bool
    ) -> tables.SourceSnapshot:
        if upstream is None and str(table).lower() not in self.upstream_materializations:
            return self._source(table)
        described = upstream.state if upstream else table
        wholesale = self.wholesale(table)
        snapshot = self.describe(
            described,
            # A `table` or `seed` model is read at two versions, not through a feed.
            needs_change_feed=wholesale not in WHOLESALE_MATERIALIZATIONS,
            # A state keeps a change feed only while ivm models read it
            # (emit.CHANGE_FEED_PROPERTY), and so does a fallback table
            # (refresh/fallback.py): the first to read it turns it on.
            turn_on_change_feed=upstream is not None or wholesale == FALLBACK_TABLE,
            share=False,
        )
        version = snapshot.version
        if wholesale == FALLBACK_TABLE:
            self._publish_after(table, self._staged_groups_behind(table))
        if upstream is not None and use_published and upstream.published_version is not None:
            # What the upstream's readers see; a newer state of it is not committed yet.
            version = upstream.published_version
            staged = self.staged_upstream(table)
            moved = self._published_in_run(table) if staged is None else None
            if moved is not None:
                # Its group committed between this refresh's reading of the
                # view's text and this pin: the view now shows that state.
                version = moved
            if staged is not None:
                # Refreshed earlier in this run by a group that has not
                # published yet: read at that state, and publish after that group.
                upstream_progress, refreshed = staged
                version = refreshed.state_version
                assert self.publisher is not None and self.publisher.progress is not None
                self.publisher.progress.after.add(upstream_progress.group.name)
                self.log.debug(
                    f"{self.model}: reads {table} at its state refreshed in this run "
                    f"(version {version}); consistency group "
                    f"{self.publisher.progress.group.name!r} publishes after "
                    f"{upstream_progress.group.name!r}"
                )
        return replace(snapshot, table=table, version=version)

    def _published_in_run(self, table: TableName) -> int | None:
        if self.publisher is None or self.publisher.group_run is None:
            return None
        return self.publisher.group_run.published_in_run(table)

    def _staged_groups_behind(self, table: TableName) -> set[str]:
        """Groups whose unpublished states a fallback table read in this run was written from."""
        if self.publisher is None or self.publisher.group_run is None:
            return set()
        return self.publisher.group_run.staged_groups_behind(table)

    def _publish_after(self, table: TableName, groups: set[str]) -> None:
        """This model's group publishes after `groups`, whose states `table` was written from."""
        if self.publisher is None or self.publisher.progress is None:
            return
        own = self.publisher.progress.group.name
        for group in sorted(groups - {own}):
            self.publisher.progress.after.add(group)
            self.log.debug(
                f"{self.model}: {table} was written in this run from consistency group "
                f"{group!r}'s unpublished states; {own!r} publishes after {group!r}"
            )

    def staged_upstream(self, table: TableName) -> tuple[GroupProgress, Staged] | None:
        """An upstream ivm model of another group, refreshed in this run but not yet published."""
        if self.publisher is None or self.publisher.group_run is None:
            return None
        if self.publisher.progress is None or self.same_group(table):
            return None
        return self.publisher.group_run.staged_upstream(table)

    def describe(
        self,
        table: TableName,
        needs_change_feed: bool,
        turn_on_change_feed: bool = False,
        share: bool = True,
    ) -> tables.SourceSnapshot:
        """A Delta table's snapshot now, refusing what cannot feed changes.

        `turn_on_change_feed`: an upstream ivm model's state without a change
        feed gets one (its changes from the next commit on can then be read).
        `share`: False for a model's state, whose properties are read anew (the
        first reader may turn its change feed on) and kept nowhere (properties).
        """
        properties = self._delta_properties(table, share)
        feed = properties.get(tables.CHANGE_FEED_PROPERTY, "false").lower() == "true"
        if needs_change_feed and not feed and turn_on_change_feed:
            self.log.info(
                f"{self.model}: turning on the change data feed of {table}, which it reads "
                "as an upstream ivm model"
            )
            self.runner.execute(tables.turn_on_change_feed(table))
            feed = True
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
        history = self._history(table, limit=RECENT_COMMITS)
        newest = max(commit.version for commit in history.recent_commits)
        vectors = tables.may_have_deletion_vectors(properties)
        return replace(history, version=newest, deletion_vectors=vectors)

    def complete(
        self, snapshot: tables.SourceSnapshot, entry: Mapping[str, Any] | None, needs_size: bool
    ) -> tables.SourceSnapshot:
        """The pin with what this refresh needs to decide and record that pinning left out.

        `entry`: what the state recorded of the source (None: a first build).
        The history pinning read usually says everything: whether the table
        is the one recorded (delta.tables.SourceSnapshot.same_table), its size (the
        recorded size plus what the commits since added) and the time of the
        pinned commit, which the state records. A first build sizes the table
        from every commit since its creation where the history read holds
        them all. Where it does not (a window older than the commits read, a
        state recorded before commit times were, an operation whose metrics
        give no bytes, a first build over a longer history), the whole
        history or DESCRIBE DETAIL is read.
        """
        oldest = min(snapshot.version, int(entry["version"]) if entry else snapshot.version)
        if oldest < snapshot.history_from:
            whole = self._history(snapshot.delta_table or snapshot.table, limit=None)
            snapshot = replace(
                snapshot,
                recent_commits=whole.recent_commits,
                schema_commits=whole.schema_commits,
                history_from=whole.history_from,
            )
        size = snapshot.size_after(entry) if entry else snapshot.size_from_creation()
        if size is not None:
            snapshot = replace(snapshot, size_bytes=size)
        unknown = entry is not None and snapshot.same_table(entry) is None
        if unknown or (needs_size and snapshot.size_bytes is None):
            detail = self._detail(snapshot.delta_table or snapshot.table)
            snapshot = replace(
                snapshot,
                table_id=str(detail.get("id")),
                size_bytes=int(detail.get("sizeInBytes") or 0),
            )
        return snapshot

    def _history(self, table: TableName, limit: int | None) -> tables.SourceSnapshot:
        """A snapshot of `table` holding its newest `limit` commits (None: all), unversioned."""
        columns, history = self.runner.query(describe_history(table, limit))
        commits = commit_rows(columns, history)
        return tables.SourceSnapshot(
            table=table,
            table_id=None,
            version=-1,  # the caller's to pin
            recent_commits=commits,
            schema_commits=schema_commits(columns, history),
            history_from=min(commit.version for commit in commits),
            delta_table=table,
        )

    def properties(self, table: TableName, share: bool = True) -> dict[str, str]:
        """SHOW TBLPROPERTIES of `table`, read once per refresh; a source's once per invocation.

        The compile reads them to tell a source that is an ivm model's view
        (recipe.py), the pin to refuse what is no Delta table: one statement
        serves both, where asking dbt whether a source is a view lists its
        whole schema (SHOW TABLE EXTENDED, 0.1-0.2 s for the eight TPC-H tables).
        `share`: False reads them anew and keeps them nowhere (a model's state).
        """
        if self.parent is not None:
            return self.parent.properties(table, share)
        key = str(table).lower()
        known = self._properties.get(key) if share else None
        # Only a source's are kept for the invocation's other models: a dbt
        # model (and its state) may be rebuilt before they run.
        source = share and key not in self.upstream_materializations
        shared = self.invocation if source else None
        if known is None and shared is not None:
            known = shared.properties(key)
        if known is None:
            known = upstreams.properties(self.runner, table)
            if shared is not None:
                shared.keep_properties(key, known)
        if share:
            self._properties[key] = known
        return known

    def _delta_properties(self, table: TableName, share: bool) -> dict[str, str]:
        """A Delta table's properties, refusing a relation that is no Delta table."""
        try:
            properties = self.properties(table, share)
        except Exception as error:
            raise self._not_described(table, error) from error
        if tables.DELTA_PROTOCOL_PROPERTY in properties:
            return properties
        # A view, or a table of another format: DESCRIBE DETAIL names which.
        detail = self._detail(table)
        raise InvalidSource(
            self.model,
            str(table),
            f"is a {detail.get('format')} table, not a Delta table",
            "set file_format='delta' on that dbt model"
            if str(table).lower() in self.upstream_materializations
            else "convert it with CONVERT TO DELTA, or read a Delta copy of it",
        )

    def _detail(self, table: TableName) -> dict[str, Any]:
        """DESCRIBE DETAIL of `table` as a mapping (its id, format, size)."""
        try:
            columns, rows = self.runner.query(tables.describe_detail(table))
        except Exception as error:
            raise self._not_described(table, error) from error
        return dict(zip(columns, rows[0]))

    def _not_described(self, table: TableName, error: BaseException) -> InvalidSource:
        return InvalidSource(
            self.model,
            str(table),
            f"cannot be described as a Delta table ({first_line(error, limit=300)})",
            "read a Delta table (a view or a non-Delta table has no change data feed)",
        )
