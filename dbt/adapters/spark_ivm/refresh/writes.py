"""Every write a refresh makes to a model's state: one Delta commit each, carrying its record.

Exactly once: the only statements that change a state are single Delta
commits (CREATE OR REPLACE TABLE ... AS SELECT, MERGE, a properties-only
commit) carrying, in their commit metadata, the source versions the state
reflects after them. A refresh stopped between two statements leaves the
state at its last commit; the next run reads the versions from that commit
and applies exactly the range after it.

Every MERGE is guarded (emit.Guard): it fails, having written nothing, when
another refresh of the model committed after this one read the state.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dbt.adapters.spark_ivm.consistency.publish import Log, Runner
from dbt.adapters.spark_ivm.delta.confs import (
    LAST_COMMIT_CONF,
    NOTHING_STAGED,
    STAGE_SETTINGS,
    Staging,
    committing,
    conf_value,
    forget_last_commit,
    read_conf,
    under,
)
from dbt.adapters.spark_ivm.delta.errors import (
    is_cancelling_removal,
    is_concurrent_refresh,
    is_exhausted,
    is_top_k_short,
)
from dbt.adapters.spark_ivm.delta.history import (
    ESTIMATED_ROWS_KEY,
    RECOMPUTED_MARKER,
    commit_rows,
    describe_history,
)
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, versions_of
from dbt.adapters.spark_ivm.refresh import join_states
from ivm_compiler import (
    TableName,
    ViewPlan,
    changes,
    emit,
    key_bounds,
    layout,
    log_state,
    merge_source,
    names,
)
from ivm_compiler.errors import IvmError, first_line
from ivm_compiler.reads import VersionRange
from ivm_compiler.view_classes import window as windows_rules


class ConcurrentRefresh(IvmError):
    """Another refresh of the same model committed to its state after this one read it."""

    def __init__(self, model: str, state: TableName, error: BaseException) -> None:
        self.model = model
        super().__init__(
            f"Model '{model}': another refresh of this model committed to {state} after this "
            "run read it, so this run applied nothing (its change is already applied, or "
            f"will be by the next run) ({first_line(error, limit=300)}). Fix: re-run to pick "
            "up later changes; do not refresh one model from two dbt invocations at once."
        )


class CancellingRemoval(Exception):
    """The MERGE refused to merge a change that cancels a group's moments or sum (emit.CANCELLED).

    It wrote nothing: the refresh recomputes those groups, or the model (recipe.py).
    """

    REASON = (
        "the change takes out values that dominated a group's floating-point "
        "SUM/AVG or STDDEV/VARIANCE/COVAR/CORR (merging it would cancel more than 20 "
        "of a double's 53 bits)"
    )

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{self.REASON} ({first_line(error, limit=300)})")


class TopKShort(Exception):
    """The MERGE refused a change that may leave a top-k state fewer than k rows.

    It wrote nothing: the refresh recomputes the state's best rows
    (ivm_compiler/rules/top_k_buffer.py).
    """

    REASON = (
        "the change may leave the state fewer rows than its view shows (it keeps "
        "only the best ones), so its best rows are recomputed from the query"
    )


class ExhaustedExtremes(Exception):
    """The MERGE stopped at a group whose bounded MIN/MAX values ran out (emit.EXHAUSTED).

    It wrote nothing: the refresh runs it again, refilling those groups from
    the sources (ivm_compiler/rules/extremes.py).
    """


@dataclass(frozen=True)
class _MergeInputs:
    """What a change's MERGE reads: the plan, its ranges (stages named), guard, key bounds, join-state reads."""

    plan: ViewPlan
    reading: dict[TableName, VersionRange]
    guard: emit.Guard
    bounds: key_bounds.Bounds
    join_reads: changes.JoinReads
    # Refill bounded MIN/MAX values without trying the plain MERGE first
    # (strategy.refilled_last).
    refill_first: bool = False


@dataclass
class Written:
    """What a change's commit did to the state rows (Delta's MERGE counts)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    # Set when nothing but the record changed: why.
    nothing: str | None = None
    # Set when the groups whose removal cancelled were recomputed (CancellingRemoval).
    recomputed_groups: bool = False
    # Set when groups whose kept MIN/MAX values ran out were refilled (ExhaustedExtremes).
    refilled_extremes: bool = False
    # A log state's write (log_state.py): "appended", or "rewritten" when compacted.
    log_write: str | None = None


@dataclass(frozen=True)
class NetChanges:
    """Overwritten relations' changes, summed, staged and counted (staged_net_changes)."""

    # The refresh's ranges, each overwritten relation's naming its stage.
    reading: dict[TableName, VersionRange]
    # Per overwritten relation, the rows its stage holds.
    rows: dict[TableName, int]


@dataclass
class StateWrites:
    runner: Runner
    log: Log
    model: str
    state: TableName
    # The record every commit carries: (refresh id, guard it leaves or None) -> metadata.
    metadata: Callable[[str, str | None], dict[str, Any]] = field(
        default=lambda refresh_id, guard: {}
    )
    # True when no other thread or client shares the connection's Spark session
    # (a Thrift server's session unless it runs with singleSession; the embedded
    # runtime's, runtime/sessions.py): each commit's version is then read from
    # Delta's session conf and told to `committed`, with the commit's metadata.
    own_session: bool = False
    committed: Callable[[int, dict[str, Any]], None] = field(default=lambda version, metadata: None)
    # How a change runs: the session confs every statement of it runs under,
    # from its first stage to its write; small sources' snapshots staged, and
    # into how many partitions (delta.confs.staging, emit.stage_feeds, emit.stage_snapshots).
    staging: Staging = NOTHING_STAGED

    def commit(
        self,
        statement: str,
        metadata: dict[str, Any],
        settings: Mapping[str, str] = {},
        answer: bool = False,
    ) -> tuple[list[str], Sequence[Sequence[Any]]]:
        """Run one committing statement with `metadata` attached to its Delta commit.

        `answer`: return the statement's rows (a MERGE's counts); otherwise it
        is run without fetching. A Spark 3.5 Thrift server answers a command
        without output (CREATE TABLE AS, INSERT on Delta 3.3) with a result
        set whose schema has no column list, which the Thrift client fails to
        describe ("'NoneType' object is not iterable"); Spark 4 sends an
        empty one.

        `settings` are session confs the statement runs under (emit.merge_settings),
        set just before it and reset just after, inside the lock as the metadata is.
        When they carry a Delta transaction id (log_state.txn_settings), a write
        Delta skipped as a repeat is another refresh's (ConcurrentRefresh).
        """
        idempotent = log_state.TXN_APP_ID_CONF in settings
        shared = not self.own_session
        with committing(self.runner, metadata, shared_session=shared), under(self.runner, settings):
            if self.own_session:
                # Unset first: a version left by an earlier commit of this
                # session (the previous model's, on a reused connection) must
                # never pass for this statement's.
                self.runner.execute(forget_last_commit())
            if answer:
                rows = self.runner.query(statement)
            else:
                self.runner.execute(statement)
                rows = ([], [])
        if self.own_session:
            version = conf_value(*self.runner.query(read_conf(LAST_COMMIT_CONF)))
            if version is not None:
                self.committed(int(version), metadata)
            elif idempotent:
                raise ConcurrentRefresh(
                    self.model,
                    self.state,
                    RuntimeError(
                        "Delta skipped the write: a write with this refresh's "
                        "transaction id and version, or a later one, committed first"
                    ),
                )
        return rows

    def build(
        self,
        plan: ViewPlan,
        versions: Mapping[TableName, int],
        change_feed: bool = True,
        read_version: int | None = None,
    ) -> None:
        """The state computed from the sources at `versions` (CREATE OR REPLACE TABLE ... AS).

        `read_version`: a log state's newest version this refresh read, which
        guards the rewrite as it guards an append (log_state.txn_settings).
        """
        refresh_id = uuid.uuid4().hex
        txn = log_state.txn_settings(read_version) if plan.log_state else {}
        laid_out = self.state_layout(plan)
        statement = emit.create_state(plan, self.state, versions, refresh_id, change_feed, laid_out)
        self.commit(statement, self.metadata(refresh_id, None), {**txn, **laid_out.write_settings})
        if self.staging.large and not plan.log_state:
            self._vectors_if_large(refresh_id)

    def _vectors_if_large(self, refresh_id: str) -> None:
        """Deletion vectors on the state just built, if it is large (layout.deletion_vectors_pay).

        Its size is known only once it is written. The property's commit
        carries the build's record, so it stands as the build's last commit
        (the refresh's record, the guard and the version the view shows).
        """
        columns, rows = self.runner.query(describe_history(self.state, limit=1))
        built = commit_rows(columns, rows)[0]
        if not layout.deletion_vectors_pay(built.bytes_added):
            return
        vectors = {layout.DELETION_VECTORS_PROPERTY: "true"}
        self.commit(
            emit.set_properties(self.state, "TABLE", vectors), self.metadata(refresh_id, None)
        )

    def state_layout(self, plan: ViewPlan) -> layout.Layout:
        """How the state's rows lie in its files: sorted by key over sources of a GB (layout.py)."""
        return layout.layout(plan, self.staging.sorted_states)

    def recompute(
        self,
        plan: ViewPlan,
        versions: Mapping[TableName, int],
        read_version: int | None = None,
        guard_read: str | None = None,
        estimated_rows: int | None = None,
    ) -> None:
        """The state's rows recomputed from the sources at `versions`, written over it in place.

        For a state that has this plan's columns (a recompute, not a rebuild):
        the table stays the one downstream ivm models recorded, so they go on
        from its change rather than rebuild. `guard_read`: the guard the
        state holds, to merge the recomputed rows by key under it
        (emit.merge_recomputed): only those that differ are written, so the
        change feed holds just them and the MERGE's metrics count them.
        Otherwise the state is overwritten (emit.overwrite_state), and
        `estimated_rows`, if given, recorded as the size of its change
        (delta.history.ESTIMATED_ROWS_KEY). `read_version`: as for build.
        """
        refresh_id = uuid.uuid4().hex
        metadata = {**self.metadata(refresh_id, None), RECOMPUTED_MARKER: True}
        # Whether to merge is the refresh's choice (Refresh._recompute_write),
        # which never merges a log: it has no key to merge by.
        assert guard_read is None or not plan.log_state
        if guard_read is not None:
            statement = emit.merge_recomputed(
                plan, self.state, versions, emit.Guard(read=guard_read, write=refresh_id)
            )
            written = self._merge(statement, metadata)
            self.log.debug(
                f"{self.model}: merged the recomputed rows by key: +{written.inserted} "
                f"~{written.updated} -{written.deleted} state rows written"
            )
            return
        if estimated_rows is not None:
            metadata[ESTIMATED_ROWS_KEY] = estimated_rows
        txn = log_state.txn_settings(read_version) if plan.log_state else {}
        laid_out = self.state_layout(plan)
        self.commit(
            emit.overwrite_state(plan, self.state, versions, refresh_id, laid_out.sort_key),
            metadata,
            {**txn, **laid_out.write_settings},
        )

    def append_change(
        self,
        plan: ViewPlan,
        ranges: dict[TableName, VersionRange],
        guard_read: str,
        read_version: int,
        compacting: bool,
    ) -> Written:
        """The change over `ranges` appended to a log state, or the log rewritten with it.

        Guarded by Delta's transaction id (log_state.py), not the guard row,
        which the commit records as it found it.
        """
        refresh_id = uuid.uuid4().hex
        with (
            under(self.runner, self.staging.settings),
            self.staged_feeds(plan, ranges, refresh_id) as reading,
        ):
            bounds = self.join_key_bounds(plan, reading)
            plan = self.unchanged_key_relations(plan, reading)
            with self.staged_snapshots(plan, reading, refresh_id, bounds) as reading:
                if compacting:
                    self.log.debug(
                        f"{self.model}: rewriting the state's log as its consolidated rows"
                    )
                    statement = log_state.compact(plan, self.state, reading, guard_read, bounds)
                else:
                    statement = log_state.append_changes(
                        plan, self.state, reading, refresh_id, bounds
                    )
                try:
                    self.commit(
                        statement,
                        self.metadata(refresh_id, guard_read),
                        log_state.txn_settings(read_version),
                    )
                except ConcurrentRefresh:
                    raise
                except Exception as error:
                    if is_concurrent_refresh(error):
                        raise ConcurrentRefresh(self.model, self.state, error) from error
                    raise
        # Delta's INSERT answers with no counts.
        return Written(log_write="rewritten" if compacting else "appended")

    def apply_change(
        self,
        plan: ViewPlan,
        ranges: dict[TableName, VersionRange],
        guard_read: str,
        kept_states: join_states.JoinStates,
        pinned: dict[TableName, SourceSnapshot],
        refill_first: bool = False,
    ) -> Written:
        """The change over `ranges` applied to the state with one guarded MERGE.

        `refill_first`: the MERGE reads the groups' best MIN/MAX values from
        the sources where their kept ones ran out, without a plain MERGE
        that would fail first (strategy.refilled_last).
        """
        refresh_id = uuid.uuid4().hex
        guard = emit.Guard(read=guard_read, write=refresh_id)
        with (
            under(self.runner, self.staging.settings),
            self.staged_feeds(plan, ranges, refresh_id) as reading,
        ):
            bounds = self.join_key_bounds(plan, reading)
            plan = self.unchanged_key_relations(plan, reading)
            try:
                join_reads, kept = kept_states.prepare(plan, reading, pinned, bounds)
            except Exception as error:
                if is_concurrent_refresh(error):
                    raise ConcurrentRefresh(self.model, self.state, error) from error
                raise
            with self.staged_snapshots(plan, reading, refresh_id, bounds, join_reads) as reading:
                written = self._merge_change(
                    _MergeInputs(plan, reading, guard, bounds, join_reads, refill_first), pinned
                )
        kept_states.drop_unkept(plan, kept)
        return written

    def _merge_change(
        self, inputs: _MergeInputs, pinned: dict[TableName, SourceSnapshot]
    ) -> Written:
        """apply_change's MERGE, over the change staged first where the plan asks (emit.stages_changes)."""
        plan, guard = inputs.plan, inputs.guard
        prefix = f"{names.STAGED_PREFIX}{guard.write}"
        changes_stage = prefix if emit.stages_changes(plan) else None
        # The change query's rows too: once the signed rows are staged, where
        # a source is large (delta.confs.Staging.change_rows); and where the
        # MERGE is bounded by their keys (_target_bounds): a sorted state, or
        # sources of delta.confs.MERGE_LIST_BYTES.
        rows_stage = (
            f"{prefix}_rows"
            if (changes_stage is not None and self.staging.change_rows)
            or self.staging.merge_lists
            or self.state_layout(plan).sort_key is not None
            else None
        )
        try:
            with under(self.runner, STAGE_SETTINGS if changes_stage or rows_stage else {}):
                if changes_stage is not None:
                    self.runner.execute(
                        emit.stage_changes(
                            plan, inputs.reading, changes_stage, inputs.bounds, inputs.join_reads
                        )
                    )
                if rows_stage is not None:
                    self.runner.execute(
                        emit.stage_change_rows(
                            plan,
                            self.state,
                            inputs.reading,
                            rows_stage,
                            inputs.bounds,
                            inputs.join_reads,
                            changes_stage,
                        )
                    )
            return self._merge_or_recompute(inputs, pinned, changes_stage, rows_stage)
        finally:
            for name in (rows_stage, changes_stage):
                for statement in emit.drop_staged(name) if name is not None else ():
                    self.runner.execute(statement)

    def _merge_or_recompute(
        self,
        inputs: _MergeInputs,
        pinned: dict[TableName, SourceSnapshot],
        changes_stage: str | None,
        rows_stage: str | None = None,
    ) -> Written:
        """The guarded MERGE; where it would cancel a group's inexact sum, one recomputing those groups.

        `rows_stage`: the change query's rows, cached (emit.stage_change_rows).
        """
        plan, reading, guard = inputs.plan, inputs.reading, inputs.guard
        bounds, join_reads = inputs.bounds, inputs.join_reads
        settings = emit.merge_settings(plan)
        metadata = self.metadata(guard.write, None)
        # The pinned versions, which a refill and a recomputation read the sources at.
        versions = versions_of(pinned)
        merge_changes = functools.partial(
            emit.merge_changes, plan, self.state, reading, guard, bounds, join_reads, changes_stage
        )
        if inputs.refill_first and any(p.kept is not None for p in plan.preaggregations):
            self.log.info(
                f"{self.model}: the last refresh refilled MIN/MAX values from the sources; "
                "refilling at once (ivm_extreme_values)"
            )
            return self._merge(merge_changes(refill=versions), metadata, settings)
        target = self._target_bounds(plan, rows_stage) if rows_stage is not None else ()
        try:
            return self._merge(
                merge_changes(staged_rows=rows_stage, target=target), metadata, settings
            )
        except ExhaustedExtremes:
            # The MERGE wrote nothing; this one also reads those groups'
            # best values from the sources at the pinned versions.
            self.log.debug(
                f"{self.model}: a group lost every MIN/MAX value the state kept; "
                "reading its best values from the sources"
            )
            written = self._merge(merge_changes(refill=versions), metadata, settings)
            written.refilled_extremes = True
            return written
        except CancellingRemoval:
            if not merge_source.recomputes_groups(plan):
                raise  # the refresh recomputes the model
        # The MERGE wrote nothing; this one recomputes the cancelled groups
        # from the sources and merges the rest, in one commit.
        written = self._merge(
            emit.merge_changes_recomputing_cancelled(
                plan, self.state, reading, versions, guard, bounds, join_reads, changes_stage
            ),
            metadata,
            settings,
        )
        written.recomputed_groups = True
        return written

    def _target_bounds(self, plan: ViewPlan, rows_stage: str) -> tuple[layout.TargetBounds, ...]:
        """The staged change's keys in the state's key columns, for the MERGE's ON (layout.py).

        A sorted state's MERGE is bounded by its sort key's ranges, which
        skip its files. Over sources of delta.confs.MERGE_LIST_BYTES, by each
        key column's list too where the probe lists it (at most
        layout.MAX_LISTED_MERGE_KEYS): a day's change touches keys of every
        age, so no file is skipped, but Spark filters the state's rows by the
        lists before the MERGE's joins, which otherwise shuffled the whole
        state in each of them. Every key column, not the first alone: the
        warehouse's `mart_category_sales` keeps a row per category and
        customer (COUNT(DISTINCT)'s values), and a day's change names all
        five categories, so its list of categories matched all 7 M rows.
        Empty where nothing bounds: no key, more keys than the probe lists,
        a type with no bounds.
        """
        sorted_by = self.state_layout(plan).sort_key
        columns = [sorted_by] if sorted_by is not None else []
        if self.staging.merge_lists and plan.keys:
            columns += [key for key in plan.merge_keys if key != sorted_by]
        if not columns:
            return ()
        _, described = self.runner.query(layout.describe_keys(rows_stage, columns))
        typed = [
            (column, str(row[1]).lower())
            for column, row in zip(columns, described, strict=True)
            if layout.bounded(str(row[1]).lower())
        ]
        if not typed:
            return ()
        sql, keys = layout.probe_keys(rows_stage, typed, self.staging.merge_lists)
        _, rows = self.runner.query(sql)
        found = key_bounds.parse_probe(keys, rows)
        bounds = []
        for key in keys:
            probed = found[(key.table, key.column.lower())]
            if key.column == sorted_by:
                bounds.append(
                    layout.TargetBounds(key.column, key.data_type, probed.ranges, probed.listed)
                )
            elif probed.listed is not None:
                bounds.append(layout.TargetBounds(key.column, key.data_type, (), probed.listed))
        if bounds:
            self.log.debug(
                f"{self.model}: the MERGE searches the state's rows with "
                + " and ".join(_target_text(b) for b in bounds)
            )
        return tuple(bounds)

    @contextlib.contextmanager
    def staged_feeds(
        self, plan: ViewPlan, ranges: dict[TableName, VersionRange], refresh_id: str
    ) -> Iterator[dict[TableName, VersionRange]]:
        """`ranges`, each change feed the refresh reads more than once staged first.

        Each repeated feed is cached as a session relation
        (emit.stage_feeds) and its range names it, so the key-bounds
        probe, the join states' upkeep and the write read it from there.
        """
        stages, reading = emit.stage_feeds(
            plan,
            ranges,
            f"{names.STAGED_PREFIX}{refresh_id}",
            self.staging.partitions,
            list_keys=self.staging.large,
            key_relations=self.staging.key_relation_lists,
        )
        with self._staged(stages, "change feeds"):
            yield reading

    @contextlib.contextmanager
    def staged_net_changes(
        self, plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
    ) -> Iterator[NetChanges]:
        """Each overwritten relation's change summed once and counted, for the block.

        emit.stage_net_changes: the count sizes the change for ivm_strategy
        (decision.change_size); the ranges yielded have every read of it
        read the stage. The sum runs with the session's partitions and
        generated code, not under the small-change settings (one partition,
        no generated code): it reads the relation's every row twice. At 200
        times the warehouse's data, fct_order_lines' 1.2 M overwrite rows
        summed in 6.4-10.3 s in one interpreted task. Like every stage it is
        planned statically (delta.confs.STAGE_SETTINGS).
        """
        stages, reading = emit.stage_net_changes(
            plan, ranges, f"{names.STAGED_PREFIX}{uuid.uuid4().hex}_net"
        )
        with self._staged(stages, "overwritten relations' changes summed"):
            rows = {}
            for stage in stages:
                _, answer = self.runner.query(emit.count_staged(stage.name))
                rows[stage.table] = int(answer[0][0])
            yield NetChanges(reading, rows)

    @contextlib.contextmanager
    def staged_snapshots(
        self,
        plan: ViewPlan,
        ranges: dict[TableName, VersionRange],
        refresh_id: str,
        bounds: key_bounds.Bounds,
        join_reads: changes.JoinReads | None = None,
    ) -> Iterator[dict[TableName, VersionRange]]:
        """`ranges`, each small source's snapshot the change rows read more than once staged first.

        emit.stage_snapshots: the write's change rows then read the source at
        its pinned version from the stage, planned once.
        """
        stages, reading = emit.stage_snapshots(
            plan,
            ranges,
            f"{names.STAGED_PREFIX}{refresh_id}_snapshot",
            self.staging.snapshots,
            bounds,
            join_reads,
            self.staging.partitions,
        )
        with self._staged(stages, "snapshots"):
            yield reading

    @contextlib.contextmanager
    def _staged(self, stages: list[emit.Stage], what: str) -> Iterator[None]:
        """The block run with `stages` cached first and dropped after it, whatever happened.

        They only hold what the pinned versions fix, so a refresh stopped in
        between leaves nothing to undo; after a failure, a drop that fails
        too is logged, not raised, so the error says what failed first.
        """
        staged: list[str] = []
        try:
            with under(self.runner, STAGE_SETTINGS if stages else {}):
                for stage in stages:
                    self.runner.execute(stage.statement)
                    staged.append(stage.name)
            if staged:
                self.log.debug(
                    f"{self.model}: {what} staged once for this refresh: "
                    + ", ".join(str(stage.table) for stage in stages)
                )
            yield
        except BaseException:
            for name in staged:
                try:
                    for statement in emit.drop_staged(name):
                        self.runner.execute(statement)
                except Exception as error:  # noqa: BLE001 - the first failure is the one raised
                    self.log.debug(f"{self.model}: dropping {name} failed: {first_line(error)}")
            raise
        else:
            for name in staged:
                for statement in emit.drop_staged(name):
                    self.runner.execute(statement)

    def join_key_bounds(
        self, plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
    ) -> key_bounds.Bounds:
        """The change's join-key ranges, which narrow the MERGE's partner reads (key_bounds.py).

        Where a source is large, the change's keys are listed too: their
        ranges then still span most of a large partner, the list its rows;
        past key_bounds.MAX_LISTED_KEYS they are read from the change instead.
        """
        relations = self.staging.key_relation_lists
        probe = emit.probe_join_keys(
            plan, ranges, list_keys=self.staging.large, key_relations=relations
        )
        if probe is None:
            return {}
        sql, keys = probe
        _, rows = self.runner.query(sql)
        bounds = key_bounds.parse_probe(keys, rows)
        if self.staging.large and any(k.ranges and k.listed is None for k in bounds.values()):
            # Only where some key is past the list: its read rebuilds the probe's change rows.
            bounds = emit.keys_past_list(plan, ranges, bounds, key_relations=relations)
        if not relations:
            # A key listed for a partner is not read into the key relations.
            bounds = {key: replace(found, key_relations=False) for key, found in bounds.items()}
        self.log.debug(f"{self.model}: join partners read within " + _described(bounds))
        return bounds

    def unchanged_key_relations(
        self, plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
    ) -> ViewPlan:
        """The plan for this refresh, its key relations that the change leaves as they were marked.

        Over large sources only (the probes are a job or two each): a key
        relation none of whose input's change rows has a key, or a keyless
        one with more rows now than the change has, did not change, and its
        term is left out (changes.with_unchanged_relations).
        """
        if not self.staging.large or not plan.join_terms:
            return plan
        unchanged = emit.unchanged_relations(plan, ranges, lambda sql: self.runner.query(sql)[1])
        if unchanged:
            self.log.debug(
                f"{self.model}: key relations the change leaves as they were, read at the "
                f"pinned version alone: {', '.join(sorted(unchanged))}"
            )
        return changes.with_unchanged_relations(plan, unchanged)

    def touched_partitions(
        self, plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
    ) -> list[windows_rules.PartitionKey]:
        """The partition keys a WINDOW model's change touches (at most one over the limit)."""
        _, rows = self.runner.query(
            emit.probe_partitions(plan, ranges, self.touched_partitions_limit)
        )
        return windows_rules.parse_probe(rows)

    @property
    def touched_partitions_limit(self) -> int:
        """The most partitions a WINDOW refresh recomputes by partition, not as a whole model."""
        if self.staging.large:
            return windows_rules.MAX_TOUCHED_PARTITIONS_LARGE
        return windows_rules.MAX_TOUCHED_PARTITIONS

    def apply_partitions(
        self,
        plan: ViewPlan,
        versions: Mapping[TableName, int],
        touched: list[windows_rules.PartitionKey],
        guard_read: str,
    ) -> Written:
        """Recompute a WINDOW model's touched partitions with one MERGE (view_classes/window.py)."""
        refresh_id = uuid.uuid4().hex
        if not touched:
            # Every change row failed the model's WHERE: nothing to recompute,
            # but the range is consumed, so record the versions. The commit
            # changes no data and leaves the guard row as it was, so it records
            # the guard it read; a concurrent refresh doing the same records
            # the same nothing.
            self.commit(
                emit.record_refresh(self.state, refresh_id), self.metadata(refresh_id, guard_read)
            )
            return Written(nothing="the changes touch no window partition")
        guard = emit.Guard(read=guard_read, write=refresh_id)
        self.log.debug(f"{self.model}: recomputing {len(touched)} window partitions")
        if not self.staging.large:
            statement = emit.merge_partitions(plan, self.state, versions, touched, guard)
            return self._merge(statement, self.metadata(refresh_id, None))
        # Over large sources the partitions' rows are computed once, before
        # the MERGE (emit.stage_partition_rows).
        staged = f"{names.STAGED_PREFIX}{refresh_id}_partitions"
        try:
            with under(self.runner, {**self.staging.settings, **STAGE_SETTINGS}):
                self.runner.execute(emit.stage_partition_rows(plan, versions, touched, staged))
                statement = emit.merge_partitions(
                    plan, self.state, versions, touched, guard, staged
                )
                return self._merge(statement, self.metadata(refresh_id, None))
        finally:
            for drop in emit.drop_staged(staged):
                self.runner.execute(drop)

    def _merge(
        self, statement: str, metadata: dict[str, Any], settings: Mapping[str, str] = {}
    ) -> Written:
        """Run a guarded MERGE (emit.Guard); it always commits, as it moves the guard row.

        When another refresh of the model committed after this one read the
        state, the MERGE fails having written nothing: the model's error says
        so (the other refresh applied the change, or a newer one).
        """
        try:
            columns, rows = self.commit(statement, metadata, settings, answer=True)
        except Exception as error:
            if is_concurrent_refresh(error):
                raise ConcurrentRefresh(self.model, self.state, error) from error
            if is_cancelling_removal(error):
                raise CancellingRemoval(error) from error
            if is_exhausted(error):
                raise ExhaustedExtremes(first_line(error, limit=300)) from error
            if is_top_k_short(error):
                raise TopKShort(first_line(error, limit=300)) from error
            raise
        # Delta's MERGE answers with one row of counts (num_affected_rows, ...);
        # the guard row's move is one of the updated rows, not a model row.
        merged = dict(zip(columns, rows[0])) if rows else {}
        written = Written(
            inserted=int(merged.get("num_inserted_rows") or 0),
            updated=max(int(merged.get("num_updated_rows") or 0) - 1, 0),
            deleted=int(merged.get("num_deleted_rows") or 0),
        )
        if written.inserted + written.updated + written.deleted == 0:
            # The changes cancelled out: the commit only moved the guard row and
            # recorded the new versions, so the next refresh does not read this
            # range again.
            written.nothing = "source changes cancelled out"
        return written


def _described(bounds: key_bounds.Bounds) -> str:
    """The probe's answer for the debug log: each key's ranges, and how many keys it listed."""
    described = []
    for (table, column), keys in bounds.items():
        text = _ranges_text(keys.ranges) or "nothing"
        if keys.ranges and keys.listed is not None:
            text += f", {len(keys.listed)} keys listed"
        elif keys.read is not None:
            text += f", its keys read from the change (more than {key_bounds.MAX_LISTED_KEYS:,})"
        described.append(f"{table}.{column} in {text}")
    return "; ".join(described)


def _target_text(bounds: layout.TargetBounds) -> str:
    """'__ivm_g0 in 2 listed keys': a MERGE's bound on one key column, for the debug log."""
    if bounds.listed is not None:
        return f"{bounds.column} in {len(bounds.listed)} listed keys"
    return f"{bounds.column} in {_ranges_text(bounds.ranges) or 'no range'}"


def _ranges_text(ranges: key_bounds.KeyRanges) -> str:
    """'[1, 4] or [9, 9]': probed key ranges for the debug log; '' for none."""
    return " or ".join(f"[{lo}, {hi}]" for lo, hi in ranges)
