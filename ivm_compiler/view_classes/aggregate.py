"""GROUPED_AGGREGATE and GLOBAL_AGGREGATE: SELECT keys, aggs FROM sources WHERE p GROUP BY keys.

One state row per group, keyed by the GROUP BY expressions, with the group's
row count (rules/counting.py) and, per distinct aggregate argument, the
additive state of COUNT/SUM/AVG (rules/aggregates.py) and the recomputed
MIN/MAX/COUNT(DISTINCT) with their (group, value, count) pre-aggregation
rows (rules/extremes.py). The outputs and HAVING are rewritten over those
state columns (the finalizer). Without GROUP BY (GLOBAL_AGGREGATE) the state
has exactly one group row, kept even when the sources are empty, because
the query answers one row then too.

Which aggregates are maintained, and how, is asked of Spark: one DESCRIBE
QUERY of a probe gives the types of the keys (which must be comparable), of
each SUM (a DOUBLE sum means a floating-point argument, kept by
rules/floating.py; a DECIMAL(38, s > 6) sum is refused: its stored sum would
drift) and of each AVG (its result type). STDDEV and VARIANCE keep moments
(rules/moments.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import replace

from sqlglot import exp

from ivm_compiler import key_bounds, names, state_rows
from ivm_compiler.changes import JoinReads
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.plan import OutputColumn, PreAggregation, StateColumn, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import aggregates, counting, covariance, extremes, moments, semi_joins
from ivm_compiler.sql import DIALECT, TableName, ident
from ivm_compiler.view_classes.flattening import (
    distinct_expressions,
    refuse_incomparable_keys,
    rows_with_semi_joins,
    typed_projections,
    with_clauses,
)
from ivm_compiler.view_classes.protocol import QualifiedModel

CLASSES: tuple[ViewClass, ...] = (ViewClass.GROUPED_AGGREGATE, ViewClass.GLOBAL_AGGREGATE)

# Spark's decimal `+` widens its result by one digit; past precision 38 it
# keeps the integer digits and cuts the scale to max(scale - 1, 6)
# (spark.sql.decimalOperations.allowPrecisionLoss). A refresh adds a sum's
# change to the stored sum with `+`, so a DECIMAL(38, s) sum with s > 6 would
# lose its last digit on every refresh (and a sum near the maximum overflows
# when cast back), while Spark's own SUM adds at DECIMAL(38, s) exactly.
EXACT_DECIMAL_ADD_SCALE = 6


def takes(query: exp.Query) -> bool:
    """A SELECT with GROUP BY, or with an aggregate in its SELECT list or HAVING.

    >>> import sqlglot
    >>> takes(sqlglot.parse_one("select k, count(*) from t group by k"))
    True
    >>> takes(sqlglot.parse_one("select k from t"))
    False
    """
    if not isinstance(query, exp.Select):
        return False
    having = query.args.get("having")
    return bool(query.args.get("group")) or any(
        p.find(exp.AggFunc) for p in query.expressions + ([having] if having else [])
    )


def plan(model: QualifiedModel) -> ViewPlan:
    """One state row per group: keys, count, each argument's state, and pre-aggregation rows."""
    qualified = model.qualified
    assert isinstance(qualified, exp.Select)
    # The rows without their semi and anti joins, which become key relations of join terms.
    unfiltered, semis = semi_joins.extract(model.model, qualified)
    projections = typed_projections(model.model, qualified, model.described)
    having = qualified.args.get("having")
    if qualified.args.get("distinct"):
        raise NotMaintainable(model.model, "SELECT DISTINCT together with aggregates")
    keys = distinct_expressions(_group_keys(qualified.args.get("group"), projections))
    # GROUP BY ALL over aggregates only is, for Spark, an aggregate without GROUP BY.
    view_class = ViewClass.GROUPED_AGGREGATE if keys else ViewClass.GLOBAL_AGGREGATE
    key_columns = [counting.key_column(i) for i in range(len(keys))]
    aggregated = projections + ([having.this] if having else [])
    arguments = aggregates.arguments_of(model.model, aggregated)
    avg_types, floating_point = _probe_types(model, keys, aggregated, arguments)
    arguments = {key: replace(a, is_floating=key in floating_point) for key, a in arguments.items()}
    rewrite = _finalizer(model.model, keys, key_columns, arguments, avg_types)
    outputs = tuple(
        OutputColumn(name=name, data_type=data_type, expression=rewrite(p))
        for (name, data_type), p in zip(model.described, projections)
    )
    having_final = rewrite(having.this) if having else None
    # A bounded MIN/MAX tells a group with values it no longer keeps by the
    # argument's non-NULL count (rules/extremes.py).
    arguments = {
        key: replace(a, needs_count=True) if extremes.bounded(a, model.extremes_kept) else a
        for key, a in arguments.items()
    }
    state, preaggregations = _state_columns(key_columns, arguments, model.extremes_kept)
    rows = rows_with_semi_joins(model, unfiltered, semis, keys, arguments)
    return ViewPlan(
        model=model.model,
        view_class=view_class,
        sql=model.sql,
        query=model.query,
        sources=rows.sources,
        rows=rows.rows,
        keys=tuple(c.name for c in key_columns),
        state_columns=tuple(state),
        preaggregations=tuple(preaggregations),
        upstreams=model.upstreams_read,
        outputs=outputs,
        having=having_final,
        fingerprint=_bounded_fingerprint(model.fingerprint(view_class), preaggregations),
        join_terms=rows.join_terms,
    )


def _bounded_fingerprint(fingerprint: str, preaggregations: list[PreAggregation]) -> str:
    """The fingerprint, changed by how many values a bounded MIN/MAX keeps (a new number rebuilds).

    "as arrays": a state that kept them as rows of their own (before
    2026-12-06) is rebuilt in the array form, never patched.
    """
    kept = {p.kept for p in preaggregations if p.kept is not None}
    if not kept:
        return fingerprint
    return hashlib.sha256(f"{fingerprint} kept {kept.pop()} as arrays".encode()).hexdigest()[:16]


def _group_keys(group: exp.Group | None, projections: list[exp.Expr]) -> list[exp.Expr]:
    if group is None:
        return []
    if group.args.get("all"):
        # GROUP BY ALL groups by every output that is not an aggregate.
        return [p for p in projections if not p.find(exp.AggFunc)]
    return list(group.expressions)


def _state_columns(
    key_columns: list[StateColumn],
    arguments: dict[str, aggregates.ArgumentState],
    extremes_kept: int | None,
) -> tuple[list[StateColumn], list[PreAggregation]]:
    """The group row's columns, in state order, and the pre-aggregations, by slot."""
    state = [*key_columns, counting.count_column()]
    for argument in arguments.values():
        state.extend(argument.columns())
    preaggregations: list[PreAggregation] = []
    for argument in arguments.values():
        if argument.recomputed:
            columns, added = extremes.columns(
                argument, first_slot=len(preaggregations) + 1, kept=extremes_kept
            )
            state.extend(columns)
            preaggregations.extend(added)
    return state, preaggregations


# -- what Spark says of the aggregates' types ------------------------------------


def _probe_types(
    model: QualifiedModel,
    keys: list[exp.Expr],
    expressions: list[exp.Expr],
    arguments: dict[str, aggregates.ArgumentState],
) -> tuple[dict[str, exp.DataType], frozenset[str]]:
    """Ask Spark the types that decide what can be maintained, and how.

    One DESCRIBE QUERY over the source gives the type of every group key (which
    must be comparable), of SUM(x) for every summed x and every x of STDDEV or
    VARIANCE (a DOUBLE sum means x is floating point), and of AVG(x) for every
    averaged x. Returns AVG's result types and the floating-point arguments.
    """
    averaged = {call.this.sql(dialect=DIALECT) for e in expressions for call in e.find_all(exp.Avg)}
    qualified = model.qualified
    assert isinstance(qualified, exp.Select)
    probe = _type_probe(qualified, keys, arguments, averaged)
    if probe is None:
        return {}, frozenset()
    types = dict(model.describe_query(probe.sql(dialect=DIALECT)))
    _refuse_probed_types(model.model, keys, arguments, types)
    avg_types = {
        key: exp.DataType.build(types[f"avg_{a.index}"], dialect=DIALECT)
        for key, a in arguments.items()
        if key in averaged
    }
    floating_point = frozenset(
        key
        for key, a in arguments.items()
        if a.needs_sum_type and types[f"sum_{a.index}"].lower() == "double"
    )
    return avg_types, floating_point


def _type_probe(
    qualified: exp.Select,
    keys: list[exp.Expr],
    arguments: dict[str, aggregates.ArgumentState],
    averaged: set[str],
) -> exp.Select | None:
    """SELECT key_i, sum_i, avg_i, value_i FROM <the model's sources> GROUP BY keys; None: nothing to ask."""
    probe_columns: list[exp.Expr] = [
        exp.alias_(key.copy(), f"key_{i}") for i, key in enumerate(keys)
    ]
    probe_columns += [
        exp.alias_(exp.Sum(this=a.argument.copy()), f"sum_{a.index}")
        for a in arguments.values()
        if a.needs_sum_type
    ]
    probe_columns += [
        exp.alias_(exp.Avg(this=a.argument.copy()), f"avg_{a.index}")
        for key, a in arguments.items()
        if key in averaged
    ]
    # MIN/MAX/COUNT(DISTINCT) group by the argument's values in the pre-aggregation.
    # FIRST rather than MIN: it accepts every type, so a MAP argument reaches
    # the refusal below instead of failing Spark's analysis with a raw error.
    probe_columns += [
        exp.alias_(exp.First(this=a.argument.copy()), f"value_{a.index}")
        for a in arguments.values()
        if a.recomputed
    ]
    if not probe_columns:
        return None
    probe = with_clauses(exp.Select(expressions=probe_columns), qualified, ("from_", "joins"))
    if keys:
        probe = probe.group_by(*[key.copy() for key in keys])
    return probe


def _refuse_probed_types(
    model: str,
    keys: list[exp.Expr],
    arguments: dict[str, aggregates.ArgumentState],
    types: Mapping[str, str],
) -> None:
    """Refuse keys and MIN/MAX arguments Spark cannot compare, and decimal sums it cannot add exactly."""
    refuse_incomparable_keys(
        model,
        [(key.sql(dialect=DIALECT), types[f"key_{i}"]) for i, key in enumerate(keys)],
        "GROUP BY key",
    )
    refuse_incomparable_keys(
        model,
        [
            (a.argument.sql(dialect=DIALECT), types[f"value_{a.index}"])
            for a in arguments.values()
            if a.recomputed
        ],
        "MIN/MAX/COUNT(DISTINCT) argument",
    )
    for argument in (a for a in arguments.values() if a.needs_sum):
        _refuse_inexact_decimal_sum(model, argument, types[f"sum_{argument.index}"])


def _refuse_inexact_decimal_sum(
    model: str, argument: aggregates.ArgumentState, sum_type: str
) -> None:
    """Refuse SUM/AVG whose DECIMAL(38, s > 6) sum Spark's `+` cannot add exactly.

    >>> from ivm_compiler.rules.aggregates import ArgumentState
    >>> amount = ArgumentState(index=0, argument=exp.column("amount"), needs_sum=True)
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(38,6)")
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(37,10)")
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(38,10)")
    Traceback (most recent call last):
    ...
    ivm_compiler.errors.NotMaintainable: ...DECIMAL(38, 10)...
    """
    data_type = exp.DataType.build(sum_type, dialect=DIALECT)
    if data_type.this != exp.DataType.Type.DECIMAL or len(data_type.expressions) != 2:
        return
    precision, scale = (int(e.this.name) for e in data_type.expressions)
    if precision < 38 or scale <= EXACT_DECIMAL_ADD_SCALE:
        return
    shown = argument.argument.sql(dialect=DIALECT)
    raise NotMaintainable(
        model,
        f"SUM/AVG over {shown}, whose sum is a DECIMAL(38, {scale}) (Spark adds two such "
        f"decimals at scale {scale - 1}, so every refresh would round the stored sum)",
        f"cast it to at most {EXACT_DECIMAL_ADD_SCALE} decimal places, e.g. "
        f"SUM(CAST({shown} AS DECIMAL(38, {EXACT_DECIMAL_ADD_SCALE}))), or to at most 27 "
        f"digits, e.g. DECIMAL(27, {scale}), or " + FALLBACK_HINT,
    )


# -- the outputs over the state's columns ------------------------------------------


def _finalizer(
    model: str,
    keys: list[exp.Expr],
    key_columns: list[StateColumn],
    arguments: dict[str, aggregates.ArgumentState],
    avg_types: dict[str, exp.DataType],
) -> Callable[[exp.Expr], exp.Expr]:
    # One branch per maintained aggregate: the view reads its state columns.
    """Rewrite an output (or HAVING) expression of an aggregate query over state columns."""
    key_names = {key.sql(dialect=DIALECT): column.name for key, column in zip(keys, key_columns)}

    def replace(node: exp.Expr) -> exp.Expr:
        key_name = key_names.get(node.sql(dialect=DIALECT))
        if key_name is not None:
            return aggregates.state_column(key_name)
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
            return aggregates.finalize_count_star()
        if isinstance(node, moments.AGGREGATES):
            argument = arguments[aggregates.argument_of(model, node).sql(dialect=DIALECT)]
            return moments.finalize(node, argument.index, argument.is_floating)
        if isinstance(node, covariance.CoMoment):
            x, y = (arguments[a.sql(dialect=DIALECT)].index for a in (node.this, node.expression))
            return aggregates.state_column(names.co_moment_of(x, y))
        if isinstance(node, (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)):
            key = aggregates.argument_of(model, node).sql(dialect=DIALECT)
            index = arguments[key].index
            is_floating = arguments[key].is_floating
            if isinstance(node, exp.Min):
                return aggregates.state_column(extremes.state_name("MIN", index))
            if isinstance(node, exp.Max):
                return aggregates.state_column(extremes.state_name("MAX", index))
            if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
                return aggregates.state_column(extremes.state_name("COUNT", index))
            if isinstance(node, exp.Count):
                return aggregates.finalize_count(index)
            if isinstance(node, exp.Sum):
                return aggregates.finalize_sum(index, is_floating)
            return aggregates.finalize_avg(index, avg_types[key], is_floating)
        return node

    def rewrite(expression: exp.Expr) -> exp.Expr:
        final = expression.transform(replace)
        for column in final.find_all(exp.Column):
            if not names.is_reserved(column.name):
                raise NotMaintainable(
                    model,
                    f"the column {column.sql(dialect=DIALECT)} outside GROUP BY and aggregates",
                    "add it to GROUP BY or aggregate it",
                )
        return final

    return rewrite


# -- the state's queries and its view ----------------------------------------------


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """The group rows, and with MIN/MAX/COUNT(DISTINCT) the pre-aggregation rows (extremes.py)."""
    if plan.preaggregations:
        return extremes.build_query(plan, versions, rows_filter)
    return state_rows.build_query(plan, versions, rows_filter)


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Each group's additive change; with pre-aggregations also their recomputation (extremes.py)."""
    if plan.preaggregations:
        return extremes.change_query(plan, ranges, state, bounds, join_reads)
    return state_rows.change_query(plan, ranges, state, bounds, join_reads)


def leaves_state(plan: ViewPlan, emptied: exp.Expr) -> exp.Expr | None:
    """A group leaves the state with its last row; the global aggregate's one group row never.

    Its pre-aggregation rows (slot > 0) do leave when their count reaches zero.
    """
    if plan.view_class is ViewClass.GROUPED_AGGREGATE:
        return emptied
    if not plan.row_preaggregations:
        return None
    slot = exp.column(names.SLOT, table=ident(names.CHANGE_ALIAS), quoted=True)
    return exp.and_(emptied, exp.GT(this=slot, expression=exp.Literal.number(0)))


def view(plan: ViewPlan, rows: exp.Select) -> exp.Select:
    """The group rows (not pre-aggregation rows) of groups with rows that pass HAVING.

    A global aggregate shows its one row even with no rows: the query does.
    """
    if plan.row_preaggregations:
        group_rows = exp.EQ(
            this=exp.column(names.SLOT, quoted=True), expression=exp.Literal.number(0)
        )
        rows = rows.where(group_rows)
    if plan.view_class is ViewClass.GROUPED_AGGREGATE:
        rows = rows.where(counting.populated())
    if plan.having is not None:
        rows = rows.where(plan.having.copy())
    return rows
