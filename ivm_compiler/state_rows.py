"""The state table's rows: its columns, and the queries that compute them from flattened rows.

build_query computes every state row from the model's rows at pinned
versions (first build, full refresh, a window's touched partitions);
change_query computes, per state row, the change a refresh applies from the
rows' signed change (changes.py). Each state column says how (plan.StateColumn:
its build and change expressions, its MergeRule).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.changes import JoinReads, rows_at, signed_rows
from ivm_compiler.plan import MergeRule, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import extremes
from ivm_compiler.sql import TableName, ident


def _group_select(plan: ViewPlan, rows: str, from_changes: bool) -> exp.Select:
    columns = [
        exp.alias_((c.change if from_changes else c.build).copy(), c.name, quoted=True)
        for c in plan.state_columns
        if not (from_changes and c.rule is MergeRule.RECOMPUTED)
    ]
    select = exp.select(*columns).from_(exp.to_table(rows, quoted=True))
    if plan.keys:
        select = select.group_by(*[exp.column(k, quoted=True) for k in plan.keys])
    return select


def _in_state_order(plan: ViewPlan, values: Mapping[str, exp.Expression]) -> list[exp.Expression]:
    """One SELECT list in the state table's column order; unnamed columns are NULL."""
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True)
        for name in state_table_columns(plan)
    ]


def state_table_columns(plan: ViewPlan) -> list[str]:
    """Every column of the state table, in order: group rows' columns, then pre-aggregations'."""
    columns = [c.name for c in plan.state_columns]
    if plan.preaggregations:
        columns.append(names.SLOT)
        columns.extend(p.value_column for p in plan.preaggregations)
    return columns


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expression | None = None,
) -> exp.Query:
    """The whole state computed from the sources at pinned versions (first build, full refresh).

    `rows_filter` is added to the WHERE of the flattened rows (a WINDOW
    model's refresh recomputes the touched partitions only).
    """
    rows = rows_at(plan, versions)
    if rows_filter is not None:
        assert isinstance(rows, exp.Select), "a filter applies to one SELECT"
        rows = rows.where(rows_filter.copy())
    if not plan.preaggregations:
        return _group_select(plan, names.ROWS_ALIAS, from_changes=False).with_(
            names.ROWS_ALIAS, as_=rows
        )
    group_rows = _group_select(plan, names.ROWS_ALIAS, from_changes=False)
    group_values = {e.alias: e.this for e in group_rows.expressions}
    group_values[names.SLOT] = exp.Literal.number(0)
    union: exp.Query = group_rows.select(*_in_state_order(plan, group_values), append=False)
    for pre in plan.preaggregations:
        value = exp.column(pre.argument, quoted=True)
        pre_values: dict[str, exp.Expression] = {k: exp.column(k, quoted=True) for k in plan.keys}
        pre_values[names.COUNT] = exp.Count(this=exp.Star(), big_int=True)
        pre_values[names.SLOT] = exp.Literal.number(pre.slot)
        pre_values[pre.value_column] = value.copy()
        pre_rows = (
            exp.select(*_in_state_order(plan, pre_values))
            .from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
            .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
            .group_by(*[exp.column(k, quoted=True) for k in plan.keys], value.copy())
        )
        union = exp.union(union, pre_rows, distinct=False)
    return (
        exp.select(exp.Star())
        .from_(union.subquery(ident(names.PREAGG_ALIAS)))
        .with_(names.ROWS_ALIAS, as_=rows)
    )


def _nonzero(columns: list[exp.Expression]) -> exp.Expression:
    return exp.or_(
        *[
            exp.NEQ(
                this=exp.Coalesce(this=c, expressions=[exp.Literal.number(0)]),
                expression=exp.Literal.number(0),
            )
            for c in columns
        ]
    )


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Per state row, the change to apply: additive columns as differences, recomputed ones as values.

    Rows whose changes cancel out (a row inserted then deleted, an update that
    moved nothing the model reads) are dropped here, so they cost no MERGE work.
    The state table itself is read only for the pre-aggregation rows of groups
    whose values changed.
    """
    changes = signed_rows(plan, ranges, bounds, join_reads)
    additive = [c for c in plan.value_columns if c.rule is not MergeRule.RECOMPUTED]
    if not plan.preaggregations:
        select = _group_select(plan, names.CHANGES_CTE, from_changes=True).having(
            _nonzero([c.change.copy() for c in additive])
        )
        return select.with_(names.CHANGES_CTE, as_=changes)

    def key_columns(table: str | None = None) -> list[exp.Column]:
        return [
            exp.column(k, table=ident(table) if table else None, quoted=True) for k in plan.keys
        ]

    def same_group(left: str, right: str) -> exp.Expression:
        if not plan.keys:
            return exp.true()
        return exp.and_(
            *[
                exp.NullSafeEQ(
                    this=exp.column(k, table=ident(left), quoted=True),
                    expression=exp.column(k, table=ident(right), quoted=True),
                )
                for k in plan.keys
            ]
        )

    ctes: list[tuple[str, exp.Query]] = [(names.CHANGES_CTE, changes)]
    group_changes = _group_select(plan, names.CHANGES_CTE, from_changes=True)
    main = "__ivm_m"
    ctes.append((main, group_changes))
    changed_groups = [
        _nonzero([exp.column(c.name, table=ident(main), quoted=True) for c in additive])
    ]
    group_values: dict[str, exp.Expression] = {
        c.name: exp.column(c.name, table=ident(main), quoted=True)
        for c in plan.state_columns
        if c.rule is not MergeRule.RECOMPUTED
    }
    group_values[names.SLOT] = exp.Literal.number(0)
    group_select = exp.select().from_(exp.to_table(main, quoted=True).as_(main, quoted=True))
    branches: list[exp.Select] = []

    for pre in plan.preaggregations:
        value = exp.column(pre.argument, quoted=True)
        changes_cte = names.preaggregation_cte(pre.argument_index)
        recomputed_cte = names.recomputed_cte(pre.argument_index)
        signed_count = exp.Sum(this=exp.column(names.SIGN, quoted=True))
        # (group, value, net count change) for the values this refresh touched.
        ctes.append(
            (
                changes_cte,
                exp.select(
                    *key_columns(),
                    exp.alias_(value.copy(), pre.value_column, quoted=True),
                    exp.alias_(signed_count, names.COUNT, quoted=True),
                )
                .from_(exp.to_table(names.CHANGES_CTE, quoted=True))
                .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
                .group_by(*key_columns(), value.copy())
                .having(exp.NEQ(this=signed_count.copy(), expression=exp.Literal.number(0))),
            )
        )
        # The touched groups' stored pre-aggregation rows, plus the change: each
        # distinct value's new count; values whose count reaches zero drop out.
        stored = (
            exp.select(
                *key_columns("s"),
                exp.column(pre.value_column, table=ident("s"), quoted=True),
                exp.column(names.COUNT, table=ident("s"), quoted=True),
            )
            .from_(state.to_table().as_("s", quoted=True))
            .join(
                exp.to_table(changes_cte, quoted=True).as_("c", quoted=True),
                on=same_group("s", "c"),
                join_type="LEFT SEMI",
            )
            .where(
                exp.EQ(
                    this=exp.column(names.SLOT, table=ident("s"), quoted=True),
                    expression=exp.Literal.number(pre.slot),
                )
            )
        )
        touched = exp.select(
            *key_columns(),
            exp.column(pre.value_column, quoted=True),
            exp.column(names.COUNT, quoted=True),
        ).from_(exp.to_table(changes_cte, quoted=True))
        new_counts = (
            exp.select(
                *key_columns(),
                exp.column(pre.value_column, quoted=True),
                exp.alias_(
                    exp.Sum(this=exp.column(names.COUNT, quoted=True)), names.COUNT, quoted=True
                ),
            )
            .from_(exp.union(stored, touched, distinct=False).subquery(ident("u")))
            .group_by(*key_columns(), exp.column(pre.value_column, quoted=True))
        )
        surviving = exp.If(
            this=exp.GT(
                this=exp.column(names.COUNT, quoted=True), expression=exp.Literal.number(0)
            ),
            true=exp.column(pre.value_column, quoted=True),
            false=exp.Null(),
        )
        recomputed = exp.select(
            *key_columns(),
            *[
                exp.alias_(
                    extremes.over_surviving_values(kind, surviving.copy()), name, quoted=True
                )
                for name, kind in pre.recomputed
            ],
            exp.alias_(exp.true(), pre.touched_flag, quoted=True),
        ).from_(new_counts.subquery(ident("n")))
        if plan.keys:
            recomputed = recomputed.group_by(*key_columns())
        else:
            # Without GROUP BY an aggregate answers one row even over no input;
            # the flag must say "touched" only when the refresh changed a value.
            recomputed = recomputed.having(
                exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
            )
        ctes.append((recomputed_cte, recomputed))

        group_select = group_select.join(
            exp.to_table(recomputed_cte, quoted=True).as_(recomputed_cte, quoted=True),
            on=same_group(main, recomputed_cte),
            join_type="LEFT",
        )
        touched_flag = exp.column(pre.touched_flag, table=ident(recomputed_cte), quoted=True)
        changed_groups.append(exp.Not(this=exp.Is(this=touched_flag.copy(), expression=exp.Null())))
        group_values[pre.touched_flag] = touched_flag
        for name, kind in pre.recomputed:
            recomputed_value: exp.Expression = exp.column(
                name, table=ident(recomputed_cte), quoted=True
            )
            if kind == "COUNT":
                # A new group none of whose values is non-NULL has 0 distinct values.
                recomputed_value = exp.Coalesce(
                    this=recomputed_value, expressions=[exp.Literal.number(0)]
                )
            group_values[name] = recomputed_value

        pre_values: dict[str, exp.Expression] = {k: exp.column(k, quoted=True) for k in plan.keys}
        pre_values[names.COUNT] = exp.column(names.COUNT, quoted=True)
        pre_values[names.SLOT] = exp.Literal.number(pre.slot)
        pre_values[pre.value_column] = exp.column(pre.value_column, quoted=True)
        branches.append(
            exp.select(*_in_change_order(plan, pre_values)).from_(
                exp.to_table(changes_cte, quoted=True)
            )
        )

    group_branch = group_select.select(*_in_change_order(plan, group_values)).where(
        exp.or_(*changed_groups)
    )
    union: exp.Query = group_branch
    for branch in branches:
        union = exp.union(union, branch, distinct=False)
    select = exp.select(exp.Star()).from_(union.subquery(ident(names.PREAGG_ALIAS)))
    for name, query in ctes:
        select = select.with_(name, as_=query)
    return select


def change_columns(plan: ViewPlan) -> list[str]:
    """The change query's columns: the state table's, then each pre-aggregation's touched flag."""
    return state_table_columns(plan) + [p.touched_flag for p in plan.preaggregations]


def _in_change_order(plan: ViewPlan, values: Mapping[str, exp.Expression]) -> list[exp.Expression]:
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True) for name in change_columns(plan)
    ]
