"""PROJECTION and DISTINCT: SELECT [DISTINCT] exprs FROM sources WHERE p.

The state keeps each distinct output row once, keyed by its expressions,
with the number of source rows that produce it (rules/counting.py): a change
row adds its sign to that count, and a row whose count reaches zero leaves
the state. The view shows a PROJECTION's row as many times as its count (the
query's bag) and a DISTINCT's row once. A UNION ALL chain is planned into a
PROJECTION and a UNION chain into a DISTINCT (set_operation.py); a WINDOW
model keeps the same state (window.py).

This is the last class compile.VIEW_CLASSES tries: a query no other class
takes is a projection, or is refused here (HAVING without aggregates).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, state_rows
from ivm_compiler.changes import JoinReads
from ivm_compiler.errors import NotMaintainable
from ivm_compiler.plan import OutputColumn, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import aggregates, counting, semi_joins
from ivm_compiler.sql import DIALECT, TableName
from ivm_compiler.view_classes.flattening import (
    distinct_expressions,
    refuse_incomparable_keys,
    rows_with_semi_joins,
    typed_projections,
)
from ivm_compiler.view_classes.protocol import QualifiedModel

CLASSES: tuple[ViewClass, ...] = (ViewClass.PROJECTION, ViewClass.DISTINCT)


def takes(query: exp.Query) -> bool:
    """Every query the classes before it leave (it refuses what it cannot keep)."""
    return True


def plan(model: QualifiedModel) -> ViewPlan:
    """One state row per distinct output row: its key columns and its count."""
    qualified = model.qualified
    assert isinstance(qualified, exp.Select)
    # The rows without their semi and anti joins, which become key relations of join terms.
    unfiltered, semis = semi_joins.extract(model.model, qualified)
    projections = typed_projections(model.model, qualified, model.described)
    if qualified.args.get("having"):
        raise NotMaintainable(model.model, "HAVING without aggregates")
    view_class = ViewClass.DISTINCT if qualified.args.get("distinct") else ViewClass.PROJECTION
    refuse_incomparable_keys(model.model, model.described, "column")
    keys = distinct_expressions(projections)
    key_columns = [counting.key_column(i) for i in range(len(keys))]
    key_names = {key.sql(dialect=DIALECT): col.name for key, col in zip(keys, key_columns)}
    outputs = tuple(
        OutputColumn(
            name=name,
            data_type=data_type,
            expression=aggregates.state_column(key_names[p.sql(dialect=DIALECT)]),
        )
        for (name, data_type), p in zip(model.described, projections)
    )
    rows = rows_with_semi_joins(model, unfiltered, semis, keys, {})
    return ViewPlan(
        model=model.model,
        view_class=view_class,
        sql=model.sql,
        query=model.query,
        sources=rows.sources,
        rows=rows.rows,
        keys=tuple(c.name for c in key_columns),
        state_columns=(*key_columns, counting.count_column()),
        preaggregations=(),
        upstreams=model.upstreams_read,
        outputs=outputs,
        having=None,
        fingerprint=model.fingerprint(view_class),
        join_terms=rows.join_terms,
    )


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """COUNT(*) per distinct row (state_rows.py); a projection's log, each row counted once."""
    if plan.log_state and plan.view_class is ViewClass.PROJECTION:
        return state_rows.ungrouped_build_query(plan, versions, rows_filter)
    return state_rows.build_query(plan, versions, rows_filter)


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """The sum of the change rows' signs per distinct row (state_rows.py)."""
    return state_rows.change_query(plan, ranges, state, bounds, join_reads)


def leaves_state(plan: ViewPlan, emptied: exp.Expr) -> exp.Expr | None:
    """A row leaves the state when its count reaches zero."""
    return emptied


def view(plan: ViewPlan, rows: exp.Select) -> exp.Select:
    """The rows with a positive count; a PROJECTION's repeated count times."""
    shown = rows.where(counting.populated())
    if plan.view_class is ViewClass.DISTINCT:
        return shown
    return counting.repeated(shown, counting.count())
