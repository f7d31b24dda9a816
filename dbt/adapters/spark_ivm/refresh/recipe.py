"""One refresh of one ivm model: compile, pin, decide, write, publish.

The recipe (DESIGN.md, "Flow of one refresh"), each step in a module of its own:
0. a model whose view already shows its query at the sources' pins ends
   here, NO_CHANGE, uncompiled (unchanged.py);
1. compile the model (refusals happen here, before any SQL changes data),
   its plan nodes refreshed first as models of their own (ivm_compiler.nodes);
2. pin every source at its latest Delta version (pins.py);
3. read what the state last recorded, in the commit of its own data
   (state_history.py);
4. decide: build, rebuild (and why), recompute, apply the change, or
   nothing (decision.py, pure);
5. write with one statement that commits data and recorded versions
   together (writes.py);
6. publish: point the model's view at the new state version, at once or,
   for a consistency group, when every member has written (consistency/publish.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from sqlglot import exp

from dbt.adapters.spark_ivm.consistency.groups import Staged
from dbt.adapters.spark_ivm.consistency.publish import Log, Publisher, Runner
from dbt.adapters.spark_ivm.consistency.strict import view_select
from dbt.adapters.spark_ivm.delta.confs import skips_without_statistics, staging
from dbt.adapters.spark_ivm.delta.errors import error_summary, is_change_history_unavailable
from dbt.adapters.spark_ivm.delta.records import RecordedState, commit_metadata
from dbt.adapters.spark_ivm.delta.tables import (
    DELTA_PROTOCOL_PROPERTY,
    SourceSnapshot,
    may_have_deletion_vectors,
    show_views_like,
    total_size,
    versions_of,
)
from dbt.adapters.spark_ivm.engine import Engine
from dbt.adapters.spark_ivm.refresh import (
    decision,
    fallback,
    handoff,
    join_states,
    schema_changes,
    strategy,
    unchanged,
)
from dbt.adapters.spark_ivm.refresh.decision import NO_SOURCE_COMMITS, Decision
from dbt.adapters.spark_ivm.refresh.pins import InvocationPins, Pins
from dbt.adapters.spark_ivm.refresh.state_history import (
    RECORD_PROPERTY,
    StateHistory,
    table_name_of,
)
from dbt.adapters.spark_ivm.refresh.upstreams import properties, published_version, upstream_models
from dbt.adapters.spark_ivm.refresh.writes import (
    CancellingRemoval,
    ConcurrentRefresh,
    StateWrites,
    TopKShort,
    Written,
)
from dbt.adapters.spark_ivm.settings import (
    Action,
    Fallback,
    JoinStateSetting,
    RefreshSettings,
    StateForm,
    Strategy,
)
from ivm_compiler import (
    NotMaintainable,
    TableName,
    ViewPlan,
    compile_model,
    emit,
    log_state,
    names,
    nodes,
)
from ivm_compiler.compile import source_tables
from ivm_compiler.errors import StateFormRefused, first_line
from ivm_compiler.parse import parse_model, parse_statement
from ivm_compiler.plan import ViewClass

__all__ = ["ConcurrentRefresh", "Refresh", "RefreshResult", "state_of", "table_name_of"]


@dataclass
class RefreshResult:
    """What a refresh did; the materialization stores it as the node's adapter response."""

    action: Action
    reason: str
    source_versions: dict[str, int] = field(default_factory=dict)
    previous_versions: dict[str, int] = field(default_factory=dict)
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    seconds: float = 0.0
    # Why the view does not show the new state after this refresh (a
    # consistency group that waits or failed), else None.
    publication: str | None = None
    # An incremental refresh that recomputed the groups whose removal would
    # have cancelled their sums or moments (writes.CancellingRemoval).
    recomputed_groups: bool = False
    # An incremental refresh whose bounded MIN/MAX values ran out in a group,
    # refilled from the sources (writes.ExhaustedExtremes).
    refilled_extremes: bool = False
    # A log state's write: "appended", or "rewritten" (writes.Written.log_write).
    log_write: str | None = None
    # How a state (or fallback table) computed whole handed its change on to
    # the ivm models reading it, and why (handoff.HandOff.describe).
    handoff: str | None = None
    # A fallback table the refresh wrote in place (refresh/fallback.py): the
    # materialization only reports it.
    table_written: bool = False
    # What a fallback table carries once the materialization built it
    # (FallbackTable.properties_after_build; adapter.ivm_set_table_properties).
    table_properties: dict[str, str] = field(default_factory=dict)
    # The SQL the materialization builds a fallback table with, where it is
    # not the model's: upstreams refreshed in this run read at their states
    # not yet published (FallbackTable.build_sql).
    table_sql: str | None = None

    @property
    def rows_affected(self) -> int:
        return self.rows_inserted + self.rows_updated + self.rows_deleted

    @property
    def is_table(self) -> bool:
        """The model is not maintained: its relation is a table recomputed on every run."""
        return self.action is Action.FALLBACK

    @property
    def builds_table(self) -> bool:
        """The materialization builds the fallback table (CREATE OR REPLACE), as dbt does."""
        return self.is_table and not self.table_written

    @property
    def replaced_relation(self) -> bool:
        """The relation was created anew (dbt's grants are then applied without revoking)."""
        return self.action in (Action.BUILD, Action.REBUILD) or self.builds_table

    @property
    def code(self) -> str:
        """The adapter response's code: the action, upper-cased."""
        return self.action.value.upper()

    @property
    def message(self) -> str:
        return self._what + (f"; {self.publication}" if self.publication else "")

    @property
    def _what(self) -> str:
        versions = ", ".join(
            f"{name}@{self.previous_versions[name]}->{version}"
            if name in self.previous_versions
            else f"{name}@{version}"
            for name, version in self.source_versions.items()
        )
        if self.action is Action.INCREMENTAL and self.log_write is not None:
            return f"IVM incremental, change {self.log_write} to the state's log ({versions})"
        if self.action is Action.INCREMENTAL:
            counts = f"+{self.rows_inserted} ~{self.rows_updated} -{self.rows_deleted} state rows"
            if self.recomputed_groups:
                counts += f", {RECOMPUTED_GROUPS}"
            return f"IVM incremental {counts} ({versions})"
        if self.action is Action.NO_CHANGE:
            if self.reason != NO_SOURCE_COMMITS:
                return f"IVM no changes: {self.reason} ({versions})"
            return f"IVM no changes ({versions})"
        handed = f"; {self.handoff}" if self.handoff else ""
        read = f" ({versions})" if versions else ""
        return f"IVM {self.action.value}: {self.reason}{handed}{read}"


@dataclass
class Relations:
    """How the refresh sees and changes dbt's relations (the adapter answers, with its cache)."""

    # The relation's type ('table', 'view') if it exists.
    exists: Callable[[TableName], str | None] = lambda table: None
    drop: Callable[[TableName, str], None] = lambda table, kind: None
    columns: Callable[[TableName], list[tuple[str, str]]] = lambda table: []
    # Tells dbt's cache about a relation the refresh created besides the
    # model's own (a plan node's view and state, a join state).
    created: Callable[[TableName, str], None] = lambda table, kind: None


@dataclass
class Refresh:
    """One model's refresh: wires the steps of the module docstring together."""

    runner: Runner
    log: Log
    model: str
    sql: str
    target: TableName
    state: TableName
    settings: RefreshSettings = field(default_factory=RefreshSettings)
    relations: Relations = field(default_factory=Relations)
    # The materialization of every dbt model this one refs, by "schema.identifier".
    upstream_materializations: Mapping[str, str] = field(default_factory=dict)
    # Publishes the refreshed state (alone, or with the model's consistency group)
    # and shares the group's source pins; None: the view is created directly.
    publisher: Publisher | None = None
    # A plan node's refresh pins its sources through the model's refresh.
    parent: Refresh | None = None
    # The sources pinned by the invocation's earlier models (pins.InvocationPins).
    invocation_pins: InvocationPins | None = None
    # No other client shares the connection's Spark session (StateWrites.own_session).
    own_session: bool = False
    # The Spark and Delta the connection talks to, asked when a write needs it
    # (None: not known, as in unit tests; a change then runs as on one core).
    engine: Callable[[], Engine] | None = None
    _started: float = field(default_factory=time.monotonic, init=False, repr=False)
    _split: nodes.Split | None = field(default=None, init=False, repr=False)
    # The properties of the model's view, read once (None: not yet), and of
    # the upstream ivm models' views, as the compile read them.
    _view_properties: dict[str, str] | None = field(default=None, init=False, repr=False)
    # _state_deletion_vectors' answer, read once per refresh: only the
    # build, a refresh's last write, turns vectors on.
    _state_vectors: bool | None = field(default=None, init=False, repr=False)
    _upstream_properties: dict[TableName, dict[str, str]] = field(
        default_factory=dict, init=False, repr=False
    )
    # Made in __post_init__ from the fields above.
    pins: Pins = field(init=False, repr=False)
    history: StateHistory = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.pins = Pins(
            runner=self.runner,
            log=self.log,
            model=self.model,
            target=self.target,
            upstream_materializations=self.upstream_materializations,
            publisher=self.publisher,
            parent=self.parent.pins if self.parent else None,
            invocation=self.invocation_pins,
            relation_type=self.relations.exists,
        )
        self.history = StateHistory(self.runner, self.state)

    def run(self) -> RefreshResult:
        self._started = time.monotonic()
        result = self._unchanged() or self._refresh()
        result.seconds = time.monotonic() - self._started
        return result

    # -- 0. unchanged since published? ------------------------------------------

    @cached_property
    def key(self) -> str:
        """What the model's plan is compiled from, hashed (unchanged.refresh_key)."""
        return unchanged.refresh_key(self.sql, self.settings, self.upstream_materializations)

    def _unchanged(self) -> RefreshResult | None:
        """NO_CHANGE told by the view's publication record alone, when it can (unchanged.py)."""
        if self.parent is not None or self.settings.full_refresh or self.settings.docs is not None:
            return None
        if (
            self.relations.exists(self.target) != "view"
            or self.relations.exists(self.state) is None
        ):
            return None
        self._view_properties = properties(self.runner, self.target)
        found = unchanged.check(
            self.runner,
            self.target,
            self.state,
            self._view_properties,
            self.key,
            pin=self.pins.pin,
            read_as=self._read_as,
            upstream_properties=self._upstream_properties,
        )
        if isinstance(found, str):
            self.log.debug(f"{self.model}: taking the whole refresh path: {found}")
            return None
        self.log.debug(f"{self.model}: unchanged since its view's publication: not compiled")
        publication = found.publication
        result = RefreshResult(
            action=Action.NO_CHANGE,
            reason=found.reason,
            source_versions={str(t): found.versions[t] for t in publication.read},
            previous_versions={
                str(t): int(publication.sources[t]["version"]) for t in publication.read
            },
        )
        if self.publisher is not None:
            # A group commit made in this run names every member at the state its view shows.
            result.publication = self.publisher.publish(
                Staged(
                    model_id=self.model,
                    relation=self.target,
                    state=self.state,
                    state_version=publication.state_version,
                    view_sql=found.view_sql,
                    action=result.action.value,
                    seconds=time.monotonic() - self._started,
                    source_versions=result.source_versions,
                    published=True,
                )
            )
        return result

    def _read_as(self, table: TableName) -> str:
        """How the refresh reads `table`: unchanged.SOURCE, PUBLISHED, or its materialization."""
        materialized = self.upstream_materializations.get(str(table).lower())
        if materialized is None:
            return unchanged.SOURCE
        if self.pins.wholesale(table) == decision.FALLBACK_TABLE:
            # A fallback table, written in place: pinned as a source is.
            return unchanged.SOURCE
        if (
            materialized == "ivm"
            and self.relations.exists(table) == "view"
            and not self.pins.same_group(table)
            # Refreshed in this run but not yet shown: its view says nothing of it.
            and self.pins.staged_upstream(table) is None
        ):
            return unchanged.PUBLISHED
        return materialized

    # -- 1. compile -------------------------------------------------------------

    def _refresh(self) -> RefreshResult:
        """The whole path: compile, pin, read the state's record, decide, write, publish."""
        try:
            split = self.split()
            self._refresh_nodes(split)
            plan = self.compile(split)
        except NotMaintainable as refusal:
            # A refusal of SQL that compiled at the last refresh: a source
            # column the model reads may have been renamed or dropped since.
            self._raise_if_source_columns_changed(refusal)
            if self.settings.fallback is not Fallback.FULL_REFRESH:
                raise
            result = self._fall_back(str(refusal))
            if self.publisher is not None:
                self.publisher.withdraw()
        else:
            result = self._maintain(plan)
        return result

    def split(self) -> nodes.Split:
        """The model's query and its plan nodes (CTEs and subqueries that cannot be merged)."""
        self._split = nodes.split_nodes(self.model, self.sql, self.target, self.relations.columns)
        return self._split

    def compile(self, split: nodes.Split | None = None) -> ViewPlan:
        """The model's plan; raises NotMaintainable before any SQL changes data.

        With plan nodes, their views must exist (the run refreshes them first).
        """
        split = split or self.split()
        tables = source_tables(parse_model(self.model, split.sql))
        if split.nodes:
            tables += source_tables(parse_statement(self.model, self.sql))
        upstreams = upstream_models(
            self.runner, dict.fromkeys(tables), self._relation_kind, self._upstream_properties
        )
        plan = compile_model(
            self.model,
            split.sql,
            _SparkCatalog(self.runner, self.relations.columns),
            upstreams,
            written=self.sql if split.nodes else None,
            extremes_kept=self.settings.extreme_values,
        )
        return self._in_state_form(plan, split)

    def _relation_kind(self, table: TableName) -> str | None:
        """A relation's type ('table', 'view'), a source's told by the properties its pin reads.

        dbt's answer lists the source's whole schema; a Delta table's
        properties name its protocol, an ivm model's view its state.
        """
        if str(table).lower() not in self.upstream_materializations:
            try:
                shown = self.pins.properties(table)
            except Exception:  # noqa: BLE001 - no such relation: dbt's answer says so
                return self.relations.exists(table)
            if DELTA_PROTOCOL_PROPERTY in shown:
                return "table"
            if emit.STATE_PROPERTY in shown:
                self._upstream_properties.setdefault(table, shown)
                return "view"
        return self.relations.exists(table)

    def _in_state_form(self, plan: ViewPlan, split: nodes.Split) -> ViewPlan:
        """The plan in the state form ivm_state_form asks for (log_state.py).

        'log' where the model cannot keep one is an error that says why;
        'auto' keeps such a model merged.
        """
        if self.settings.state_form is StateForm.MERGED:
            return plan
        circumstances = log_state.Circumstances(
            plan_nodes=bool(split.nodes),
            read_by_ivm_models=self.settings.change_feed,
            join_states=self.settings.join_state != JoinStateSetting.NONE,
            own_session=self.own_session,
        )
        reason = log_state.refusal(plan, circumstances)
        if reason is None:
            return log_state.with_log(plan)
        if self.settings.state_form is StateForm.LOG:
            raise StateFormRefused(self.model, reason)
        self.log.debug(f"{self.model}: ivm_state_form='auto' keeps the state merged: {reason}")
        return plan

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
                settings=RefreshSettings(
                    full_refresh=self.settings.full_refresh,
                    # The model reads the node: its history weighs the node's
                    # recomputes (handoff.py).
                    readers=(str(self.target),),
                    strategy=self.settings.strategy,
                    window_order_unique=self.settings.window_order_unique,
                    extreme_values=self.settings.extreme_values,
                ),
                relations=self.relations,
                upstream_materializations=self.upstream_materializations,
                parent=self,
                own_session=self.own_session,
                engine=self.engine,
            )
            result = node_refresh.run()
            self.relations.created(state, "table")
            self.relations.created(node.relation, "view")
            self.log.info(f"{self.model}: CTE {node.name}: {result.message}")

    # -- 2-4. pin, read the state's record, decide -----------------------------

    def _maintain(self, plan: ViewPlan) -> RefreshResult:
        for warning in () if self.settings.window_order_unique else plan.tie_warnings:
            self.log.warning(warning)
        pinned = {table: self.pins.pin(table, plan.upstreams.get(table)) for table in plan.tables}
        plan = _reading_unsummed(plan, pinned)
        if isinstance(self.settings.join_state, tuple):
            # An ivm_join_state alias that cannot keep a join state stops the
            # refresh here, before anything is written.
            self.join_states(pinned).chosen(plan, building=False)
        target_type = self._target_type()
        # The view's properties say the state version it shows and carry the
        # model's refresh history: one statement for both.
        if target_type != "view":
            self._view_properties = {}
        elif self._view_properties is None:
            self._view_properties = properties(self.runner, self.target)
        shown_version = self._shown_version(target_type, self._view_properties)
        try:
            return self._bring_forward(plan, dict(pinned), target_type, shown_version)
        except ConcurrentRefresh as skipped:
            if self.history.assumed is None:
                raise
            # A refresh committed after the version the view's record names
            # (state_history.py): go on from the history instead.
            self.log.debug(f"{self.model}: {first_line(skipped)}; reading the state's history")
            self.history.forget_assumed()
            return self._bring_forward(plan, dict(pinned), target_type, shown_version)

    def _bring_forward(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        target_type: str | None,
        shown_version: int | None,
    ) -> RefreshResult:
        """Decide from the state's record, then build, apply the change, or publish as it is."""
        facts = self._facts(plan, pinned, shown_version)
        found = decision.decide(plan, pinned, facts, self.settings)
        if self.history.assumed is not None and (
            found.action is not Action.INCREMENTAL or _sums_an_overwrite(plan, found)
        ):
            # Only a write checks the view's record (_apply): anything else
            # is decided on the history, and so is a change to be summed,
            # whose count may make it a recompute.
            self.history.forget_assumed()
            facts = self._facts(plan, pinned, shown_version)
            found = decision.decide(plan, pinned, facts, self.settings)
        if _sums_an_overwrite(plan, found):
            # An upstream's recompute overwrote its state (or a source was
            # reloaded whole): its change is summed, staged and counted
            # first, so the size decides.
            with self.writes(plan, pinned).staged_net_changes(plan, found.ranges) as net:
                found = decision.decide(plan, pinned, facts, self.settings, net.rows)
                if found.action is Action.INCREMENTAL:
                    found = replace(found, ranges=net.reading)
                    return self._carry_out(plan, pinned, facts, found, target_type, shown_version)
        return self._carry_out(plan, pinned, facts, found, target_type, shown_version)

    def _carry_out(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        facts: decision.Facts,
        found: Decision,
        target_type: str | None,
        shown_version: int | None,
    ) -> RefreshResult:
        """Build, apply the change, or publish as it is, as `found` says."""
        if found.action is Action.REBUILD and not self.settings.full_refresh:
            found = self._with_model_columns(plan, found, target_type)
        result = RefreshResult(
            action=found.action,
            reason=found.reason,
            source_versions={str(t): v for t, v in versions_of(pinned).items()},
            previous_versions={str(t): r.recorded for t, r in found.ranges.items()},
        )
        if found.builds:
            self._log_build(found)
            return self._build(plan, pinned, result, shown_version, facts, found)
        assert facts.recorded is not None
        if found.action is Action.NO_CHANGE:
            state_version = facts.recorded.state_version
            self._publish(
                plan,
                result,
                pinned,
                state_version,
                shown_version,
                facts.history,
                found,
                unwritten=facts.recorded,
            )
            return result
        if found.choice is not None and found.choice.estimate is not None:
            self.log.debug(f"{self.model}: applying the change: {found.reason}")
        rebuilt = self._apply(plan, pinned, found, facts, result, shown_version)
        if rebuilt is not None:
            return rebuilt
        state_version = self.history.latest_version()
        self._publish(plan, result, pinned, state_version, shown_version, facts.history, found)
        return result

    def _target_type(self) -> str | None:
        """The model's relation type; a relation of another kind (a 'table') is dropped first."""
        target_type = self.relations.exists(self.target)
        if target_type is not None and target_type != "view":
            self.log.info(
                f"{self.model}: replacing the {target_type} {self.target} with the ivm view"
            )
            self.relations.drop(self.target, target_type)
            return None
        return target_type

    def _shown_version(
        self, target_type: str | None, view_properties: dict[str, str]
    ) -> int | None:
        """The state version the model's view shows (None: no view, or one not pinned)."""
        if target_type != "view":
            return None
        shown = view_properties.get(emit.STATE_VERSION_PROPERTY)
        if shown is not None:
            return int(shown)
        # A view published before the property existed: its text says it.
        return published_version(self.runner, self.target, self.state)

    @property
    def needs_size(self) -> bool:
        """Whether pinning reads a source's size where its history cannot say (Pins.complete).

        Only ivm_strategy: auto and ivm_join_state: auto weigh the sources' sizes.
        """
        return (
            self.settings.strategy is Strategy.AUTO
            or self.settings.join_state == JoinStateSetting.AUTO
        )

    def _facts(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        shown_version: int | None,
    ) -> decision.Facts:
        """What the decision weighs, read from the state's record, the sources and the view.

        The state's record is the one its view carries where the write
        checks it (_takes_view_record), unless the history has been read in
        this refresh or must be (state_history.py).
        """
        view_properties = self._view_properties or {}
        state_exists = self.relations.exists(self.state) is not None
        recorded = None
        if state_exists and self._takes_view_record(plan):
            recorded = self.history.from_view(
                view_properties, shown_version, periodic=plan.log_state
            )
        if state_exists and recorded is None:
            recorded = self.history.recorded()
        for table, snapshot in pinned.items():
            entry = recorded.sources.get(str(table)) if recorded else None
            pinned[table] = self.pins.complete(snapshot, entry, self.needs_size)
        commits = {}
        if recorded is not None:
            for table, after in schema_changes.sources_to_check(plan, pinned, recorded).items():
                commits[table] = self.pins.schema_commits_after(table, after, pinned[table])
        history = strategy.parse_history(view_properties.get(strategy.HISTORY_PROPERTY))
        return decision.Facts(
            state=self.state,
            state_exists=state_exists,
            recorded=recorded,
            schema_commits=commits,
            wholesale={t: w for t in pinned if (w := self.pins.wholesale(t))},
            history=history,
        )

    def _takes_view_record(self, plan: ViewPlan) -> bool:
        """Whether the refresh may start from the record its view carries (state_history.py).

        Its write must check the record: a log state's INSERT by Delta's
        transaction id, a merged state's MERGE by its guard row; and this
        refresh must learn the version it made (own_session). Not a WINDOW
        model (a change that touches no partition commits unguarded), nor
        one keeping join states (their upkeep reads the state's history).
        """
        return (
            self.own_session
            and plan.view_class is not ViewClass.WINDOW
            and self.settings.join_state == JoinStateSetting.NONE
        )

    def _with_model_columns(
        self, plan: ViewPlan, found: Decision, target_type: str | None
    ) -> Decision:
        """A rebuild's reason, with the model's column changes if any (on_schema_change)."""
        if target_type != "view":
            return found
        reason = schema_changes.model_columns_reason(
            self.model,
            found.reason,
            self.relations.columns(self.target),
            [(output.name, output.data_type) for output in plan.outputs],
            self.settings.on_schema_change,
        )
        return Decision(found.action, reason, found.ranges)

    def _log_build(self, found: Decision) -> None:
        if found.action is Action.REBUILD and not self.settings.full_refresh:
            self.log.warning(f"{self.model}: rebuilding fully: {found.reason}")
        elif found.action is Action.RECOMPUTE:
            way = "recomputing" if found.choice is None else "recomputing instead of applying"
            self.log.info(f"{self.model}: {way}: {found.reason}")

    # -- 5. write ---------------------------------------------------------------

    def writes(self, plan: ViewPlan, pinned: dict[TableName, SourceSnapshot]) -> StateWrites:
        def metadata(refresh_id: str, guard: str | None) -> dict[str, Any]:
            return commit_metadata(
                refresh_id,
                self.state,
                plan.fingerprint,
                self.pins.recorded(pinned),
                guard=guard,
                columns_read=plan.source_columns,
                on_record=self.history.on_record(),
            )

        return StateWrites(
            self.runner,
            self.log,
            self.model,
            self.state,
            metadata,
            own_session=self.own_session,
            committed=self.history.committed,
            staging=staging(
                pinned,
                self.engine().parallelism if self.engine else 1,
                self._state_deletion_vectors(pinned),
            ),
        )

    def _state_deletion_vectors(self, pinned: Mapping[TableName, SourceSnapshot]) -> bool:
        """Whether the state's files may carry deletion vectors, where that decides the confs.

        Read (SHOW TBLPROPERTIES) only where the change would otherwise run
        without data skipping (delta.confs.skips_without_statistics): a state
        written with vectors over large sources keeps them after its sources
        shrink, and Delta refuses to scan it without data skipping.
        """
        if not skips_without_statistics(pinned) or self.relations.exists(self.state) is None:
            return False
        if self._state_vectors is None:
            self._state_vectors = may_have_deletion_vectors(properties(self.runner, self.state))
        return self._state_vectors

    def _build(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        result: RefreshResult,
        shown_version: int | None,
        facts: decision.Facts,
        found: Decision,
    ) -> RefreshResult:
        # A view still shows the state's old version (time travel reads it with
        # its old columns) until the new one is published: no drop needed even
        # when the model's columns change.
        versions = versions_of(pinned)
        writes = self.writes(plan, pinned)
        in_place = result.action is Action.RECOMPUTE or self._rebuilds_in_place(plan, facts, result)
        if in_place:
            chosen = self._hand_off(plan, facts, found, pinned)
            guard = self._guard_to_merge_under(facts) if chosen.merges else None
            estimate = found.change.rows if found.change is not None else None
            writes.recompute(
                plan,
                versions,
                self.history.newest_version(),
                guard,
                None if guard is not None else estimate,
            )
            if self.settings.change_feed:
                result.handoff = chosen.describe()
        else:
            writes.build(plan, versions, self.settings.change_feed, self.history.newest_version())
        self.join_states(pinned).build(plan, pinned)
        result.previous_versions = {}
        state_version = self.history.latest_version()
        self._publish(plan, result, pinned, state_version, shown_version, facts.history, found)
        if result.action is not Action.RECOMPUTE:
            # A rebuild follows a change of the SQL, which may have dropped a CTE.
            self._drop_nodes(keep=self._split.nodes if self._split else ())
        return result

    def _rebuilds_in_place(
        self, plan: ViewPlan, facts: decision.Facts, result: RefreshResult
    ) -> bool:
        """Whether a rebuild writes over the state in place, as a recompute does.

        Where ivm models read the state and it keeps its meaning (the
        fingerprint it recorded is this plan's: same query, columns, view
        and form), a rebuild is a recompute that its readers can take as a
        change: after a schema change of a source, a source re-created or
        rebuilt, an unreadable change feed, a write by hand, a plan node's
        source rebuilt. Replaced (CREATE OR REPLACE), the state would be a
        new table to them, and each would rebuild in turn. A first build
        and --full-refresh replace it.
        """
        recorded = facts.recorded
        return (
            result.action is Action.REBUILD
            and not self.settings.full_refresh
            and self.settings.change_feed
            and facts.state_exists
            and recorded is not None
            and recorded.fingerprint == plan.fingerprint
        )

    def _guard_to_merge_under(self, facts: decision.Facts) -> str | None:
        """The guard a MERGE into the state must find (None: not known, so overwrite).

        The record decided on, unless this refresh committed since (a write
        whose record did not hold, recipe._record_broken) or something wrote
        the state outside dbt (its guard row may be gone).
        """
        recorded = facts.recorded
        if recorded is None or recorded.later_writes or self.history.wrote:
            return None
        return recorded.guard

    def _hand_off(
        self,
        plan: ViewPlan,
        facts: decision.Facts,
        found: Decision,
        pinned: Mapping[TableName, SourceSnapshot],
    ) -> handoff.HandOff:
        """How a state computed whole is written for the ivm models reading it (handoff.py).

        Merged by key, only the rows that differ are written: the difference
        computed once, which every reader reads as a change and sizes by the
        MERGE's metrics. Overwritten, the write is cheaper, records the size
        of the change that made the model recompute, and each reader that
        applies it sums it first. A log state has no key to merge by.
        """
        sized = all(snapshot.size_bytes is not None for snapshot in pinned.values())
        return handoff.choose(
            self._reader_names(),
            self._readers,
            found.change.rows if found.change is not None else None,
            handoff.write_seconds(facts.history, total_size(pinned.values())),
            log_state=plan.log_state,
            guard=self._guard_to_merge_under(facts),
            source_bytes=total_size(pinned.values()) if sized else None,
        )

    def _reader_names(self) -> tuple[str, ...]:
        """The ivm models reading the state (none where it keeps no change feed)."""
        if not self.settings.change_feed:
            return ()
        # Without dbt's graph to name them (explain, a direct call), one is assumed.
        return self.settings.readers or ("an ivm model",)

    def _readers(self) -> list[handoff.Reader]:
        """The ivm models reading the state, with their refresh histories (their views')."""
        found = []
        for name in self._reader_names():
            shown: dict[str, str] = {}
            if name in self.settings.readers:
                try:
                    shown = properties(self.runner, table_name_of(name))
                except Exception as error:  # noqa: BLE001 - not built yet: no history
                    self.log.debug(
                        f"{self.model}: no refresh history of its reader {name}: {error}"
                    )
            history = strategy.parse_history(shown.get(strategy.HISTORY_PROPERTY))
            found.append(handoff.Reader(name, history))
        return found

    def _apply(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        found: Decision,
        facts: decision.Facts,
        result: RefreshResult,
        shown_version: int | None,
    ) -> RefreshResult | None:
        """Write the change; a RefreshResult when it turned into a recompute or rebuild instead."""
        assert facts.recorded is not None and facts.recorded.guard is not None
        writes = self.writes(plan, pinned)
        ranges = dict(found.ranges)
        try:
            if plan.view_class is ViewClass.WINDOW:
                touched = writes.touched_partitions(plan, ranges)
                if len(touched) > writes.touched_partitions_limit:
                    limit = writes.touched_partitions_limit
                    reason = f"the change touches more than {limit} window partitions"
                    self.log.info(f"{self.model}: recomputing instead of applying: {reason}")
                    result.action, result.reason = Action.RECOMPUTE, reason
                    return self._build(plan, pinned, result, shown_version, facts, found)
                written = writes.apply_partitions(
                    plan, versions_of(pinned), touched, facts.recorded.guard
                )
            elif plan.log_state:
                read_version = self.history.newest_version()
                assert read_version is not None
                written = writes.append_change(
                    plan,
                    ranges,
                    facts.recorded.guard,
                    read_version,
                    compacting=self.history.log_compaction_due(),
                )
            else:
                written = writes.apply_change(
                    plan,
                    ranges,
                    facts.recorded.guard,
                    self.join_states(pinned),
                    pinned,
                    refill_first=strategy.refilled_last(facts.history),
                )
        except ConcurrentRefresh:
            raise
        except (CancellingRemoval, TopKShort) as refused:
            # The MERGE wrote nothing: a recomputation at the pinned versions
            # gives the remaining values' sums and moments to the last bits, or
            # a top-k state the rows past its edge, which it never kept.
            reason = refused.REASON
            self.log.info(f"{self.model}: recomputing instead of applying: {reason}")
            result.action, result.reason = Action.RECOMPUTE, reason
            return self._build(plan, pinned, result, shown_version, facts, found)
        except Exception as error:
            if not is_change_history_unavailable(error):
                raise
            reason = _unreadable_reason(ranges, error)
            self.log.warning(f"{self.model}: rebuilding fully: {reason}")
            result.action, result.reason = Action.REBUILD, reason
            return self._build(plan, pinned, result, shown_version, facts, found)
        broken = self._record_broken(plan, pinned, facts)
        if broken is not None:
            self.log.warning(f"{self.model}: rebuilding fully: {broken}")
            result.action, result.reason = Action.REBUILD, broken
            return self._build(plan, pinned, result, shown_version, facts, found)
        self._report_written(result, written)
        return None

    def _report_written(self, result: RefreshResult, written: Written) -> None:
        """The incremental result's row counts, and a log line for each group-level fix-up."""
        result.action = Action.INCREMENTAL
        result.rows_inserted = written.inserted
        result.log_write = written.log_write
        result.rows_updated = written.updated
        result.rows_deleted = written.deleted
        if written.nothing is not None:
            result.reason = written.nothing
        if written.refilled_extremes:
            result.refilled_extremes = True
            self.log.info(
                f"{self.model}: groups whose kept MIN/MAX values the change removed took their "
                "next values from the sources (ivm_extreme_values)"
            )
        if written.recomputed_groups:
            result.recomputed_groups = True
            self.log.info(
                f"{self.model}: {CancellingRemoval.REASON}: recomputed those groups from the "
                "sources and merged the change into the others"
            )

    def _record_broken(
        self,
        plan: ViewPlan,
        pinned: dict[TableName, SourceSnapshot],
        facts: decision.Facts,
    ) -> str | None:
        """After a write on the view's record: why the state must be rebuilt, if it did not hold.

        The write made the version after the record's, or something else
        committed between them (state_history.py): then the history says
        what, as it would to the next refresh (delta.records.RecordedState.on_record).
        """
        assumed = self.history.assumed
        if assumed is None:
            return None
        if self.history.latest_version() == assumed.state_version + 1:
            return None
        self.history.forget_assumed()
        found = decision.decide(
            plan, pinned, replace(facts, recorded=self.history.recorded()), self.settings
        )
        return found.reason if found.builds else None

    def join_states(self, pinned: dict[TableName, SourceSnapshot]) -> join_states.JoinStates:
        """The model's join states (ivm_join_state), sized by the pinned sources."""

        def facts(table: TableName) -> join_states.SourceFacts | None:
            snapshot = pinned.get(table)
            if snapshot is None:
                return None
            return join_states.SourceFacts(
                size_bytes=snapshot.size_bytes or 0,
                column_count=len(self.relations.columns(table)),
            )

        setting = self.settings.join_state
        return join_states.JoinStates(
            runner=self.runner,
            log=self.log,
            model=self.model,
            target=self.target,
            setting=list(setting) if isinstance(setting, tuple) else setting,
            relation_exists=self.relations.exists,
            drop_relation=self.relations.drop,
            relation_created=self.relations.created,
            source_facts=facts,
            commit=StateWrites(self.runner, self.log, self.model, self.state).commit,
            recent_refreshes=self.history.recent_refreshes,
        )

    def _drop_nodes(self, keep: Sequence[nodes.PlanNode]) -> None:
        """Drop the model's plan nodes but those in `keep` (and the nodes of those)."""
        if self.target.db is None or not re.fullmatch(r"\w+", self.target.name):
            return  # SHOW VIEWS ... LIKE takes a pattern, where other characters have meanings
        prefix = f"{self.target.name}{nodes.NODE_INFIX}".lower()
        current = [str(n.relation.name).lower() for n in keep]
        columns, rows = self.runner.query(show_views_like(self.target.db, f"{prefix}*"))
        for row in rows:
            name = str(row[columns.index("viewName")]).lower()
            # A current node's own nodes are named after it, and are current too.
            if any(name == c or name.startswith(f"{c}{nodes.NODE_INFIX}") for c in current):
                continue
            stale = TableName(db=self.target.db, name=name)
            self.log.info(f"{self.model}: dropping {stale}, a plan node the model no longer has")
            self.relations.drop(stale, "view")
            self.relations.drop(state_of(stale), "table")

    # -- 6. publish --------------------------------------------------------------

    def _publish(
        self,
        plan: ViewPlan,
        result: RefreshResult,
        pinned: dict[TableName, SourceSnapshot],
        state_version: int,
        shown_version: int | None,
        history: Sequence[strategy.RefreshRecord],
        found: Decision,
        unwritten: RecordedState | None = None,
    ) -> None:
        """Show the state at `state_version` through the view, now or with the model's group.

        `unwritten`: the state's record, when this refresh wrote nothing.
        """
        # Kept whole: the branches below are one decision (show the view now,
        # or leave it to the group), read best side by side.
        docs = self.settings.docs
        kept = self._history_after(result, pinned, history, found)
        recorded = self.pins.recorded(pinned)
        # What the no-change shortcut reads back (unchanged.py).
        record = {
            unchanged.KEY_PROPERTY: self.key,
            unchanged.SOURCES_PROPERTY: unchanged.sources_property(
                recorded, pinned, self._upstream_properties
            ),
        }
        # What the next refresh of a log state starts from (state_history.py).
        state_record = self.history.published_record(unwritten)
        published = emit.Published(
            state_version=state_version,
            source_versions={s.table: s.version for s in recorded},
            properties={
                **({strategy.HISTORY_PROPERTY: kept} if kept else {}),
                **record,
                **({RECORD_PROPERTY: state_record} if state_record else {}),
            },
        )
        view_sql = emit.create_view(plan, self.state, self.target, docs, published)
        shown = shown_version == state_version
        if shown and docs is not None:
            # Same state, maybe new descriptions: not a publication, so not held back.
            self.runner.execute(view_sql)
        elif shown and result.reason == NO_SOURCE_COMMITS and self._records_otherwise(record):
            # The view shows the state at exactly the pins, but was published
            # without this record (an earlier plugin, other settings): add it,
            # so the next refresh without a change takes the shortcut.
            self.runner.execute(emit.set_properties(self.target, "VIEW", published.properties))
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
            action=result.action.value,
            seconds=time.monotonic() - self._started,
            source_versions={str(t): v for t, v in versions_of(pinned).items()},
            published=shown,
            publish_sql=tuple(emit.publish_view(plan, self.state, self.target, published, docs)),
        )
        if self.publisher is None:
            for statement in () if shown else staged.publish_sql:
                self.runner.execute(statement)
            return
        result.publication = self.publisher.publish(staged)

    def _records_otherwise(self, record: Mapping[str, str]) -> bool:
        shown = self._view_properties or {}
        return any(shown.get(name) != value for name, value in record.items())

    def _history_after(
        self,
        result: RefreshResult,
        pinned: dict[TableName, SourceSnapshot],
        history: Sequence[strategy.RefreshRecord],
        found: Decision,
    ) -> str | None:
        """The history property the published view carries after this refresh."""
        way: str
        if result.action is Action.INCREMENTAL:
            way = strategy.INCREMENTAL
        elif result.action is Action.RECOMPUTE:
            way = strategy.RECOMPUTE
        elif result.action in (Action.BUILD, Action.REBUILD):
            way = strategy.BUILD
        else:  # nothing ran that says what a refresh costs
            return strategy.history_with(history, None) if history else None
        record = strategy.RefreshRecord(
            way=way,
            changed_rows=found.change.rows if found.change else 0,
            source_bytes=total_size(pinned.values()),
            seconds=round(time.monotonic() - self._started, 3),
            refilled=result.refilled_extremes,
        )
        return strategy.history_with(history, record)

    # -- the fallback path -------------------------------------------------------

    def _fall_back(self, refusal: str) -> RefreshResult:
        """Clear the ivm relations, then write the table in place or have the materialization build it.

        In place (refresh/fallback.py) where ivm models read it: they then
        apply its change instead of rebuilding.
        """
        self.log.warning(
            f"{self.model}: recomputing fully because ivm_fallback='full_refresh': {refusal}"
        )
        if self.relations.exists(self.target) == "view":
            self.relations.drop(self.target, "view")
        if self.relations.exists(self.state):
            self.relations.drop(self.state, "table")
        self._drop_nodes(keep=())
        self.join_states({}).drop_others(keep=())
        result = RefreshResult(action=Action.FALLBACK, reason=refusal)
        table = fallback.FallbackTable(
            self.runner,
            self.log,
            self.model,
            self.target,
            self.sql,
            self.relations.columns,
            staged_select=self._staged_select,
            own_session=self.own_session,
        )
        result.table_properties = table.properties_after_build(self.settings.change_feed)
        result.table_sql = table.build_sql()
        if not self.settings.change_feed:
            return result
        if self.settings.full_refresh:
            table.rebuilt_because("--full-refresh")
            return result
        if self.relations.exists(self.target) != "table":
            table.rebuilt_because("its first build as a table")
            return result
        written = table.write_in_place(self._reader_names(), self._readers)
        if isinstance(written, str):
            table.rebuilt_because(written)
            return result
        result.table_written = True
        result.rows_inserted, result.rows_deleted = written.inserted, written.deleted
        result.handoff = fallback.describe_write(written)
        return result

    def _staged_select(self, table: TableName) -> exp.Query | None:
        """The SELECT an upstream refreshed in this run will be shown by, if not shown yet.

        For the fallback table's query (fallback.reading_staged); the groups
        read so are recorded, so that the table's ivm readers publish after them.
        """
        group_run = self.publisher.group_run if self.publisher is not None else None
        found = group_run.staged_upstream(table) if group_run is not None else None
        if group_run is None or found is None:
            return None
        progress, staged = found
        group_run.written_from_staged(self.target, {progress.group.name})
        self.log.debug(
            f"{self.model}: reads {table} at its state refreshed in this run (version "
            f"{staged.state_version}), which consistency group {progress.group.name!r} has "
            "not published yet"
        )
        return view_select(staged.view_sql)

    def _raise_if_source_columns_changed(self, refusal: NotMaintainable) -> None:
        """Raise SourceSchemaChanged when a column the state was built on is gone."""
        if self.relations.exists(self.state) is None:
            return
        recorded = self.history.recorded()
        if recorded is None:
            return
        changes: list[schema_changes.ColumnChange] = []
        versions: dict[str, int] = {}
        for source, entry in recorded.sources.items():
            if not entry.get("columns"):
                continue
            table = table_name_of(source)
            try:
                current = self.relations.columns(table)
            except Exception as error:  # noqa: BLE001 - a source that is gone: the refusal says it
                self.log.debug(f"{self.model}: cannot list the columns of {table}: {error}")
                continue
            if not current:
                continue  # no such table now: the refusal already says what is wrong
            after = int(entry["version"])
            found = schema_changes.read_column_changes(
                source, entry["columns"], current, self.pins.schema_commits_after(table, after)
            )
            gone = [c for c in found if c.kind in ("renamed", "dropped")]
            if gone:
                changes.extend(gone)
                versions[source] = after
        if changes:
            raise schema_changes.SourceSchemaChanged(
                self.model, changes, versions, first_line(refusal, limit=300)
            ) from refusal


def _unreadable_reason(ranges: Mapping[TableName, Any], error: BaseException) -> str:
    changed = ", ".join(
        f"{table} between versions {r.recorded + 1} and {r.pinned}"
        if r.changed
        else f"{table} at version {r.recorded}"
        for table, r in ranges.items()
    )
    return (
        f"the change feed or an old version of {changed} can no longer be read "
        f"({error_summary(error)})"
    )


# How an incremental result's message says it recomputed some groups.
RECOMPUTED_GROUPS = "groups whose change cancelled their sums or moments recomputed"


def _sums_an_overwrite(plan: ViewPlan, found: Decision) -> bool:
    """Whether the change to apply reads a relation overwritten in its range (summed first)."""
    return found.action is Action.INCREMENTAL and bool(emit.overwritten_tables(plan, found.ranges))


def state_of(relation: TableName) -> TableName:
    """The Delta table behind an ivm model's (or plan node's) view."""
    return TableName(db=relation.db, name=f"{relation.name}{names.STATE_SUFFIX}")


class _SparkCatalog:
    """The compiler's Catalog, answered by Spark through the refresh's runner."""

    def __init__(
        self, runner: Runner, columns: Callable[[TableName], list[tuple[str, str]]]
    ) -> None:
        self._runner = runner
        self.columns = columns

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        columns, rows = self._runner.query(f"DESCRIBE QUERY {sql}")
        name_at, type_at = columns.index("col_name"), columns.index("data_type")
        return [(str(row[name_at]), str(row[type_at])) for row in rows]


def _reading_unsummed(plan: ViewPlan, pinned: Mapping[TableName, SourceSnapshot]) -> ViewPlan:
    """The plan with each upstream whose pinned state one commit wrote whole read unsummed.

    A log upstream's build or rewrite holds no retraction, so its rows need no
    sum per key where they are read at that version (a first build, a
    recompute, a window's partitions): UpstreamModel.unsummed_version.
    """
    upstreams = {
        table: replace(upstream, unsummed_version=pinned[table].version)
        if table in pinned and pinned[table].written_whole()
        else upstream
        for table, upstream in plan.upstreams.items()
    }
    return replace(plan, upstreams=upstreams) if upstreams != plan.upstreams else plan
