"""`dbt run-operation ivm_explain`: the plan the compiler chose for a model, and what it keeps.

The report names the view class and the consistency level a reader can rely
on, the sources with the versions the state reflects and their current ones,
the state table's size (group rows and pre-aggregation rows apart), and the
SQL of every refresh step. The statements are also written as files, so they
can be read, diffed or run by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dbt.adapters.spark_ivm.consistency.groups import Group, why_grouped
from dbt.adapters.spark_ivm.delta import confs, records, tables
from dbt.adapters.spark_ivm.refresh import decision
from dbt.adapters.spark_ivm.refresh.recipe import Refresh
from dbt.adapters.spark_ivm.refresh.upstreams import properties, published_version
from ivm_compiler import (
    TableName,
    ViewClass,
    ViewPlan,
    changes,
    emit,
    join_states,
    key_bounds,
    layout,
    log_state,
    names,
)
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import top_k_buffer
from ivm_compiler.sql import DIALECT

# What a reader of the model's view can rely on (the consistency-levels paper):
# every class here reads sources at pinned versions and commits once per refresh.
CONSISTENCY = (
    "strong: every published state equals the query on the source versions recorded "
    "in its commit, and states are published in source order"
)

CLASS_STATE = {
    ViewClass.PROJECTION: "one row per distinct output row, with its multiplicity (__ivm_count)",
    ViewClass.DISTINCT: "one row per distinct output row, with its multiplicity (__ivm_count)",
    ViewClass.GROUPED_AGGREGATE: "one row per group: count, non-NULL counts, sums",
    ViewClass.GLOBAL_AGGREGATE: "one row: count, non-NULL counts, sums (kept when empty)",
    ViewClass.SET_OPERATION: "one row per distinct output row: its count in every operand",
    ViewClass.WINDOW: (
        "one row per distinct output row, with its multiplicity (__ivm_count) and its "
        "partition columns; a refresh recomputes the partitions its change touches"
    ),
}


# Stands for the refresh id a real refresh draws (uuid4 hex) in the statements shown.
EXPLAIN_REFRESH_ID = "<refresh id>"


def _change_statements(
    plan: ViewPlan,
    refresh: Refresh,
    windows: dict,
    current: dict,
    guard: emit.Guard,
    pending: bool,
    staging: confs.Staging = confs.NOTHING_STAGED,
) -> dict[str, str]:
    """How a refresh applies a change: one MERGE, or for WINDOW a probe and a MERGE.

    `pending`: the windows are the sources' commits since the last refresh
    (else the next commit of one source, which does not exist yet). The
    statements shown read the change feeds a refresh stages from their
    stages (stage_feed_<n>_<source>); the probe run here reads the feeds.
    """
    if plan.view_class is not ViewClass.WINDOW:
        stages, shown = _staged_feeds(plan, windows, staging)
        return {
            **stages,
            **_applying_statements(plan, refresh, windows, shown, guard, pending, staging),
        }
    if not plan.window_partition:
        return {}  # recomputed by create_state on every refresh with changes
    return {
        "probe_partitions": emit.probe_partitions(plan, windows),
        # The probe's keys replace FALSE (no partition) in the three predicates.
        "merge_partitions": emit.merge_partitions(plan, refresh.state, current, [], guard),
    }


def _staged_feeds(
    plan: ViewPlan, windows: dict[TableName, VersionRange], staging: confs.Staging
) -> tuple[dict[str, str], dict[TableName, VersionRange]]:
    """The CACHE TABLE of each feed (and overwritten relation's summed change) the refresh stages.

    With the windows reading the stages.
    """
    prefix = f"{names.STAGED_PREFIX}{EXPLAIN_REFRESH_ID}"
    summed, shown = emit.stage_net_changes(plan, windows, f"{prefix}_net")
    stages, shown = emit.stage_feeds(plan, shown, prefix, staging.partitions)
    return {**_steps("stage_net_change", summed), **_steps("stage_feed", stages)}, shown


def _steps(kind: str, stages: list[emit.Stage]) -> dict[str, str]:
    """Each stage's CACHE TABLE under its step name, `<kind>_<n>_<source>`."""
    return {
        f"{kind}_{index}_{stage.table.name}": stage.statement for index, stage in enumerate(stages)
    }


def _applying_statements(
    plan: ViewPlan,
    refresh: Refresh,
    windows: dict[TableName, VersionRange],
    shown: dict[TableName, VersionRange],
    guard: emit.Guard,
    pending: bool,
    staging: confs.Staging,
) -> dict[str, str]:
    """The probe and the write of a change: an INSERT into a log state, else a MERGE."""
    probe = emit.probe_join_keys(
        plan, shown, list_keys=staging.large, key_relations=staging.key_relation_lists
    )
    # The probe only reads the change feed: with pending commits run it, so
    # that the write shown is the one the next refresh runs; without, it is
    # shown unbounded (each term then gains `BETWEEN` bounds).
    bounds = refresh.writes(plan, {}).join_key_bounds(plan, windows) if probe and pending else {}
    probing = {"probe_join_keys": probe[0]} if probe else {}
    unchanged = emit.unchanged_relations_probe(plan, shown) if staging.large else None
    if unchanged is not None:
        # As the refresh asks; run with pending commits, so the write shown leaves
        # out the terms of the key relations the change leaves as they were.
        probing["probe_unchanged_relations"] = unchanged
        if pending:
            plan = refresh.writes(plan, {}).unchanged_key_relations(plan, windows)
    if plan.log_state:
        # A log state (ivm_state_form='log') takes the change with one INSERT;
        # a refresh rewrites it (log_state.compact) once the log outgrows.
        snapshots, reading = _staged_snapshots(plan, shown, staging, bounds)
        return {
            **probing,
            **snapshots,
            "append_changes": log_state.append_changes(
                plan, refresh.state, reading, EXPLAIN_REFRESH_ID, bounds
            ),
        }
    upkeep, join_reads = _join_state_statements(plan, refresh, shown, guard)
    snapshots, reading = _staged_snapshots(plan, shown, staging, bounds, join_reads)
    return {
        **upkeep,
        **probing,
        **snapshots,
        "merge_changes": emit.merge_changes(
            plan, refresh.state, reading, guard, bounds, join_reads
        ),
    }


def _staged_snapshots(
    plan: ViewPlan,
    shown: dict[TableName, VersionRange],
    staging: confs.Staging,
    bounds: key_bounds.Bounds,
    join_reads: changes.JoinReads | None = None,
) -> tuple[dict[str, str], dict[TableName, VersionRange]]:
    """The CACHE TABLE of each small source's snapshot the refresh stages, and the windows reading them."""
    stages, reading = emit.stage_snapshots(
        plan,
        shown,
        f"{names.STAGED_PREFIX}{EXPLAIN_REFRESH_ID}_snapshot",
        staging.snapshots,
        bounds,
        join_reads,
        staging.partitions,
    )
    return _steps("stage_snapshot", stages), reading


def _join_state_statements(
    plan: ViewPlan, refresh: Refresh, windows: dict, guard: emit.Guard
) -> tuple[dict[str, str], changes.JoinReads]:
    """The upkeep MERGE of each join state the model keeps, and the reads its MERGE uses.

    Read-only: the join state's commits are looked up as prepare looks them
    up (JoinStates.locate); the upkeep's commit is the one after its newest.
    """
    statements: dict[str, str] = {}
    reads: dict[str, dict[int, object]] = {}
    states = refresh.join_states({})
    for join_input in join_states.candidates(plan):
        relation = join_input.relation(refresh.target)
        window = windows[join_input.table]
        at_recorded, latest = states.locate(join_input, relation, window)
        if at_recorded is None or latest is None:
            continue
        at_pinned = latest.version
        if latest.source_version < window.pinned:
            upkeep_window = VersionRange(recorded=latest.source_version, pinned=window.pinned)
            statements[f"merge_join_state_{join_input.alias}"] = emit.merge_join_state(
                join_input, relation, upkeep_window, emit.Guard(latest.guard, guard.write)
            )
            at_pinned = latest.version + 1
        reads[join_input.alias] = {
            window.recorded: join_states.read(join_input, relation, at_recorded.version),
            window.pinned: join_states.read(join_input, relation, at_pinned),
        }
    return statements, reads  # type: ignore[return-value]


def _join_state_lines(plan: ViewPlan, refresh: Refresh) -> list[str]:
    """Each join input that can keep a join state: kept (and its size) or not."""
    lines = []
    for join_input in join_states.candidates(plan):
        relation = join_input.relation(refresh.target)
        columns = ", ".join(name for name, _ in join_input.columns)
        condition = (
            f" where {join_input.condition.sql(dialect=DIALECT)}" if join_input.condition else ""
        )
        if refresh.relations.exists(relation):
            detail_columns, rows = refresh.runner.query(tables.describe_detail(relation))
            detail = dict(zip(detail_columns, rows[0]))
            kept = (
                f"kept in {relation} ({detail.get('numFiles')} files, "
                f"{detail.get('sizeInBytes')} bytes)"
            )
        else:
            kept = "not kept: its partners read the source (ivm_join_state keeps it)"
        lines.append(
            f"  join state {join_input.alias}: ({columns}) of {join_input.table}{condition}, "
            f"by ({', '.join(join_input.join_keys)}), {kept}"
        )
    return lines


def group_lines(group: Group | None, model_id: str) -> list[str]:
    """The model's consistency group in a run of every ivm model, its members and why it is in it."""
    if group is None:
        return []
    members = ", ".join(m.name for m in group.members)
    return [
        (
            f"  consistency group: {group.name} (when every ivm model of the project runs; "
            "a narrower selection can only make it smaller)"
        ),
        f"    members: {members}",
        *(f"    because it {reason}" for reason in why_grouped(group, model_id)),
    ]


@dataclass(frozen=True)
class Explanation:
    text: str
    statements: dict[str, str]


def explain(refresh: Refresh, group: list[str] | None = None) -> Explanation:
    """What the next refresh would do, read-only: the plan in words and its SQL.

    `group`: the lines saying which consistency group the model is in and why
    (impl.ivm_explain builds them from dbt's graph; group_lines).
    """
    plan = refresh.compile()
    pinned = {t: refresh.pins.pin(t, plan.upstreams.get(t)) for t in plan.tables}
    state_type = refresh.relations.exists(refresh.state)
    recorded = refresh.history.recorded() if state_type else None
    current = tables.versions_of(pinned)
    reflected = {
        table: int(recorded.sources[str(table)]["version"])
        for table in plan.tables
        if recorded is not None and str(table) in recorded.sources
    }
    statements = _statements(refresh, plan, pinned, recorded, current)
    shown = (
        published_version(refresh.runner, refresh.target, refresh.state)
        if refresh.relations.exists(refresh.target) == "view"
        else None
    )
    lines = [
        f"ivm plan of {refresh.model}",
        f"  view class:   {plan.view_class.value}",
        f"  consistency:  {CONSISTENCY}",
        f"  relation:     view {refresh.target} over Delta table {refresh.state}",
        # The versions the SQL below is written for (engine.py: asked once per
        # Spark the process talks to; a statement form can depend on them).
        f"  engine:       {refresh.engine().describe() if refresh.engine else 'not asked'}",
        f"  published:    the view shows state version {shown}"
        + (f" (newest refresh commit: {recorded.state_version})" if recorded else ""),
        f"  state rows:   {CLASS_STATE[plan.view_class]}",
        "  sources:",
        *_source_lines(plan, reflected, current),
        *_delta_rule_lines(plan),
        *_join_state_lines(plan, refresh),
        *_preaggregation_lines(plan),
        *(_state_size(refresh, plan) if state_type else ["  state table:  not built yet"]),
        *(group or []),
        "  refresh steps (SQL below, and in the files listed):",
        *(f"    {name}" for name in statements),
    ]
    return Explanation(text="\n".join(lines), statements=statements)


def _statements(
    refresh: Refresh,
    plan: ViewPlan,
    pinned: dict[TableName, tables.SourceSnapshot],
    recorded: records.RecordedState | None,
    current: dict[TableName, int],
) -> dict[str, str]:
    """The statements of the next refresh, by step: build, change, view, query."""
    # The ranges a refresh would read now (decision.version_ranges: the same
    # function the refresh uses); a source the state never read starts at its pin.
    windows = (
        decision.version_ranges(pinned, recorded)
        if recorded is not None
        else {
            table: VersionRange(recorded=version, pinned=version)
            for table, version in current.items()
        }
    )
    pending = any(window.changed for window in windows.values())
    if not pending:
        # Show the MERGE the next commit on the first source would run.
        first = plan.tables[0]
        windows[first] = VersionRange(recorded=current[first], pinned=current[first] + 1)
    # The guard the next MERGE would check (and a placeholder for the id it would write).
    guard = emit.Guard(
        read=(recorded.guard if recorded and recorded.guard else EXPLAIN_REFRESH_ID),
        write=EXPLAIN_REFRESH_ID,
    )
    staged = _staging(refresh, pinned, recorded)
    # The layout a build now would give the state (layout.layout, as StateWrites decides it).
    laid_out = layout.layout(plan, staged.sorted_states)
    return {
        "create_state": emit.create_state(
            plan, refresh.state, current, EXPLAIN_REFRESH_ID, state_layout=laid_out
        ),
        **_change_statements(plan, refresh, windows, current, guard, pending, staged),
        "create_view": emit.create_view(
            plan,
            refresh.state,
            refresh.target,
            published=emit.Published(
                state_version=recorded.state_version if recorded else 0,
                source_versions=current,
            ),
        ),
        "model_query": emit.model_query(plan, current),
    }


def _staging(
    refresh: Refresh,
    pinned: dict[TableName, tables.SourceSnapshot],
    recorded: records.RecordedState | None,
) -> confs.Staging:
    """What a refresh now would stage (delta.confs.staging), the sources sized as it sizes them."""
    sized = {
        table: refresh.pins.complete(
            snapshot, recorded.sources.get(str(table)) if recorded else None, refresh.needs_size
        )
        for table, snapshot in pinned.items()
    }
    return confs.staging(sized)


def _source_lines(
    plan: ViewPlan, reflected: dict[TableName, int], current: dict[TableName, int]
) -> list[str]:
    lines = []
    for ref in plan.sources:
        table = ref.table
        upstream = plan.upstreams.get(table)
        kind = f"ivm model, read through {upstream.state}" if upstream else "Delta table"
        version = (
            f"state reflects version {reflected[table]}, now at {current[table]}"
            if table in reflected
            else f"now at version {current[table]} (not built yet)"
        )
        lines.append(f"    {ref.alias} = {table} ({kind}): {version}")
    return lines


def _delta_rule_lines(plan: ViewPlan) -> list[str]:
    """How the change is derived: set operands, join terms, outer/semi joins' key relations."""
    lines = []
    if top_k_buffer.keeps_best_rows(plan):
        assert plan.top_k is not None
        lines.append(
            f"  top-k: the state keeps the {top_k_buffer.rows_kept(plan.top_k):,} best rows "
            "(and any tied with the last); a change keeps its rows up to the state's worst "
            f"row while the view shows {plan.top_k.limit} or more, and one that may leave "
            "fewer recomputes the best rows from the query"
        )
    operands = changes.branches(plan)
    if len(operands) > 1:
        lines.append(f"  set operation: {len(operands)} operands; the change is the sum of theirs")
    if any(len(changes.branch_sources(operand)) > 1 for operand in operands):
        lines.append(
            "  join delta:   one term per changed input: its change rows against the "
            "inputs before it at their new version and after it at their recorded version"
        )
    if plan.join_terms:
        lines.append(
            f"  outer/semi/anti joins: rewritten as {len(plan.join_terms)} signed inner-join "
            "terms over key relations (the distinct keys that have a partner)"
        )
        relations_seen = {k.alias: k for t in plan.join_terms for k in t.key_relations}
        for relation in relations_seen.values():
            keys = ", ".join(k.sql(dialect=DIALECT) for k in relation.keys)
            condition = (
                f" where {relation.condition.sql(dialect=DIALECT)}" if relation.condition else ""
            )
            lines.append(
                f"    key relation {relation.alias}: distinct ({keys}) of "
                f"{relation.source.alias}{condition}"
            )
        # Semi and anti joins on conditions that compare the sides (rules/outer_joins.py).
        for partner in {f.alias: f for t in plan.join_terms for f in t.filters}.values():
            lines.append(
                f"    partner filter {partner.alias}: {'anti' if partner.anti else 'semi'} "
                f"join on {partner.condition.sql(dialect=DIALECT)}"
            )
    return lines


def _preaggregation_lines(plan: ViewPlan) -> list[str]:
    lines = []
    for pre in plan.preaggregations:
        kinds = ", ".join(
            kind if kind != "COUNT" else "COUNT(DISTINCT)" for _, kind in pre.recomputed
        )
        argument = plan.rows.expressions[_argument_position(plan, pre.argument)].this
        if pre.kept is not None:
            side = "smallest" if pre.bounded_kind == "MIN" else "largest"
            lines.append(
                f"  pre-aggregation (on the group row, {pre.values_column}): (value, count) of "
                f"{argument.sql(dialect=DIALECT)} for {kinds}, its {pre.kept} to "
                f"{2 * pre.kept} {side} values per group"
            )
            continue
        lines.append(
            f"  pre-aggregation (slot {pre.slot}): (group, value, count) of "
            f"{argument.sql(dialect=DIALECT)} for {kinds}"
        )
    return lines


def _argument_position(plan: ViewPlan, flat_name: str) -> int:
    return next(i for i, e in enumerate(plan.rows.expressions) if e.alias == flat_name)


def _state_size(refresh: Refresh, plan: ViewPlan) -> list[str]:
    columns, rows = refresh.runner.query(tables.describe_detail(refresh.state))
    detail = dict(zip(columns, rows[0]))
    lines = [
        f"  state table:  {detail.get('numFiles')} files, {detail.get('sizeInBytes')} bytes",
        f"    layout: {_layout_phrase(properties(refresh.runner, refresh.state))}",
    ]
    counted = _count_rows(refresh, plan)
    for label, count in counted:
        lines.append(f"    {label}: {count} rows")
    return lines


def _layout_phrase(shown: dict[str, str]) -> str:
    """How the state's rows lie in its files, by its properties (ivm_compiler/layout.py).

    >>> _layout_phrase({"spark_ivm.sort_key": "__ivm_g0", "delta.enableDeletionVectors": "true"})
    'sorted by __ivm_g0, with deletion vectors'
    >>> _layout_phrase({})
    'unsorted, without deletion vectors'
    """
    sort_key = shown.get(layout.SORT_KEY_PROPERTY)
    order = f"sorted by {sort_key}" if sort_key else "unsorted"
    vectors = "with" if tables.may_have_deletion_vectors(shown) else "without"
    return f"{order}, {vectors} deletion vectors"


def _count_rows(refresh: Refresh, plan: ViewPlan) -> list[tuple[str, int]]:
    state = refresh.state.sql()
    model_rows = f"`{names.GUARD}` IS NULL"  # the guard row is no model row
    if not plan.row_preaggregations:
        _, rows = refresh.runner.query(f"SELECT COUNT(*) FROM {state} WHERE {model_rows}")
        return [("group rows" if plan.keys else "rows", int(rows[0][0]))]
    _, rows = refresh.runner.query(
        f"SELECT `{names.SLOT}`, COUNT(*) FROM {state} WHERE {model_rows} "
        f"GROUP BY `{names.SLOT}` ORDER BY 1"
    )
    return [
        ("group rows" if int(slot) == 0 else f"pre-aggregation slot {int(slot)}", int(count))
        for slot, count in rows
    ]


def write_statements(explanation: Explanation, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, sql in explanation.statements.items():
        path = directory / f"{name}.sql"
        path.write_text(_pretty(sql) + "\n")
        written.append(path)
    (directory / "plan.txt").write_text(explanation.text + "\n")
    return written


def _pretty(sql: str) -> str:
    import sqlglot

    return sqlglot.transpile(sql, read=DIALECT, write=DIALECT, pretty=True)[0]
