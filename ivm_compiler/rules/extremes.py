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
"""

from __future__ import annotations

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, PreAggregation, StateColumn
from ivm_compiler.rules.aggregates import ArgumentState

# What each recomputed aggregate is over the surviving distinct values of a group.
_OVER_DISTINCT_VALUES = {"MIN": exp.Min, "MAX": exp.Max, "COUNT": exp.Count}
_STATE_NAMES = {"MIN": names.min_of, "MAX": names.max_of, "COUNT": names.distinct_count_of}


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
            build: exp.Expression = exp.Count(
                this=exp.Distinct(expressions=[argument.flat]), big_int=True
            )
        else:
            build = _OVER_DISTINCT_VALUES[kind](this=argument.flat)
        state_columns.append(
            StateColumn(
                name=name,
                rule=MergeRule.RECOMPUTED,
                build=build,
                # Filled in by the refresh from the pre-aggregation (state_rows.py).
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


def over_surviving_values(kind: str, value: exp.Expression) -> exp.Expression:
    """The aggregate over a group's distinct values that still have rows after the change.

    `value` is NULL for values whose count fell to zero, so they are ignored.
    """
    if kind == "COUNT":
        return exp.Count(this=value, big_int=True)
    return _OVER_DISTINCT_VALUES[kind](this=value)
