"""MIN(x), MAX(x) and COUNT(DISTINCT x) through a pre-aggregation of (group, x, count).

None of the three is additive: deleting a group's current minimum, or the
last row carrying a value, cannot be applied to the stored result alone. The
state therefore also keeps, for each such argument x, one row per (group,
distinct non-NULL x) with the number of source rows carrying it (the
KV-store paper's PRE-AGGREGATION view). These rows live in the model's own
state table, told apart by names.SLOT, so one MERGE commits them together with
the group rows: a refresh can never leave the two disagreeing.

On refresh, for every group whose x-values changed, the new result is
recomputed from that group's pre-aggregation rows plus the change (never
from the sources), and the group row's RECOMPUTED columns take it.

build_query and change_query are the state queries of a plan with
pre-aggregations (state_rows.py has those of every other plan).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.changes import JoinReads, signed_rows
from ivm_compiler.plan import MergeRule, PreAggregation, StateColumn, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules.aggregates import ArgumentState
from ivm_compiler.sql import TableName, ident, union_all
from ivm_compiler.state_rows import (
    changing_columns,
    group_select,
    in_change_order,
    in_state_order,
    nonzero,
    rows_to_build,
)

# What each recomputed aggregate is over the surviving distinct values of a group.
_OVER_DISTINCT_VALUES = {"MIN": exp.Min, "MAX": exp.Max, "COUNT": exp.Count}
_STATE_NAMES = {"MIN": names.min_of, "MAX": names.max_of, "COUNT": names.distinct_count_of}
# The change query's CTE of the group rows' additive changes.
GROUP_CHANGES_CTE = f"{names.RESERVED_PREFIX}m"


def state_name(kind: str, argument_index: int) -> str:
    return _STATE_NAMES[kind](argument_index)


def columns(argument: ArgumentState, slot: int) -> tuple[list[StateColumn], PreAggregation]:
    """The group row's RECOMPUTED columns for one argument, and its pre-aggregation."""
    recomputed = []
    state_columns = []
    for kind in ("MIN", "MAX", "COUNT"):
        if kind not in argument.recomputed:
            continue
        name = state_name(kind, argument.index)
        if kind == "COUNT":
            build: exp.Expr = exp.Count(
                this=exp.Distinct(expressions=[argument.flat]), big_int=True
            )
        else:
            build = _OVER_DISTINCT_VALUES[kind](this=argument.flat)
        state_columns.append(
            StateColumn(
                name=name,
                rule=MergeRule.RECOMPUTED,
                build=build,
                # Filled in by the refresh from the pre-aggregation (change_query).
                change=exp.column(name, quoted=True),
                preaggregation=slot,
            )
        )
        recomputed.append((name, kind))
    preaggregation = PreAggregation(
        argument_index=argument.index,
        slot=slot,
        argument=names.argument(argument.index),
        value_column=names.preaggregated_value_of(argument.index),
        recomputed=tuple(recomputed),
        touched_flag=names.touched_flag_of(argument.index),
    )
    return state_columns, preaggregation


def over_surviving_values(kind: str, value: exp.Expr) -> exp.Expr:
    """The aggregate over a group's distinct values that still have rows after the change.

    `value` is NULL for values whose count fell to zero, so they are ignored.
    """
    if kind == "COUNT":
        return exp.Count(this=value, big_int=True)
    return _OVER_DISTINCT_VALUES[kind](this=value)


# -- the state queries -----------------------------------------------------------


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """The group rows (slot 0) and every pre-aggregation's (group, value, count) rows."""
    rows = rows_to_build(plan, versions, rows_filter)
    group_rows = group_select(plan, names.ROWS_ALIAS, from_changes=False)
    group_values = {e.alias: e.this for e in group_rows.expressions}
    group_values[names.SLOT] = exp.Literal.number(0)
    union = union_all(
        [
            group_rows.select(*in_state_order(plan, group_values), append=False),
            *[_preaggregation_rows(plan, pre) for pre in plan.preaggregations],
        ]
    )
    # Every part is built here for this query alone: assembled without copies.
    return (
        exp.select(exp.Star())
        .from_(union.subquery(ident(names.PREAGG_ALIAS), copy=False), copy=False)
        .with_(names.ROWS_ALIAS, as_=rows, copy=False)
    )


def _preaggregation_rows(plan: ViewPlan, pre: PreAggregation) -> exp.Select:
    value = exp.column(pre.argument, quoted=True)
    pre_values: dict[str, exp.Expr] = {k: exp.column(k, quoted=True) for k in plan.keys}
    pre_values[names.COUNT] = exp.Count(this=exp.Star(), big_int=True)
    pre_values[names.SLOT] = exp.Literal.number(pre.slot)
    pre_values[pre.value_column] = value.copy()
    return (
        exp.select(*in_state_order(plan, pre_values))
        .from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        .group_by(*[exp.column(k, quoted=True) for k in plan.keys], value.copy())
    )


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Per state row, the change: additive columns as differences, recomputed ones as values.

    One branch for the groups (their additive changes, and for each
    pre-aggregation its recomputed values and touched flag), one per
    pre-aggregation for its (group, value, count change) rows. The state is
    read only for the pre-aggregation rows of groups whose values changed.
    """
    changes = signed_rows(plan, ranges, bounds, join_reads)
    main = GROUP_CHANGES_CTE
    ctes: list[tuple[str, exp.Query]] = [
        (names.CHANGES_CTE, changes),
        (main, group_select(plan, names.CHANGES_CTE, from_changes=True)),
    ]
    changed_groups = [
        nonzero(
            [exp.column(c.name, table=ident(main), quoted=True) for c in changing_columns(plan)]
        )
    ]
    group_values: dict[str, exp.Expr] = {
        c.name: exp.column(c.name, table=ident(main), quoted=True)
        for c in plan.state_columns
        if c.rule is not MergeRule.RECOMPUTED
    }
    group_values[names.SLOT] = exp.Literal.number(0)
    groups = exp.select().from_(exp.to_table(main, quoted=True).as_(main, quoted=True))
    branches: list[exp.Select] = []
    for pre in plan.preaggregations:
        changes_cte = names.preaggregation_cte(pre.argument_index)
        recomputed_cte = names.recomputed_cte(pre.argument_index)
        ctes.append((changes_cte, _value_changes(plan, pre)))
        ctes.append((recomputed_cte, _recomputed(plan, pre, _new_counts(plan, pre, state))))
        groups = groups.join(
            exp.to_table(recomputed_cte, quoted=True).as_(recomputed_cte, quoted=True),
            on=_same_group(plan, main, recomputed_cte),
            join_type="LEFT",
        )
        touched_flag = exp.column(pre.touched_flag, table=ident(recomputed_cte), quoted=True)
        changed_groups.append(exp.Not(this=exp.Is(this=touched_flag.copy(), expression=exp.Null())))
        group_values[pre.touched_flag] = touched_flag
        group_values.update(_recomputed_values(pre, recomputed_cte))
        branches.append(_value_change_rows(plan, pre, changes_cte))
    group_branch = groups.select(*in_change_order(plan, group_values)).where(
        exp.or_(*changed_groups)
    )
    union = union_all([group_branch, *branches])
    # Every part is built here for this query alone: assembled without copies
    # (each with_ copied the query so far, every CTE before it included).
    select = exp.select(exp.Star()).from_(
        union.subquery(ident(names.PREAGG_ALIAS), copy=False), copy=False
    )
    for name, query in ctes:
        select = select.with_(name, as_=query, copy=False)
    return select


def _keys(plan: ViewPlan, table: str | None = None) -> list[exp.Column]:
    return [exp.column(k, table=ident(table) if table else None, quoted=True) for k in plan.keys]


def _same_group(plan: ViewPlan, left: str, right: str) -> exp.Expr:
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


def _value_changes(plan: ViewPlan, pre: PreAggregation) -> exp.Select:
    """(group, value, net count change) for the values this refresh touched."""
    value = exp.column(pre.argument, quoted=True)
    signed_count = exp.Sum(this=exp.column(names.SIGN, quoted=True))
    return (
        exp.select(
            *_keys(plan),
            exp.alias_(value.copy(), pre.value_column, quoted=True),
            exp.alias_(signed_count, names.COUNT, quoted=True),
        )
        .from_(exp.to_table(names.CHANGES_CTE, quoted=True))
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        .group_by(*_keys(plan), value.copy())
        .having(exp.NEQ(this=signed_count.copy(), expression=exp.Literal.number(0)))
    )


def _new_counts(plan: ViewPlan, pre: PreAggregation, state: TableName) -> exp.Select:
    """The touched groups' stored pre-aggregation rows plus the change: each value's new count."""
    changes_cte = names.preaggregation_cte(pre.argument_index)
    stored = (
        exp.select(
            *_keys(plan, "s"),
            exp.column(pre.value_column, table=ident("s"), quoted=True),
            exp.column(names.COUNT, table=ident("s"), quoted=True),
        )
        .from_(state.to_table().as_("s", quoted=True))
        .join(
            exp.to_table(changes_cte, quoted=True).as_("c", quoted=True),
            on=_same_group(plan, "s", "c"),
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
        *_keys(plan),
        exp.column(pre.value_column, quoted=True),
        exp.column(names.COUNT, quoted=True),
    ).from_(exp.to_table(changes_cte, quoted=True))
    return (
        exp.select(
            *_keys(plan),
            exp.column(pre.value_column, quoted=True),
            exp.alias_(
                exp.Sum(this=exp.column(names.COUNT, quoted=True)), names.COUNT, quoted=True
            ),
        )
        .from_(exp.union(stored, touched, distinct=False).subquery(ident("u")))
        .group_by(*_keys(plan), exp.column(pre.value_column, quoted=True))
    )


def _recomputed(plan: ViewPlan, pre: PreAggregation, new_counts: exp.Select) -> exp.Select:
    """Per touched group, each recomputed aggregate over the values still counted, and the flag."""
    surviving = exp.If(
        this=exp.GT(this=exp.column(names.COUNT, quoted=True), expression=exp.Literal.number(0)),
        true=exp.column(pre.value_column, quoted=True),
        false=exp.Null(),
    )
    recomputed = exp.select(
        *_keys(plan),
        *[
            exp.alias_(over_surviving_values(kind, surviving.copy()), name, quoted=True)
            for name, kind in pre.recomputed
        ],
        exp.alias_(exp.true(), pre.touched_flag, quoted=True),
    ).from_(new_counts.subquery(ident("n")))
    if plan.keys:
        return recomputed.group_by(*_keys(plan))
    # Without GROUP BY an aggregate answers one row even over no input;
    # the flag must say "touched" only when the refresh changed a value.
    return recomputed.having(
        exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
    )


def _recomputed_values(pre: PreAggregation, recomputed_cte: str) -> dict[str, exp.Expr]:
    """The group row's RECOMPUTED columns, read from the recomputation."""
    values: dict[str, exp.Expr] = {}
    for name, kind in pre.recomputed:
        value: exp.Expr = exp.column(name, table=ident(recomputed_cte), quoted=True)
        if kind == "COUNT":
            # A new group none of whose values is non-NULL has 0 distinct values.
            value = exp.Coalesce(this=value, expressions=[exp.Literal.number(0)])
        values[name] = value
    return values


def _value_change_rows(plan: ViewPlan, pre: PreAggregation, changes_cte: str) -> exp.Select:
    """The pre-aggregation's change rows: (group, slot, value, count change)."""
    pre_values: dict[str, exp.Expr] = {k: exp.column(k, quoted=True) for k in plan.keys}
    pre_values[names.COUNT] = exp.column(names.COUNT, quoted=True)
    pre_values[names.SLOT] = exp.Literal.number(pre.slot)
    pre_values[pre.value_column] = exp.column(pre.value_column, quoted=True)
    return exp.select(*in_change_order(plan, pre_values)).from_(
        exp.to_table(changes_cte, quoted=True)
    )
