"""The state table's rows: its columns, and the state built or changed from flattened rows.

A state row is one group of the flattened rows (GROUP BY the plan's keys);
each state column says how it is computed (plan.StateColumn: its build and
change expressions, its MergeRule). build_query computes every state row from
the model's rows at pinned versions (first build, full refresh, a window's
touched partitions); change_query computes, per state row, the change one
refresh applies, from the rows' signed change (changes.py). These are the
queries of every plan without pre-aggregations; rules/extremes.py builds and
changes those (view_classes/aggregate.py picks which).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.changes import JoinReads, rows_at, signed_rows
from ivm_compiler.plan import MergeRule, StateColumn, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.sql import TableName


def state_table_columns(plan: ViewPlan) -> list[str]:
    """Every column of the state table, in order: group rows' columns, then pre-aggregation rows'."""
    columns = [c.name for c in plan.state_columns if c.rule is not MergeRule.CHANGE_ONLY]
    if plan.row_preaggregations:
        columns.append(names.SLOT)
        columns.extend(p.value_column for p in plan.row_preaggregations)
    return columns


def change_columns(plan: ViewPlan) -> list[str]:
    """The change query's columns: the state table's, those of change rows only, touched flags.

    With a bounded pre-aggregation, also names.EXHAUSTED (rules/extremes.py).
    """
    change_only = [c.name for c in plan.state_columns if c.rule is MergeRule.CHANGE_ONLY]
    flags = [p.touched_flag for p in plan.preaggregations]
    if any(p.kept is not None for p in plan.preaggregations):
        flags.append(names.EXHAUSTED)
    return state_table_columns(plan) + change_only + flags


def in_state_order(plan: ViewPlan, values: Mapping[str, exp.Expr]) -> list[exp.Expr]:
    """One SELECT list in the state table's column order; unnamed columns are NULL."""
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True)
        for name in state_table_columns(plan)
    ]


def in_change_order(plan: ViewPlan, values: Mapping[str, exp.Expr]) -> list[exp.Expr]:
    """One SELECT list in the change query's column order; unnamed columns are NULL."""
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True) for name in change_columns(plan)
    ]


def changing_columns(plan: ViewPlan) -> list[StateColumn]:
    """The columns whose change is computed from the change rows alone (not RECOMPUTED).

    A group whose values here are all 0 or NULL did not change.
    """
    return [c for c in plan.state_columns if c.rule not in (MergeRule.KEY, MergeRule.RECOMPUTED)]


def group_select(plan: ViewPlan, rows: str, from_changes: bool) -> exp.Select:
    """One row per group of `rows` (a CTE's name): each state column's build or change value.

    RECOMPUTED columns have no change value here (rules/extremes.py), and
    CHANGE_ONLY columns no build value.
    """
    values = [(c.name, c.change if from_changes else c.build) for c in plan.state_columns]
    columns = [
        exp.alias_(value.copy(), name, quoted=True, copy=False)
        for (name, value), c in zip(values, plan.state_columns)
        if value is not None and not (from_changes and c.rule is MergeRule.RECOMPUTED)
    ]
    select = exp.select(*columns).from_(exp.to_table(rows, quoted=True))
    if plan.keys:
        select = select.group_by(*[exp.column(k, quoted=True) for k in plan.keys])
    return select


def nonzero(columns: list[exp.Expr]) -> exp.Expr:
    """Some column is neither 0 nor NULL: the group's change is not empty.

    >>> nonzero([exp.column("a"), exp.column("b")]).sql(dialect="spark")
    'COALESCE(a, 0) <> 0 OR COALESCE(b, 0) <> 0'
    """
    return exp.or_(
        *[
            exp.NEQ(
                this=exp.Coalesce(this=c, expressions=[exp.Literal.number(0)]),
                expression=exp.Literal.number(0),
            )
            for c in columns
        ]
    )


def rows_to_build(
    plan: ViewPlan, versions: Mapping[TableName, int], rows_filter: exp.Expr | None
) -> exp.Query:
    """The flattened rows at pinned versions, with `rows_filter` added to their WHERE."""
    rows = rows_at(plan, versions)
    if rows_filter is not None:
        assert isinstance(rows, exp.Select), "a filter applies to one SELECT"
        rows = rows.where(rows_filter.copy())
    return rows


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """The whole state computed from the sources at pinned versions (first build, full refresh).

    `rows_filter` is added to the WHERE of the flattened rows (a WINDOW
    model's refresh recomputes the touched partitions only).
    """
    rows = rows_to_build(plan, versions, rows_filter)
    # Both built for this query alone: joined without copies.
    return group_select(plan, names.ROWS_ALIAS, from_changes=False).with_(
        names.ROWS_ALIAS, as_=rows, copy=False
    )


def ungrouped_build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """Each flattened row as a state row counted once, without grouping equal rows.

    For a projection kept as a log (log_state.py): its readers and its view
    sum a key's rows, so equal rows need not be one row yet, and the first
    build is the model's query with a count column, where grouping shuffled
    the whole table (the warehouse's order lines). For rows that cannot be
    equal (view_classes/window.py, one_row_per_key): each is its own group.
    """
    rows = rows_to_build(plan, versions, rows_filter)
    values = {
        c.name: exp.cast(exp.Literal.number(1), "BIGINT") if c.name == names.COUNT else c.build
        for c in plan.state_columns
    }
    columns = [
        exp.alias_(value.copy(), name, quoted=True, copy=False)
        for name, value in values.items()
        if value is not None
    ]
    return (
        exp.select(*columns)
        .from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
        .with_(names.ROWS_ALIAS, as_=rows, copy=False)
    )


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Per state row, the change to apply: each additive column's difference.

    Rows whose changes cancel out (a row inserted then deleted, an update that
    moved nothing the model reads) are dropped here, so they cost no MERGE
    work. The state itself is not read (`state` is for plans whose change
    reads it: rules/extremes.py).
    """
    changes = signed_rows(plan, ranges, bounds, join_reads)
    select = group_select(plan, names.CHANGES_CTE, from_changes=True).having(
        nonzero([c.change.copy() for c in changing_columns(plan)]), copy=False
    )
    # Both built for this query alone: joined without copies.
    return select.with_(names.CHANGES_CTE, as_=changes, copy=False)
