"""MIN(x), MAX(x) and COUNT(DISTINCT x) through a pre-aggregation of (group, x, count).

None of the three is additive: deleting a group's current minimum, or the
last row carrying a value, cannot be applied to the stored result alone. The
state therefore also keeps, for each such argument x, the (distinct non-NULL
x, count) pairs of each group, the count the number of source rows carrying
it (the KV-store paper's PRE-AGGREGATION view): as one row per pair, told
apart from the group rows by names.SLOT, or for a bounded MIN or MAX (below)
as an array of the pairs on the group's row. Either way they live in the
model's own state table, so one MERGE commits them together with the group
rows: a refresh can never leave the two disagreeing.

On refresh, for every group whose x-values changed, the new result is
recomputed from that group's pre-aggregation rows plus the change (never
from the sources), and the group row's RECOMPUTED columns take it.

Bounded pre-aggregations. Keeping every distinct value makes the state as
large as the source (per supplier and ship date: 27 M rows for a table of
60 k groups). A MIN or MAX whose argument no COUNT(DISTINCT) also reads keeps
instead, per kind, only the group's most extreme values (top-k view
maintenance: Yi et al., "Efficient maintenance of materialized top-k
views"), as an array on the group's row (plan.PreAggregation.values_column;
a row per value made the state many times the groups, and each refresh
ranked the touched groups' rows with windows), under one invariant: every value of the group on the kept side of
the largest kept one (for MIN; the smallest for MAX) is kept, with its exact
count. So the kept set's best value is the group's, and
- a change's value on the kept side of that edge, or any value while the
  set holds all of the group's values (its counts add up to the group's
  non-NULL count), is counted in; a value past the edge is left out, and
  its deletion touches nothing kept;
- past 2k kept values the set is cut back to the best k;
- a set emptied while the group still has values ("exhausted") cannot say
  the new extreme: the MERGE then fails having written nothing
  (emit.EXHAUSTED) and the refresh runs it again with `refill` versions,
  reading those groups' best k values from the sources at those versions.
A change that removes only values past the edge, the common case, never
reads the sources. `kept=None` (the model's `ivm_extreme_values='all'`)
keeps every value, as COUNT(DISTINCT) must.

build_query and change_query are the state queries of a plan with
pre-aggregations (state_rows.py has those of every other plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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


# The most extreme values a bounded MIN or MAX keeps per group unless the
# model sets ivm_extreme_values: a change must delete all of them before the
# sources are read again, while the state stays a few rows per group.
KEPT_VALUES = 16


def bounded(argument: ArgumentState, kept: int | None) -> bool:
    """Whether the argument's MIN and MAX keep `kept` values each (COUNT(DISTINCT) needs all)."""
    return kept is not None and bool(argument.recomputed) and "COUNT" not in argument.recomputed


def columns(
    argument: ArgumentState, first_slot: int, kept: int | None = None
) -> tuple[list[StateColumn], list[PreAggregation]]:
    """The group row's RECOMPUTED columns for one argument, and its pre-aggregations.

    One pre-aggregation of every distinct value, or with `kept` (and no
    COUNT(DISTINCT) of the argument) one bounded pre-aggregation per MIN
    and MAX, in that order, from `first_slot` on.
    """
    kinds = [k for k in ("MIN", "MAX", "COUNT") if k in argument.recomputed]
    if not bounded(argument, kept):
        groups: list[tuple[list[str], str | None]] = [(kinds, None)]
    else:
        groups = [([kind], kind) for kind in kinds]
    state_columns: list[StateColumn] = []
    preaggregations: list[PreAggregation] = []
    for offset, (group_kinds, bounded_kind) in enumerate(groups):
        slot = first_slot + offset
        recomputed = []
        for kind in group_kinds:
            name = state_name(kind, argument.index)
            if kind == "COUNT":
                build: exp.Expr = exp.Count(
                    this=exp.Distinct(expressions=[argument.flat]), big_int=True
                )
            else:
                build = _OVER_DISTINCT_VALUES[kind](this=argument.flat)
            state_columns.append(_recomputed_column(name, build, slot))
            recomputed.append((name, kind))
        if bounded_kind is not None:
            # Its kept values: built beside the group rows (build_query), refreshed with it.
            values = names.kept_values_of(argument.index, bounded_kind)
            state_columns.append(_recomputed_column(values, None, slot))
        preaggregations.append(
            PreAggregation(
                argument_index=argument.index,
                slot=slot,
                argument=names.argument(argument.index),
                value_column=names.preaggregated_value_of(argument.index, bounded_kind),
                recomputed=tuple(recomputed),
                touched_flag=names.touched_flag_of(argument.index, bounded_kind),
                kept=kept if bounded_kind else None,
            )
        )
    return state_columns, preaggregations


def _recomputed_column(name: str, build: exp.Expr | None, slot: int) -> StateColumn:
    """A column of the group row the refresh fills in from the pre-aggregation (change_query)."""
    return StateColumn(
        name=name,
        rule=MergeRule.RECOMPUTED,
        build=build,
        change=exp.column(name, quoted=True),
        preaggregation=slot,
    )


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
    """The group rows (slot 0, with the bounded pre-aggregations' kept values) and every
    other pre-aggregation's (group, value, count) rows."""
    rows = rows_to_build(plan, versions, rows_filter)
    union = union_all(
        [
            _group_rows(plan),
            *[_preaggregation_rows(plan, pre) for pre in plan.row_preaggregations],
        ]
    )
    # Every part is built here for this query alone: assembled without copies.
    return (
        exp.select(exp.Star())
        .from_(union.subquery(ident(names.PREAGG_ALIAS), copy=False), copy=False)
        .with_(names.ROWS_ALIAS, as_=rows, copy=False)
    )


_GROUPS_ALIAS = f"{names.RESERVED_PREFIX}groups"


def _group_rows(plan: ViewPlan) -> exp.Select:
    """Each group's row of the flattened rows (names.ROWS_ALIAS), its kept values joined on."""
    grouped = group_select(plan, names.ROWS_ALIAS, from_changes=False)
    bounded = [p for p in plan.preaggregations if p.kept is not None]
    if not bounded:
        values = {e.alias: e.this for e in grouped.expressions}
        values[names.SLOT] = exp.Literal.number(0)
        return grouped.select(*in_state_order(plan, values), append=False)
    values = {e.alias: _column(e.alias, _GROUPS_ALIAS) for e in grouped.expressions}
    values[names.SLOT] = exp.Literal.number(0)
    select = exp.select().from_(grouped.subquery(ident(_GROUPS_ALIAS)))
    everything = exp.select(exp.Star()).from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
    for together in _bounded_by_argument(bounded):
        alias = f"{names.RESERVED_PREFIX}best_s{together[0].slot}"
        select = select.join(
            _kept_per_group(plan, together, everything.copy()).subquery(ident(alias)),
            on=_same_group(plan, _GROUPS_ALIAS, alias),
            join_type="LEFT",
        )
        for pre in together:
            values[pre.values_column] = _column(pre.values_column, alias)
    return select.select(*in_state_order(plan, values))


def _bounded_by_argument(bounded: list[PreAggregation]) -> list[list[PreAggregation]]:
    """The bounded pre-aggregations, a MIN and a MAX of one argument together."""
    together: dict[int, list[PreAggregation]] = {}
    for pre in bounded:
        together.setdefault(pre.argument_index, []).append(pre)
    return list(together.values())


def _kept_per_group(plan: ViewPlan, together: list[PreAggregation], rows: exp.Select) -> exp.Select:
    """Per group of `rows`, the array of kept values of each of `together` (one argument's).

    Each group's distinct values are counted, then ranked once. A MIN and a
    MAX of one argument share that ranking: ranked ascending beside the
    group's number of distinct values, the largest are those ranked within
    `kept` of that number. Measured at TPC-H SF 5 (2026-12-06, the same
    arrays): `l_shipdate` per supplier alone (bench/micro/extremes_pair_build.py)
    40.3-44.2 s where one ranking per side took 58.0-80.0 s; the whole
    build query of `lineitem_supplier_extremes` 63 s where 80-92 s, though
    its dbt build (72-83 s in three runs, 81 s before) moved within its
    spread (docs/performance.md, Open work 4).
    """
    argument = _column(together[0].argument)
    lone = together[0] if len(together) == 1 else None
    descending = lone is not None and lone.bounded_kind == "MAX"
    ranked = _ranked_values(
        plan,
        argument,
        rows,
        [exp.alias_(argument.copy(), pre.value_column, quoted=True) for pre in together],
        descending,
    )
    rank = _column(_RANK)
    keeps: dict[str, exp.Expr] = {}
    if lone is not None:
        keeps[lone.values_column] = exp.LTE(this=rank, expression=exp.Literal.number(lone.kept))
    else:
        total = exp.Window(this=exp.Count(this=exp.Star()), partition_by=_keys(plan) or None)
        ranked = ranked.select(exp.alias_(total, _DISTINCT_VALUES, quoted=True))
        from_last = exp.Sub(this=_column(_DISTINCT_VALUES), expression=rank.copy())
        for pre in together:
            kept = exp.Literal.number(pre.kept)
            if pre.bounded_kind == "MIN":
                keeps[pre.values_column] = exp.LTE(this=rank.copy(), expression=kept)
            else:
                keeps[pre.values_column] = exp.LT(this=from_last.copy(), expression=kept)
    select = (
        exp.select(
            *_keys(plan),
            *[
                exp.alias_(
                    _kept_array(pre, None if lone else keeps[pre.values_column]),
                    pre.values_column,
                    quoted=True,
                )
                for pre in together
            ],
        )
        .from_(ranked.subquery(ident(_RANKED_ALIAS)))
        .where(exp.or_(*keeps.values()))
    )
    return select.group_by(*_keys(plan)) if plan.keys else select


def _kept_array(pre: PreAggregation, keeps: exp.Expr | None = None) -> exp.Expr:
    """The (value, count) pairs of the rows (where `keeps` holds), as one array, smallest first.

    Sorted so that equal sets are equal arrays (a recompute merged by key,
    emit.merge_recomputed, rewrites only the rows whose columns differ);
    which end is the extreme is the pre-aggregation's kind, read by the
    refresh with the values exploded.
    """
    pair = exp.Struct(
        expressions=[
            exp.PropertyEQ(this=ident(names.KEPT_VALUE), expression=_column(pre.value_column)),
            exp.PropertyEQ(this=ident(names.KEPT_COUNT), expression=_column(names.COUNT)),
        ]
    )
    kept = pair if keeps is None else exp.If(this=keeps, true=pair, false=exp.null())
    collected = exp.ArrayAgg(this=kept)
    collected.set("nulls_excluded", True)
    return exp.ArraySort(this=collected)


def _preaggregation_rows(plan: ViewPlan, pre: PreAggregation) -> exp.Select:
    """(group, value, count) of the flattened rows (names.ROWS_ALIAS) for an unbounded one."""
    assert pre.kept is None
    value = exp.column(pre.argument, quoted=True)
    pre_values: dict[str, exp.Expr] = {k: exp.column(k, quoted=True) for k in plan.keys}
    pre_values[names.SLOT] = exp.Literal.number(pre.slot)
    pre_values[names.COUNT] = exp.Count(this=exp.Star(), big_int=True)
    pre_values[pre.value_column] = value.copy()
    return (
        exp.select(*in_state_order(plan, pre_values))
        .from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        .group_by(*[exp.column(k, quoted=True) for k in plan.keys], value.copy())
    )


def _best_rows(plan: ViewPlan, pre: PreAggregation, rows: exp.Select) -> exp.Select:
    """(group keys, count, value) of each group's `pre.kept` best distinct values among `rows`."""
    assert pre.kept is not None
    argument = _column(pre.argument)
    ranked = _ranked_values(plan, argument, rows, [argument.copy()], pre.bounded_kind == "MAX")
    return (
        exp.select(
            *_keys(plan),
            _column(names.COUNT),
            exp.alias_(argument.copy(), pre.value_column, quoted=True),
        )
        .from_(ranked.subquery(ident(_RANKED_ALIAS)))
        .where(exp.LTE(this=_column(_RANK), expression=exp.Literal.number(pre.kept)))
    )


def _ranked_values(
    plan: ViewPlan,
    argument: exp.Column,
    rows: exp.Select,
    values: list[exp.Expr],
    descending: bool,
) -> exp.Select:
    """Each group's distinct values of `argument` among `rows` (as `values` select them), with
    their count and their place in the group (`_RANK`, the smallest first unless `descending`)."""
    return exp.select(
        *_keys(plan),
        *values,
        _column(names.COUNT),
        exp.alias_(_ranked(plan, argument, descending), _RANK, quoted=True),
    ).from_(_counted_values(plan, argument, rows).subquery(ident(_GROUP_VALUES_ALIAS)))


def _counted_values(plan: ViewPlan, argument: exp.Column, rows: exp.Select) -> exp.Select:
    """(group keys, value, count) of the distinct non-NULL values of `argument` among `rows`.

    Counted before ranking: a hash aggregate, partial ahead of its shuffle,
    turns the rows into (group, value, count), and each group's values are
    then ranked (distinct per group, so ROW_NUMBER ranks as DENSE_RANK
    would). Ranking the rows first made every row go through a sort, each
    MIN and MAX through its own; replayed warm on the layered warehouse
    (scale 1500, 2026-12-05), `mart_category_sales`' build (MIN and MAX per
    category over 4.5 M order lines) took 11.0-12.1 s where 16.4-19.4, the
    same build grouped per product 26.0-27.7 s where 25.3-27.6, and TPC-H
    SF 1's `lineitem_supplier_extremes` kept values 11.8-12.9 s where
    14.6-15.7, the same rows each time.
    """
    return (
        exp.select(
            *_keys(plan),
            argument.copy(),
            exp.alias_(exp.Count(this=exp.Star(), big_int=True), names.COUNT, quoted=True),
        )
        .from_(rows.subquery(ident(_ROWS_ALIAS)))
        .where(exp.Not(this=exp.Is(this=argument.copy(), expression=exp.Null())))
        .group_by(*_keys(plan), argument.copy())
    )


def _ranked(plan: ViewPlan, argument: exp.Column, descending: bool) -> exp.Window:
    """Each distinct value's place in its group, the smallest first (the largest if `descending`)."""
    return exp.Window(
        this=exp.RowNumber(),
        partition_by=_keys(plan) or None,
        order=exp.Order(expressions=[exp.Ordered(this=argument.copy(), desc=descending)]),
    )


def _rank(plan: ViewPlan, pre: PreAggregation, first: exp.Expr | None = None) -> exp.Window:
    """Each value's place in its group, the most extreme first (after `first`, TRUE first)."""
    value = exp.Ordered(
        this=exp.column(pre.value_column, quoted=True), desc=pre.bounded_kind == "MAX"
    )
    order = [exp.Ordered(this=first, desc=True), value] if first is not None else [value]
    return exp.Window(
        this=exp.RowNumber(),
        partition_by=_keys(plan) or None,
        order=exp.Order(expressions=order),
    )


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
    refill: Mapping[TableName, int] | None = None,
) -> exp.Query:
    """Per state row, the change: additive columns as differences, recomputed ones as values.

    One branch for the groups (their additive changes, and for each
    pre-aggregation its recomputed values and touched flag), one per
    pre-aggregation for its (group, value, count change) rows. The state is
    read only for the pre-aggregation rows of groups whose values changed.
    `refill`: the pinned versions, at which the groups whose bounded
    pre-aggregations ran out (names.EXHAUSTED) take their best values from
    the sources (module docstring); without it the group rows say which ran out.
    """
    parts = _group_parts(plan, signed_rows(plan, ranges, bounds, join_reads), refill)
    for pre in plan.preaggregations:
        _add_preaggregation(parts, plan, pre, state, refill is not None)
    return _assembled(plan, parts)


@dataclass
class _ChangeQueryParts:
    """What change_query assembles: its CTEs in order, the group branch's joins, values and
    filter, the pre-aggregations' branches, and the bounded ones' ran-out conditions."""

    ctes: list[tuple[str, exp.Query]]
    groups: exp.Select
    group_values: dict[str, exp.Expr]
    changed_groups: list[exp.Expr]
    branches: list[exp.Select] = field(default_factory=list)
    exhausted: list[exp.Expr] = field(default_factory=list)

    def join_per_group(self, plan: ViewPlan, cte: str) -> None:
        """LEFT JOIN a CTE of one row per group to the group branch."""
        self.groups = self.groups.join(
            exp.to_table(cte, quoted=True).as_(cte, quoted=True),
            on=_same_group(plan, GROUP_CHANGES_CTE, cte),
            join_type="LEFT",
        )


def _group_parts(
    plan: ViewPlan, changes: exp.Query, refill: Mapping[TableName, int] | None
) -> _ChangeQueryParts:
    """The change rows, the groups' additive changes, and (refilling) the rows at `refill`."""
    main = GROUP_CHANGES_CTE
    ctes: list[tuple[str, exp.Query]] = [
        (names.CHANGES_CTE, changes),
        (main, group_select(plan, names.CHANGES_CTE, from_changes=True)),
    ]
    if refill is not None:
        ctes.append((names.ROWS_ALIAS, rows_to_build(plan, refill, None)))
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
    return _ChangeQueryParts(ctes, groups, group_values, changed_groups)


def _add_preaggregation(
    parts: _ChangeQueryParts,
    plan: ViewPlan,
    pre: PreAggregation,
    state: TableName,
    refilling: bool,
) -> None:
    """A pre-aggregation's value changes, its recomputed values on the group branch, its rows."""
    kind = pre.bounded_kind
    changes_cte = names.preaggregation_cte(pre.argument_index, kind)
    recomputed_cte = names.recomputed_cte(pre.argument_index, kind)
    parts.ctes.append((changes_cte, _value_changes(plan, pre)))
    if kind is None:
        recomputed = (
            _recounted(plan, pre, state)
            if _counts_distinct_only(pre)
            else _recomputed(plan, pre, _new_counts(plan, pre, state))
        )
        parts.ctes.append((recomputed_cte, recomputed))
        parts.branches.append(_value_change_rows(plan, pre, changes_cte))
    else:
        kept_cte = names.kept_values_cte(pre.argument_index, kind)
        parts.ctes.append((kept_cte, _kept_values(plan, pre, state)))
        parts.ctes.append((recomputed_cte, _recomputed_kept(plan, pre, kept_cte)))
    parts.join_per_group(plan, recomputed_cte)
    touched_flag = exp.column(pre.touched_flag, table=ident(recomputed_cte), quoted=True)
    parts.changed_groups.append(
        exp.Not(this=exp.Is(this=touched_flag.copy(), expression=exp.Null()))
    )
    parts.group_values[pre.touched_flag] = touched_flag
    parts.group_values.update(_recomputed_values(pre, recomputed_cte))
    if kind is None:
        return
    parts.group_values[pre.values_column] = _column(pre.values_column, recomputed_cte)
    ran_out = _ran_out(pre, GROUP_CHANGES_CTE, recomputed_cte)
    if refilling:
        _add_refill(parts, plan, pre, recomputed_cte, ran_out)
    else:
        parts.exhausted.append(ran_out)


def _add_refill(
    parts: _ChangeQueryParts,
    plan: ViewPlan,
    pre: PreAggregation,
    recomputed_cte: str,
    ran_out: exp.Expr,
) -> None:
    """The groups that ran out, and their best values at the pinned versions."""
    refill_cte = _refill_cte(pre)
    parts.ctes.append(
        (refill_cte, _refilled(plan, pre, GROUP_CHANGES_CTE, recomputed_cte, ran_out))
    )
    best_cte = f"{refill_cte}_best"
    parts.ctes.append((best_cte, _refilled_extreme(plan, pre, refill_cte)))
    parts.join_per_group(plan, best_cte)
    ((name, _),) = pre.recomputed
    parts.group_values[name] = exp.Coalesce(
        this=parts.group_values[name],
        expressions=[exp.column(name, table=ident(best_cte), quoted=True)],
    )
    # A ran-out group's kept values are an empty array, not NULL: the refilled come first.
    parts.group_values[pre.values_column] = exp.Coalesce(
        this=_column(pre.values_column, best_cte),
        expressions=[parts.group_values[pre.values_column]],
    )


def _assembled(plan: ViewPlan, parts: _ChangeQueryParts) -> exp.Query:
    """The group branch and the pre-aggregations' branches under one SELECT with the CTEs."""
    if any(p.kept is not None for p in plan.preaggregations):
        parts.group_values[names.EXHAUSTED] = (
            exp.or_(*(exp.paren(e) for e in parts.exhausted)) if parts.exhausted else exp.false()
        )
    group_branch = parts.groups.select(*in_change_order(plan, parts.group_values)).where(
        exp.or_(*parts.changed_groups)
    )
    union = union_all([group_branch, *parts.branches])
    # Every part is built here for this query alone: assembled without copies
    # (each with_ copied the query so far, every CTE before it included).
    select = exp.select(exp.Star()).from_(
        union.subquery(ident(names.PREAGG_ALIAS), copy=False), copy=False
    )
    for name, query in parts.ctes:
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


def _touched_state_rows(
    plan: ViewPlan,
    state: TableName,
    changes_cte: str,
    columns: list[exp.Expr],
    where: exp.Expr,
    same_value: str | None = None,
) -> exp.Select:
    """`columns` of the state rows (alias s) in a group the change (`changes_cte`, alias c)
    touches, and with `same_value`, of that value column too: a semi join Spark broadcasts."""
    on = _same_group(plan, "s", "c")
    if same_value is not None:
        on = exp.and_(
            on, exp.NullSafeEQ(this=_column(same_value, "s"), expression=_column(same_value, "c"))
        )
    return (
        exp.select(*_keys(plan, "s"), *columns)
        .from_(state.to_table().as_("s", quoted=True))
        .join(
            exp.to_table(changes_cte, quoted=True).as_("c", quoted=True),
            on=on,
            join_type="LEFT SEMI",
        )
        .where(where)
    )


def _on_slot(slot: int) -> exp.Expr:
    return exp.EQ(this=_column(names.SLOT, "s"), expression=exp.Literal.number(slot))


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
    stored = _touched_state_rows(
        plan,
        state,
        changes_cte,
        [_column(pre.value_column, "s"), _column(names.COUNT, "s")],
        _on_slot(pre.slot),
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


def _counts_distinct_only(pre: PreAggregation) -> bool:
    """Whether the pre-aggregation feeds a COUNT(DISTINCT) alone (no MIN or MAX of its values)."""
    return pre.kept is None and all(kind == "COUNT" for _, kind in pre.recomputed)


def _recounted(plan: ViewPlan, pre: PreAggregation, state: TableName) -> exp.Select:
    """Per touched group: its COUNT(DISTINCT) after the change, and the touched flag.

    The stored distinct count plus the values that gained their first row
    less those that lost their last: only the touched (group, value) rows
    and group rows are read from the state, each through a semi join with
    the change (which Spark broadcasts), where recomputing from every value
    of a touched group read and grouped them all (a day's orders touch most
    days of mart_daily_active_customers, whose state is a row per day and
    customer).
    """
    changes_cte = names.preaggregation_cte(pre.argument_index)
    ((name, _),) = pre.recomputed

    pairs = _touched_state_rows(
        plan,
        state,
        changes_cte,
        [
            _column(pre.value_column, "s"),
            exp.alias_(_column(names.COUNT, "s"), _STORED, quoted=True),
        ],
        _on_slot(pre.slot),
        same_value=pre.value_column,
    )
    groups = _touched_state_rows(plan, state, changes_cte, [_column(name, "s")], _on_slot(0))
    stored = exp.Coalesce(this=_column(_STORED, "p"), expressions=[exp.Literal.number(0)])

    def counted(rows: exp.Expr) -> exp.Expr:
        return exp.If(
            this=exp.GT(this=rows, expression=exp.Literal.number(0)),
            true=exp.Literal.number(1),
            false=exp.Literal.number(0),
        )

    appeared = exp.Sub(
        this=counted(exp.Add(this=stored.copy(), expression=_column(names.COUNT, "c"))),
        expression=counted(stored.copy()),
    )
    recounted = exp.select(
        *_keys(plan, "c"),
        exp.alias_(
            exp.Add(
                this=exp.Coalesce(
                    this=exp.Max(this=_column(name, "g")), expressions=[exp.Literal.number(0)]
                ),
                expression=exp.Sum(this=appeared),
            ),
            name,
            quoted=True,
        ),
        exp.alias_(exp.true(), pre.touched_flag, quoted=True),
    ).from_(exp.to_table(changes_cte, quoted=True).as_("c", quoted=True))
    recounted = recounted.join(
        pairs.subquery(ident("p")),
        on=exp.and_(
            _same_group(plan, "c", "p"),
            exp.NullSafeEQ(
                this=_column(pre.value_column, "c"), expression=_column(pre.value_column, "p")
            ),
        ),
        join_type="LEFT",
    ).join(groups.subquery(ident("g")), on=_same_group(plan, "c", "g"), join_type="LEFT")
    if plan.keys:
        return recounted.group_by(*_keys(plan, "c"))
    return recounted.having(
        exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
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


# -- bounded pre-aggregations (module docstring) ----------------------------------------

# Columns of a bounded pre-aggregation's kept values (names.kept_values_cte):
# the stored count, whether the state keeps the value after the change, its
# place and the group's number of values kept before the cut to `kept`.
_STORED = f"{names.RESERVED_PREFIX}stored_n"
_KEEPS = f"{names.RESERVED_PREFIX}keeps"
_RANK = f"{names.RESERVED_PREFIX}rank"
_KEEPING = f"{names.RESERVED_PREFIX}keeping"
_RANKED_ALIAS = f"{names.RESERVED_PREFIX}ranked_values"
_ROWS_ALIAS = f"{names.RESERVED_PREFIX}value_rows"
_GROUP_VALUES_ALIAS = f"{names.RESERVED_PREFIX}group_values"
_DISTINCT_VALUES = f"{names.RESERVED_PREFIX}distinct_values"
# Per touched group: the stored non-NULL count, the edge of the kept values
# and their total count, and whether any value is kept after the change.
_STORED_NON_NULL = f"{names.RESERVED_PREFIX}stored_nn"
# A touched group's kept values, exploded from its state row.
_PAIRS_ALIAS = f"{names.RESERVED_PREFIX}pairs"
_PAIR_VALUE = f"{names.RESERVED_PREFIX}pair_v"
_PAIR_COUNT = f"{names.RESERVED_PREFIX}pair_n"
_EDGE = f"{names.RESERVED_PREFIX}edge"
_KEPT_TOTAL = f"{names.RESERVED_PREFIX}kept_total"
_ANY_KEPT = f"{names.RESERVED_PREFIX}any_kept"


def _refill_cte(pre: PreAggregation) -> str:
    assert pre.bounded_kind is not None
    return f"{names.RESERVED_PREFIX}refill_a{pre.argument_index}_{pre.bounded_kind.lower()}"


def _column(name: str, table: str | None = None) -> exp.Column:
    return exp.column(name, table=ident(table) if table else None, quoted=True)


def _kept_values(plan: ViewPlan, pre: PreAggregation, state: TableName) -> exp.Select:
    """Per touched group and value: the stored count and the count the state keeps after the change.

    A value is kept when it still has rows and was kept, or is on the kept
    side of the group's edge, or the group's kept values were all of them
    (their counts add up to its non-NULL count); then each group's kept
    values past 2 * kept are cut back to the best `kept`.

    The state is read once: the touched groups' rows, their kept values
    exploded beside the change's, each carrying the group's stored non-NULL
    count; the group's edge and totals are windows over them. A group that
    keeps no value has none (the build and every refresh leave one kept
    while it has any), so its missing count is its 0.
    """
    assert pre.kept is not None
    counts = _counts_by_value(plan, pre, state)
    return _cut_back(plan, pre, _judged(plan, pre, _group_facts(plan, pre, counts)))


def _counts_by_value(plan: ViewPlan, pre: PreAggregation, state: TableName) -> exp.Select:
    """Per touched group and value: its stored count, its count after the change, and the
    group's stored non-NULL count."""
    changes_cte = names.preaggregation_cte(pre.argument_index, pre.bounded_kind)
    value = _column(pre.value_column)
    zero = exp.Literal.number(0)
    kept_count = _column(_PAIR_COUNT, _PAIRS_ALIAS)
    stored = _touched_state_rows(
        plan,
        state,
        changes_cte,
        [
            exp.alias_(_column(_PAIR_VALUE, _PAIRS_ALIAS), pre.value_column, quoted=True),
            exp.alias_(kept_count.copy(), _STORED, quoted=True),
            exp.alias_(kept_count.copy(), names.COUNT, quoted=True),
            exp.alias_(
                _column(names.non_null_count_of(pre.argument_index), "s"),
                _STORED_NON_NULL,
                quoted=True,
            ),
        ],
        exp.Is(this=_column(names.GUARD, "s"), expression=exp.null()),
    )
    stored.append(
        "laterals",
        exp.Lateral(
            this=exp.Inline(this=_column(pre.values_column, "s")),
            view=True,
            alias=exp.TableAlias(
                this=ident(_PAIRS_ALIAS), columns=[ident(_PAIR_VALUE), ident(_PAIR_COUNT)]
            ),
        ),
    )
    changed = exp.select(
        *_keys(plan),
        value.copy(),
        exp.alias_(zero.copy(), _STORED, quoted=True),
        _column(names.COUNT),
        exp.alias_(
            exp.cast(exp.null(), exp.DataType.build("BIGINT")), _STORED_NON_NULL, quoted=True
        ),
    ).from_(exp.to_table(changes_cte, quoted=True))
    return (
        exp.select(
            *_keys(plan),
            value.copy(),
            exp.alias_(exp.Sum(this=_column(_STORED)), _STORED, quoted=True),
            exp.alias_(exp.Sum(this=_column(names.COUNT)), names.COUNT, quoted=True),
            exp.alias_(exp.Max(this=_column(_STORED_NON_NULL)), _STORED_NON_NULL, quoted=True),
        )
        .from_(exp.union(stored, changed, distinct=False).subquery(ident("u")))
        .group_by(*_keys(plan), value.copy())
    )


def _per_group(plan: ViewPlan, aggregate: exp.Expr) -> exp.Window:
    return exp.Window(this=aggregate, partition_by=_keys(plan) or None)


def _group_facts(plan: ViewPlan, pre: PreAggregation, counts: exp.Select) -> exp.Select:
    """Each value's counts beside its group's edge (the last kept value), kept total and
    stored non-NULL count."""
    value = _column(pre.value_column)
    edge = (exp.Max if pre.bounded_kind == "MIN" else exp.Min)(
        this=exp.If(
            this=exp.GT(this=_column(_STORED), expression=exp.Literal.number(0)),
            true=value.copy(),
            false=exp.null(),
        )
    )
    return exp.select(
        *_keys(plan),
        value.copy(),
        _column(_STORED),
        _column(names.COUNT),
        exp.alias_(_per_group(plan, edge), _EDGE, quoted=True),
        exp.alias_(_per_group(plan, exp.Sum(this=_column(_STORED))), _KEPT_TOTAL, quoted=True),
        exp.alias_(
            _per_group(plan, exp.Max(this=_column(_STORED_NON_NULL))),
            _STORED_NON_NULL,
            quoted=True,
        ),
    ).from_(counts.subquery(ident("n")))


def _judged(plan: ViewPlan, pre: PreAggregation, facts: exp.Select) -> exp.Select:
    """The group facts and whether each value is kept (before the cut back to `kept`)."""
    zero = exp.Literal.number(0)

    def zero_if_null(column: exp.Expr) -> exp.Expr:
        return exp.Coalesce(this=column, expressions=[zero.copy()])

    beyond_edge = (exp.LT if pre.bounded_kind == "MIN" else exp.GT)(
        this=_column(pre.value_column), expression=_column(_EDGE)
    )
    # The group row's (NULL value) has no count: never kept, cut out below.
    keeps = exp.and_(
        exp.GT(this=_column(names.COUNT), expression=zero.copy()),
        exp.or_(
            exp.GT(this=_column(_STORED), expression=zero.copy()),
            exp.EQ(
                this=zero_if_null(_column(_KEPT_TOTAL)),
                expression=zero_if_null(_column(_STORED_NON_NULL)),
            ),
            beyond_edge,
        ),
    )
    return exp.select(
        exp.Star(),
        exp.alias_(
            exp.Coalesce(this=exp.paren(keeps), expressions=[exp.false()]), _KEEPS, quoted=True
        ),
    ).from_(facts.subquery(ident("f")))


def _cut_back(plan: ViewPlan, pre: PreAggregation, judged: exp.Select) -> exp.Select:
    """The kept values' counts, a group keeping more than 2 * kept cut back to its best `kept`."""
    assert pre.kept is not None
    value = _column(pre.value_column)
    ranked = exp.select(
        exp.Star(),
        exp.alias_(_rank(plan, pre, first=_column(_KEEPS)), _RANK, quoted=True),
        exp.alias_(_per_group(plan, exp.CountIf(this=_column(_KEEPS))), _KEEPING, quoted=True),
    ).from_(judged.subquery(ident("j")))
    cut = exp.or_(
        exp.LTE(this=_column(_KEEPING), expression=exp.Literal.number(2 * pre.kept)),
        exp.LTE(this=_column(_RANK), expression=exp.Literal.number(pre.kept)),
    )
    return (
        exp.select(
            *_keys(plan),
            value.copy(),
            _column(_STORED),
            _column(_STORED_NON_NULL),
            exp.alias_(
                exp.If(
                    this=exp.and_(_column(_KEEPS), exp.paren(cut)),
                    true=_column(names.COUNT),
                    false=exp.Literal.number(0),
                ),
                names.COUNT,
                quoted=True,
            ),
        )
        .from_(ranked.subquery(ident("r")))
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
    )


def _recomputed_kept(plan: ViewPlan, pre: PreAggregation, kept_cte: str) -> exp.Select:
    """Per touched group: the extreme of its kept values and the values themselves, the
    touched flag, whether any is kept."""
    ((name, kind),) = pre.recomputed
    is_kept = exp.GT(this=_column(names.COUNT), expression=exp.Literal.number(0))
    recomputed = exp.select(
        *_keys(plan),
        exp.alias_(
            over_surviving_values(
                kind, exp.If(this=is_kept, true=_column(pre.value_column), false=exp.Null())
            ),
            name,
            quoted=True,
        ),
        exp.alias_(_kept_array(pre, is_kept.copy()), pre.values_column, quoted=True),
        exp.alias_(exp.true(), pre.touched_flag, quoted=True),
        exp.alias_(
            exp.GT(this=exp.CountIf(this=is_kept.copy()), expression=exp.Literal.number(0)),
            _ANY_KEPT,
            quoted=True,
        ),
        exp.alias_(exp.Max(this=_column(_STORED_NON_NULL)), _STORED_NON_NULL, quoted=True),
    ).from_(exp.to_table(kept_cte, quoted=True))
    if plan.keys:
        return recomputed.group_by(*_keys(plan))
    return recomputed.having(
        exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
    )


def _ran_out(pre: PreAggregation, main: str, recomputed_cte: str) -> exp.Expr:
    """In the group branch: the group keeps none of its values, and still has some."""
    non_null = exp.Add(
        this=exp.Coalesce(
            this=_column(_STORED_NON_NULL, recomputed_cte), expressions=[exp.Literal.number(0)]
        ),
        expression=exp.Coalesce(
            this=_column(names.non_null_count_of(pre.argument_index), main),
            expressions=[exp.Literal.number(0)],
        ),
    )
    return exp.and_(
        exp.Not(this=exp.Is(this=_column(pre.touched_flag, recomputed_cte), expression=exp.Null())),
        exp.Not(this=_column(_ANY_KEPT, recomputed_cte)),
        exp.GT(this=non_null, expression=exp.Literal.number(0)),
    )


def _refilled(
    plan: ViewPlan, pre: PreAggregation, main: str, recomputed_cte: str, ran_out: exp.Expr
) -> exp.Select:
    """The best `kept` (group, value, count) rows of the groups that ran out, from the sources."""
    keys: list[exp.Expr] = [*_keys(plan, main)]
    ran_out_groups = (
        exp.select(*keys or [exp.Literal.number(1)])
        .from_(exp.to_table(main, quoted=True).as_(main, quoted=True))
        .join(
            exp.to_table(recomputed_cte, quoted=True).as_(recomputed_cte, quoted=True),
            on=_same_group(plan, main, recomputed_cte),
        )
        .where(ran_out)
    )
    rows = (
        exp.select(exp.Column(this=exp.Star(), table=ident("r")))
        .from_(exp.to_table(names.ROWS_ALIAS, quoted=True).as_("r", quoted=True))
        .join(
            ran_out_groups.subquery(ident("x")),
            on=_same_group(plan, "r", "x"),
            join_type="LEFT SEMI",
        )
    )
    return _best_rows(plan, pre, rows)


def _refilled_extreme(plan: ViewPlan, pre: PreAggregation, refill_cte: str) -> exp.Select:
    """Per refilled group, its new MIN or MAX and its kept values."""
    ((name, kind),) = pre.recomputed
    select = exp.select(
        *_keys(plan),
        exp.alias_(_OVER_DISTINCT_VALUES[kind](this=_column(pre.value_column)), name, quoted=True),
        exp.alias_(_kept_array(pre), pre.values_column, quoted=True),
    ).from_(exp.to_table(refill_cte, quoted=True))
    if plan.keys:
        return select.group_by(*_keys(plan))
    return select.having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0)))
