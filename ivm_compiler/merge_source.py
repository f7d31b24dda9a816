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
   (rules/moments.cancels), on which the MERGE fails (emit.CANCELLED).

The stored rows are the state's, read in the same statement as the MERGE's
target: the guard row's match makes the MERGE fail if another refresh
committed to the state since this one read it.
"""

from __future__ import annotations

from dataclasses import fields

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn, ViewPlan
from ivm_compiler.rules import covariance, moments
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

    def change(name: str) -> exp.Expr:
        return _column(name)

    # Layer 2: counts and the union's mean, from the joined row (layer 1).
    steps: dict[str, exp.Expr] = {}
    for index in arguments:
        counts = moments.merged_counts(index, stored, change)
        for field in fields(moments.MergedCounts):
            if field.name != "mean_new":
                steps[names.merge_step_of(field.name, index)] = getattr(counts, field.name)

    def counted(index: int) -> moments.MergedCounts:
        return moments.MergedCounts(
            **{
                f.name: _column(names.merge_step_of(f.name, index))
                for f in fields(moments.MergedCounts)
            }
        )

    # Layer 3: the mean once the removed values are out.
    means = {
        names.merge_step_of("mean_new", index): moments.mean_after_removal(
            counted(index).mean_union,
            counted(index).n_out,
            counted(index).n_new,
            counted(index).mean_out,
        )
        for index in arguments
    }
    # Layer 4: the merged values.
    merged = {
        names.merged_value_of(c.name): (
            covariance.merged(c, stored, change, counted)
            if c.rule is MergeRule.CO_MOMENT
            else moments.merged(c, stored, change, counted)
        )
        for c in columns
    }
    # Beside them, whether any argument's removal cancels (moments.cancels).
    cancelling = [
        exp.paren(moments.cancels(c.argument, stored, change, counted))
        for c in columns
        if c.rule is MergeRule.MOMENT
        and c.argument is not None
        and c.name == names.squared_deviations_of(c.argument)
    ]
    merged[names.CANCELLED] = exp.or_(*cancelling) if cancelling else exp.false()
    joined = _joined(plan, changes, state, read)
    layer = joined
    for values in (steps, means, merged):
        layer = exp.select(
            exp.Star(), *(exp.alias_(v, n, quoted=True) for n, v in values.items())
        ).from_(layer.subquery(ident(names.MERGING_ALIAS)))
    return layer


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
        .from_(changes.subquery(ident(names.MERGING_ALIAS)))
        .join(aliased(stored_rows.subquery(), names.STORED_ALIAS), on=on, join_type="LEFT")
    )


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)
