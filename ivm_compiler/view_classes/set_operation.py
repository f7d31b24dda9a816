"""Set operations: a UNION|INTERSECT|EXCEPT [ALL] b ..., a chain of one operation over SELECTs.

The rows of all operands are flattened into one relation, each operand's
SELECT under UNION ALL, so the chain's state is one row per distinct output
row with its count over all operands (rules/counting.py). UNION ALL is then
a PROJECTION and UNION a DISTINCT (projection.py maintains both).
INTERSECT and EXCEPT [ALL] (the SET_OPERATION class) also keep one count per
operand (each flattened row carries its operand's index), from which the
view decides whether and how often a row appears: the consistency-levels
paper's set-operation views with auxiliary counts.

An operand that aggregates, dedupes or is itself another set operation
becomes a plan node (nodes.py) before it gets here; one with semi or outer
joins is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, names, state_rows
from ivm_compiler.changes import JoinReads
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.plan import OutputColumn, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import aggregates, counting, outer_joins, semi_joins
from ivm_compiler.sql import (
    TableName,
    set_operation_branches,
    set_operation_kind,
    union_all,
)
from ivm_compiler.view_classes.flattening import (
    refuse_incomparable_keys,
    refuse_untyped_outputs,
    sources_of,
    with_clauses,
)
from ivm_compiler.view_classes.protocol import QualifiedModel

CLASSES: tuple[ViewClass, ...] = (ViewClass.SET_OPERATION,)

# The view each set operation shows, from one multiplicity per operand.
SET_OPERATION_CLASSES = {
    "UNION ALL": ViewClass.PROJECTION,
    "UNION": ViewClass.DISTINCT,
    "INTERSECT": ViewClass.SET_OPERATION,
    "INTERSECT ALL": ViewClass.SET_OPERATION,
    "EXCEPT": ViewClass.SET_OPERATION,
    "EXCEPT ALL": ViewClass.SET_OPERATION,
}

BUILD_IT_APART = "build that operand as an ivm model of its own and ref() it, or " + FALLBACK_HINT


def check_shape(model: str, tree: exp.SetOperation) -> None:
    """Refuse, before qualification, a chain this class cannot flatten (parse.py asks)."""
    kind = set_operation_kind(tree)
    if tree.args.get("by_name"):
        raise NotMaintainable(model, f"{kind} BY NAME", "list the columns in the same order")
    for clause, written in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
        if tree.args.get(clause):
            raise NotMaintainable(model, f"{written} on the result of {kind}")
    for branch in set_operation_branches(tree):
        if not isinstance(branch, exp.Select):
            raise NotMaintainable(
                model,
                f"{kind} mixed with another set operation, or over a parenthesised query",
                "chain one set operation over plain SELECTs, or build a part as an ivm "
                "model of its own and ref() it",
            )


def takes(query: exp.Query) -> bool:
    return isinstance(query, exp.SetOperation)


def plan(model: QualifiedModel) -> ViewPlan:
    """One state row per distinct output row, with its count in all operands (and in each)."""
    qualified = model.qualified
    assert isinstance(qualified, exp.SetOperation)
    kind = set_operation_kind(qualified)
    operands = set_operation_branches(qualified)
    refuse_untyped_outputs(model.model, model.described)
    refuse_incomparable_keys(model.model, model.described, "column")
    per_operand = SET_OPERATION_CLASSES[kind] is ViewClass.SET_OPERATION
    flattened = []
    for index, operand in enumerate(operands):
        assert isinstance(operand, exp.Select)
        _check_operand(model.model, kind, operand, len(model.described))
        flattened.append(_flattened_operand(operand, index if per_operand else None))
    key_columns = [counting.key_column(i) for i in range(len(model.described))]
    state = [*key_columns, counting.count_column()]
    if per_operand:
        state += [counting.operand_count_column(i) for i in range(len(operands))]
    view_class = SET_OPERATION_CLASSES[kind]
    return ViewPlan(
        model=model.model,
        view_class=view_class,
        sql=model.sql,
        query=model.query,
        sources=tuple(s for operand in flattened for s in sources_of(operand)),
        rows=union_all(flattened),
        keys=tuple(c.name for c in key_columns),
        state_columns=tuple(state),
        preaggregations=(),
        upstreams=model.upstreams_read,
        outputs=tuple(
            OutputColumn(name=name, data_type=data_type, expression=aggregates.state_column(c.name))
            for (name, data_type), c in zip(model.described, key_columns)
        ),
        having=None,
        fingerprint=model.fingerprint(view_class),
        set_operation=kind,
    )


def _check_operand(model: str, kind: str, operand: exp.Select, columns: int) -> None:
    """Refuse an operand whose rows are not a plain filter and projection of joined sources."""
    if (
        operand.args.get("group")
        or operand.args.get("having")
        or operand.args.get("distinct")
        or any(p.find(exp.AggFunc) for p in operand.expressions)
    ):
        raise NotMaintainable(
            model, f"an operand of {kind} that aggregates or uses DISTINCT", BUILD_IT_APART
        )
    if semi_joins.has_semi_join(operand):
        raise NotMaintainable(
            model, f"a LEFT SEMI or LEFT ANTI JOIN inside an operand of {kind}", BUILD_IT_APART
        )
    if outer_joins.has_outer_join(operand):
        raise NotMaintainable(model, f"an outer join inside an operand of {kind}", BUILD_IT_APART)
    if len(operand.expressions) != columns:
        raise NotMaintainable(
            model,
            f"{kind} operands with {len(operand.expressions)} and {columns} columns",
            "give every operand the same columns",
        )


def _flattened_operand(operand: exp.Select, index: int | None) -> exp.Select:
    """The operand's columns as the row keys, and its index when counts are kept per operand."""
    columns = [
        exp.alias_(
            (p.this if isinstance(p, exp.Alias) else p).copy(), names.group_key(i), quoted=True
        )
        for i, p in enumerate(operand.expressions)
    ]
    if index is not None:
        columns.append(exp.alias_(exp.Literal.number(index), names.OPERAND, quoted=True))
    return with_clauses(exp.Select(expressions=columns), operand, ("from_", "joins", "where"))


# -- the state's queries and its view ----------------------------------------------


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """COUNT(*) over all operands and, per operand, over its rows (state_rows.py)."""
    return state_rows.build_query(plan, versions, rows_filter)


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """The sum of every operand's change, each by the join rule over its own sources."""
    return state_rows.change_query(plan, ranges, state, bounds, join_reads)


def leaves_state(plan: ViewPlan, emptied: exp.Expr) -> exp.Expr | None:
    """A row leaves the state when no operand produces it any more."""
    return emptied


def view(plan: ViewPlan, rows: exp.Select) -> exp.Select:
    """INTERSECT: rows every operand has; EXCEPT: rows the first has and no other; ALL: how often."""
    rows = rows.where(counting.populated())
    copies = _copies(plan)
    if copies is None:
        return rows.where(_kept(plan))
    rows = rows.where(exp.GT(this=copies.copy(), expression=exp.Literal.number(0)))
    return counting.repeated(rows, copies)


def _operand_counts(plan: ViewPlan) -> list[exp.Column]:
    return [
        exp.column(c.name, quoted=True)
        for c in plan.state_columns
        if names.is_operand_count(c.name)
    ]


def _copies(plan: ViewPlan) -> exp.Expr | None:
    """How many times the view repeats a state row; None when it shows it at most once."""
    if plan.set_operation == "INTERSECT ALL":
        return exp.Least(this=_operand_counts(plan)[0], expressions=_operand_counts(plan)[1:])
    if plan.set_operation == "EXCEPT ALL":
        first, *rest = _operand_counts(plan)
        removed: exp.Expr = rest[0]
        for count in rest[1:]:
            removed = exp.Add(this=removed, expression=count)
        return exp.Sub(this=first, expression=exp.Paren(this=removed))
    return None


def _kept(plan: ViewPlan) -> exp.Expr:
    """INTERSECT: a row every operand produces; EXCEPT: one the first produces and no other."""
    first, *rest = _operand_counts(plan)
    present = [exp.GT(this=c, expression=exp.Literal.number(0)) for c in (first, *rest)]
    if plan.set_operation == "INTERSECT":
        return exp.and_(*present)
    absent = [exp.EQ(this=c.copy(), expression=exp.Literal.number(0)) for c in rest]
    return exp.and_(present[0], *absent)
