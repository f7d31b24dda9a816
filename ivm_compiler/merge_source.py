"""The MERGE's source for a model with moments: every merged value computed once, before the MERGE.

A MOMENT or CO_MOMENT column's new value (rules/moments.py,
rules/covariance.py) reads the stored row's counts and means and the
change's through two steps: the union with the inserted values, then the
removal of the removed ones. Written inline in the MERGE's UPDATE clause,
each column repeated its arguments' merged counts and means, each mean
nested in the next: COVAR_SAMP and CORR of one pair ran past 1,100 lines
(76 KB) and took seconds to generate, parse and analyse. Here the change
rows are joined with their stored rows and every intermediate is a column,
computed once, layer by layer:

1. beside each change row, the stored values the merges read
   (names.stored_value_of; a LEFT JOIN on the merge keys, so a group new to
   the state joins NULLs, which merge as an empty row, as an INSERT needs);
2. each argument's counts and the mean of the union (names.merge_step_of);
3. each argument's mean once the removed values are out;
4. each MOMENT and CO_MOMENT column's new value (names.merged_value_of),
   which the MERGE sets, or inserts, as it is, and names.CANCELLED: whether
   taking the removed values out cancelled too many bits of a moment
   (rules/moments.cancels) or of a floating-point sum (rules/floating.cancels),
   on which the MERGE fails (emit.CANCELLED).

A model with floating-point sums and no moments has layers 1 and 4 alone,
and only in the MERGE that recomputes its cancelled groups; its first MERGE
tests the sums on the target's columns (emit.py).

The stored rows are the state's, read in the same statement as the MERGE's
target: the guard row's match makes the MERGE fail if another refresh
committed to the state since this one read it.
"""

from __future__ import annotations

from dataclasses import fields

from sqlglot import exp

from ivm_compiler import names, state_rows
from ivm_compiler.plan import MergeRule, StateColumn, ViewPlan
from ivm_compiler.rules import covariance, floating, moments
from ivm_compiler.rules.floating import Columns
from ivm_compiler.sql import TableName, aliased, ident

MERGED_RULES = (MergeRule.MOMENT, MergeRule.CO_MOMENT)

# Session settings for the MERGE over these layers. Spark's constraint
# propagation copies every constraint that mentions an alias's expression
# for that alias and adds `expression <=> alias`; the layers' aliases nest
# one another's expressions, so the copies multiply layer by layer (a
# COVAR_SAMP and CORR model's MERGE ran the driver out of heap after 9
# minutes; with it off, its test class passed in 97 s). Constraint
# propagation only infers filters, so turning it off changes no result, also
# for a statement another thread runs in a shared session meanwhile.
SESSION_SETTINGS = {"spark.sql.constraintPropagation.enabled": "false"}


def merged_columns(plan: ViewPlan) -> list[StateColumn]:
    """The plan's columns whose new value the MERGE's source computes (none: no layers)."""
    return [c for c in plan.value_columns if c.rule in MERGED_RULES]


def session_settings(plan: ViewPlan) -> dict[str, str]:
    """The session settings the plan's MERGE runs under (none without moments)."""
    return dict(SESSION_SETTINGS) if merged_columns(plan) else {}


def with_merged_values(plan: ViewPlan, changes: exp.Query, state: TableName) -> exp.Select:
    """`changes`, each row with its stored values and merged values beside it (module docstring)."""
    return _merging(plan, changes, state)[0]


def cancellable_sums(plan: ViewPlan) -> list[int]:
    """The arguments of the plan's floating-point sums, whose merge may cancel (rules/floating.py)."""
    return [
        c.argument
        for c in plan.value_columns
        if c.rule is MergeRule.COMPENSATED_SUM and c.argument is not None
    ]


def recomputes_groups(plan: ViewPlan) -> bool:
    """Whether a cancelling removal is met by recomputing its groups alone (else the model).

    Without pre-aggregations a group is one state row, which the recomputed
    row replaces; a group's pre-aggregation rows that the recomputation no
    longer has would need deleting as well.
    """
    cancellable = merged_columns(plan) or cancellable_sums(plan)
    return bool(cancellable) and not plan.preaggregations


def with_cancelled_groups_recomputed(
    plan: ViewPlan, changes: exp.Query, state: TableName, built: exp.Query
) -> exp.Query:
    """with_merged_values's rows but those of cancelled groups, plus those groups' rows of `built`.

    `built` is the state computed from the sources at the pinned versions
    (emit._build_query). Its rows for the groups whose removal cancels
    (names.CANCELLED) come with names.REPLACING TRUE, their state columns
    under the same names as the change rows', every other column NULL: the
    MERGE replaces those groups' rows with them and merges the rest.
    """
    merging, columns = _merging(plan, changes, state)
    # Both sides name every column, in one order: UNION ALL matches by position.
    kept = (
        exp.select(
            *(_column(n) for n in columns), exp.alias_(exp.false(), names.REPLACING, quoted=True)
        )
        .from_(merging.subquery(ident(names.MERGING_ROWS_ALIAS)))
        .where(exp.not_(exp.Coalesce(this=_column(names.CANCELLED), expressions=[exp.false()])))
    )
    # Read twice, as two subqueries: the first form, a CTE that the rows and
    # an EXISTS read, made Delta fail the MERGE ("Table does not support
    # reads": its target read in the source's subquery expression), and so
    # did the EXISTS alone; this semi join does not.
    return exp.union(kept, _recomputed(plan, merging, columns, built), distinct=False)


def _recomputed(
    plan: ViewPlan, merging: exp.Select, columns: list[str], built: exp.Query
) -> exp.Select:
    """`built`'s rows of the cancelled groups, in `columns` (NULL where not a state column)."""
    keys: list[exp.Expr] = [_column(k) for k in plan.merge_keys]
    cancelled = (
        exp.select(*(keys or [exp.Literal.number(1)]))
        .from_(merging.subquery(ident(names.MERGING_ROWS_ALIAS)))
        .where(_column(names.CANCELLED))
    )
    # A global aggregate has no key: its one group is cancelled or not.
    on: exp.Expr = exp.true()
    if plan.merge_keys:
        on = exp.and_(
            *(
                exp.NullSafeEQ(
                    this=exp.column(k, table=names.CANCELLED_KEYS_ALIAS, quoted=True),
                    expression=exp.column(k, table=names.BUILT_ALIAS, quoted=True),
                )
                for k in plan.merge_keys
            )
        )
    stored = set(state_rows.state_table_columns(plan))
    return (
        exp.select(
            *(
                exp.column(n, table=names.BUILT_ALIAS, quoted=True)
                if n in stored
                else exp.alias_(exp.null(), n, quoted=True)
                for n in columns
            ),
            exp.alias_(exp.true(), names.REPLACING, quoted=True),
        )
        .from_(built.subquery(ident(names.BUILT_ALIAS)))
        .join(cancelled.subquery(ident(names.CANCELLED_KEYS_ALIAS)), on=on, join_type="LEFT SEMI")
    )


def _merging(plan: ViewPlan, changes: exp.Query, state: TableName) -> tuple[exp.Select, list[str]]:
    """with_merged_values's query and its columns, in order."""
    columns = merged_columns(plan)
    arguments = sorted(
        {c.argument for c in columns if c.argument is not None}
        | {c.partner for c in columns if c.partner is not None}
    )
    read: list[str] = []

    def stored(name: str) -> exp.Expr:
        if name not in read:
            read.append(name)
        return _column(names.stored_value_of(name))

    layers = [
        _count_steps(arguments, stored),
        _means_after_removal(arguments),
        {**_merged_values(columns, stored), **_cancelled(plan, columns, stored)},
    ]
    layer = _joined(plan, changes, state, read)
    output = [*state_rows.change_columns(plan), *(names.stored_value_of(n) for n in read)]
    for values in filter(None, layers):
        # The layers are built here alone: nested without copies.
        layer = exp.select(
            exp.Star(), *(exp.alias_(v, n, quoted=True) for n, v in values.items())
        ).from_(layer.subquery(ident(names.MERGING_ALIAS), copy=False), copy=False)
        output += values
    return layer, output


def _counted(index: int) -> moments.MergedCounts:
    """Argument `index`'s counts and means, as the columns layers 2 and 3 hold them in."""
    return moments.MergedCounts(
        **{
            f.name: _column(names.merge_step_of(f.name, index))
            for f in fields(moments.MergedCounts)
        }
    )


def _count_steps(arguments: list[int], stored: Columns) -> dict[str, exp.Expr]:
    """Layer 2: each argument's counts and the union's mean, from the joined row (layer 1)."""
    steps: dict[str, exp.Expr] = {}
    for index in arguments:
        counts = moments.merged_counts(index, stored, _column)
        for field in fields(moments.MergedCounts):
            if field.name != "mean_new":
                steps[names.merge_step_of(field.name, index)] = getattr(counts, field.name)
    return steps


def _means_after_removal(arguments: list[int]) -> dict[str, exp.Expr]:
    """Layer 3: each argument's mean once the removed values are out."""
    return {
        names.merge_step_of("mean_new", index): moments.mean_after_removal(
            _counted(index).mean_union,
            _counted(index).n_out,
            _counted(index).n_new,
            _counted(index).mean_out,
        )
        for index in arguments
    }


def _merged_values(columns: list[StateColumn], stored: Columns) -> dict[str, exp.Expr]:
    """Layer 4: the merged values."""
    return {
        names.merged_value_of(c.name): (
            covariance.merged(c, stored, _column, _counted)
            if c.rule is MergeRule.CO_MOMENT
            else moments.merged(c, stored, _column, _counted)
        )
        for c in columns
    }


def _cancelled(plan: ViewPlan, columns: list[StateColumn], stored: Columns) -> dict[str, exp.Expr]:
    """Also layer 4: whether merging the row cancels a moment's or a sum's bits (names.CANCELLED)."""
    cancelling = [
        exp.paren(moments.cancels(c.argument, stored, _column, _counted))
        for c in columns
        if c.rule is MergeRule.MOMENT
        and c.argument is not None
        and c.name == names.squared_deviations_of(c.argument)
    ]
    cancelling += [
        exp.paren(floating.cancels(index, stored, _column)) for index in cancellable_sums(plan)
    ]
    return {names.CANCELLED: exp.or_(*cancelling) if cancelling else exp.false()}


def _joined(plan: ViewPlan, changes: exp.Query, state: TableName, read: list[str]) -> exp.Select:
    """Layer 1: each change row with the stored values `read` of its state row (NULLs for none)."""
    keys = plan.merge_keys
    stored_rows = (
        exp.select(*(_column(k) for k in keys), *(_column(n) for n in read))
        .from_(state.to_table())
        .where(exp.Is(this=_column(names.GUARD), expression=exp.null()))
    )
    # A global aggregate without pre-aggregations has no key: its one group row.
    on: exp.Expr = exp.true()
    if keys:
        on = exp.and_(
            *(
                exp.NullSafeEQ(
                    this=exp.column(k, table=names.MERGING_ALIAS, quoted=True),
                    expression=exp.column(k, table=names.STORED_ALIAS, quoted=True),
                )
                for k in keys
            )
        )
    return (
        exp.select(
            exp.Column(this=exp.Star(), table=ident(names.MERGING_ALIAS)),
            *(
                exp.alias_(
                    exp.column(n, table=names.STORED_ALIAS, quoted=True),
                    names.stored_value_of(n),
                    quoted=True,
                )
                for n in read
            ),
        )
        # `changes` is the caller's change query, built for this statement alone.
        .from_(changes.subquery(ident(names.MERGING_ALIAS), copy=False), copy=False)
        .join(
            aliased(stored_rows.subquery(), names.STORED_ALIAS),
            on=on,
            join_type="LEFT",
            copy=False,
        )
    )


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)
