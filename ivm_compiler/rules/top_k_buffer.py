"""A top-k state kept to its best rows: the rows up to an edge, not every candidate.

A top-k model (`ORDER BY ... LIMIT k`, view_classes/top_k.py) whose state
rows are its output rows (a projection or a DISTINCT: a row never changes
its values, it only comes and goes) keeps the rows at or before an edge in
the model's own order, not all of them:

- its build keeps the rows at or before the `rows_kept`-th best one (ties
  with it included), so every row past the edge is strictly after every
  kept row;
- a refresh keeps the change rows at or before the state's worst row, its
  edge now, and merges them as any change; those past it are left out. A
  state that shows fewer than k rows keeps every change row.

Invariant: the state holds exactly the model's rows at or before its worst
row, with their counts, or, while it shows fewer than k rows, every row of
the model. A row at or before the edge that the change adds is kept, one it
removes was kept and is removed, and one past it was never kept and stays
out; the worst row after the change is at or before the one before, so the
invariant holds again. While the state shows at least k rows, those are the
top k: every row it lacks comes after all of its rows.

A change that could leave a state of k rows or more fewer than k (its
removals counted against what the state shows: a projection's copies, a
DISTINCT's rows) fails the MERGE with SHORT, having written nothing, and
the refresh recomputes the best rows from the query (refresh/recipe.py).
The decisions are the statement's own: the edge and what the state shows
are read from the state the MERGE writes, so a refresh runs no statement
more than for any projection.

An aggregate's group rows change their values with any change, so a group
past the edge may move before it: those states keep every group (and the
windows' rows change with their partitions), as does a log state. The
warehouse's `mart_top_customers` (the ten best of 1.8 M customers at scale
6000) kept all 1.8 M rows; its build took 14.3 s against a 2.1 s `table`
build and a day's refresh 9.7-19.9 s against 3 s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from ivm_compiler import names, state_rows
from ivm_compiler.plan import ViewClass, ViewPlan
from ivm_compiler.rules import counting
from ivm_compiler.sql import TableName, ident
from ivm_compiler.view_classes.top_k import Ordering, TopK

# The state keeps at least this many rows (and ROWS_PER_K times k): the
# refresh recomputes when a change may leave it fewer than k, so the margin
# is the rows a change can remove before that. 10,000 rows are a few hundred
# kilobytes, read and merged in well under a second.
MIN_ROWS = 10_000
ROWS_PER_K = 10

# The classes whose state rows are the model's rows, kept or dropped whole.
CLASSES = (ViewClass.PROJECTION, ViewClass.DISTINCT)

EDGE_ALIAS = f"{names.RESERVED_PREFIX}edge"
KEPT_ALIAS = f"{names.RESERVED_PREFIX}kept"
BEST_CTE = f"{names.RESERVED_PREFIX}best"
SHOWN_ALIAS = f"{names.RESERVED_PREFIX}shown_rows"
WORST_ALIAS = f"{names.RESERVED_PREFIX}worst"
# How many rows the state's view shows before its LIMIT.
SHOWN = f"{names.RESERVED_PREFIX}shown"
# Set on a change row when the change may leave the state fewer than k rows.
SHORT_COLUMN = f"{names.RESERVED_PREFIX}short"
# The MERGE's error then (refuse_short).
SHORT = "ivm top-k short"


def keeps_best_rows(plan: ViewPlan) -> bool:
    """A top-k model whose state keeps only its rows up to an edge (module docstring)."""
    return plan.top_k is not None and plan.view_class in CLASSES and not plan.log_state


def rows_kept(top: TopK) -> int:
    """How many of the best rows a build keeps (more where rows tie with the last).

    >>> rows_kept(TopK(order=(), limit=10)), rows_kept(TopK(order=(), limit=5000))
    (10000, 50000)
    """
    return max(MIN_ROWS, ROWS_PER_K * top.limit)


def best_rows(
    plan: ViewPlan, versions: Mapping[TableName, int], rows_filter: exp.Expr | None = None
) -> exp.Query:
    """The state's rows at or before the `rows_kept`-th best: a build's or a recompute's state.

    The edge is found among the flattened rows, before they are grouped:
    the `rows_kept`-th best row for a projection (its state then shows at
    least that many copies), the `rows_kept`-th best distinct ordering for a
    DISTINCT (at least that many distinct rows). Only the rows at or before
    it are grouped, so the build shuffles a few thousand rows where grouping
    every row shuffled the whole input (the warehouse's 1.8 M customers, twice).
    """
    assert plan.top_k is not None
    flat = exp.to_table(names.ROWS_ALIAS, quoted=True)
    best = exp.select(*_ordering_values(plan, None)).from_(flat.copy())
    if plan.view_class is ViewClass.DISTINCT:
        best = best.distinct()
    best = best.order_by(*_orderings(plan, None)).limit(rows_kept(plan.top_k))
    kept = _within_edge(plan, flat.copy().as_(KEPT_ALIAS, quoted=True), _last(plan, best))
    return (
        state_rows.group_select(plan, BEST_CTE, from_changes=False)
        .with_(names.ROWS_ALIAS, as_=state_rows.rows_to_build(plan, versions, rows_filter))
        .with_(BEST_CTE, as_=kept)
    )


def changes_within_edge(plan: ViewPlan, changes: exp.Query, state: TableName) -> exp.Select:
    """The change rows the state keeps, each marked SHORT_COLUMN if the change may leave
    the state fewer than k rows where it showed k or more.

    Every row while the state shows fewer than k; else those at or before its
    worst. What the change may remove is counted against what the state
    shows: a projection's copies exactly, a DISTINCT's rows as one per change
    row that lowers a row's count (which need not empty it), so a DISTINCT
    may be recomputed where it would still show k, never the other way.
    """
    assert plan.top_k is not None
    kept_rows = exp.and_(exp.column(names.GUARD, quoted=True).is_(exp.null()), counting.populated())
    worst = _last(
        plan,
        exp.select(*_ordering_values(plan, None)).from_(state.to_table()).where(kept_rows),
    )
    shown = exp.select(exp.alias_(_shown_count(plan), SHOWN, quoted=True)).from_(state.to_table())
    # One row whatever the state holds: what it shows, and its worst row (NULLs if none).
    edge = (
        exp.select(exp.Star())
        .from_(shown.where(kept_rows.copy()).subquery(ident(SHOWN_ALIAS)))
        .join(worst.subquery(ident(WORST_ALIAS)), on=exp.true(), join_type="LEFT")
    )
    limit = exp.Literal.number(plan.top_k.limit)
    shows = exp.column(SHOWN, table=ident(EDGE_ALIAS), quoted=True)
    count = exp.column(names.COUNT, table=ident(KEPT_ALIAS), quoted=True)
    removed = exp.If(
        this=exp.LT(this=count, expression=exp.Literal.number(0)),
        true=exp.Neg(this=count.copy())
        if plan.view_class is ViewClass.PROJECTION
        else exp.Literal.number(1),
        false=exp.Literal.number(0),
    )
    short = exp.and_(
        exp.GTE(this=shows.copy(), expression=limit.copy()),
        exp.LT(
            this=exp.Sub(this=shows.copy(), expression=exp.Window(this=exp.func("SUM", removed))),
            expression=limit.copy(),
        ),
    )
    kept = _within_edge(
        plan,
        changes.subquery(ident(KEPT_ALIAS)),
        edge,
        unless=exp.LT(this=shows.copy(), expression=limit.copy()),
    )
    return kept.select(exp.alias_(short, SHORT_COLUMN, quoted=True))


def refuse_short(state: TableName) -> exp.When:
    """A MERGE clause that fails the MERGE where SHORT_COLUMN holds (changes_within_edge).

    A change that removes shown rows removes rows the state keeps, so a
    change row marked SHORT matches a state row.
    """
    error = exp.Anonymous(
        this="RAISE_ERROR",
        expressions=[
            exp.Literal.string(
                f"{SHORT}: the change may leave {state} fewer rows than its view shows; "
                "the best rows are recomputed from the query"
            )
        ],
    )
    return exp.When(
        matched=True,
        source=False,
        condition=exp.column(SHORT_COLUMN, table=ident(names.CHANGE_ALIAS), quoted=True),
        then=exp.Update(
            expressions=[
                exp.EQ(
                    this=exp.column(names.GUARD, table=ident(names.TARGET_ALIAS), quoted=True),
                    expression=error,
                )
            ]
        ),
    )


def _shown_count(plan: ViewPlan) -> exp.Expr:
    """The rows the view shows before its LIMIT: a projection's copies, a DISTINCT's rows."""
    if plan.view_class is ViewClass.PROJECTION:
        return exp.func(
            "COALESCE", exp.func("SUM", exp.column(names.COUNT, quoted=True)), exp.Literal.number(0)
        )
    return exp.func("COUNT", exp.Star())


def _output(plan: ViewPlan, ordering: Ordering) -> exp.Expr:
    """The state expression of an ordering's output column (a key column of the state)."""
    (column,) = [o for o in plan.outputs if o.name == ordering.output]
    return column.expression


def _qualified(expression: exp.Expr, table: str | None) -> exp.Expr:
    if table is None:
        return expression.copy()
    return expression.transform(
        lambda node: (
            exp.column(node.name, table=ident(table), quoted=True)
            if isinstance(node, exp.Column)
            else node
        )
    )


def _edge_column(index: int) -> str:
    return f"{EDGE_ALIAS}{index}"


def _ordering_values(plan: ViewPlan, table: str | None) -> list[exp.Expr]:
    """Each ordering's value, named as the edge row names it."""
    assert plan.top_k is not None
    return [
        exp.alias_(_qualified(_output(plan, o), table), _edge_column(i), quoted=True)
        for i, o in enumerate(plan.top_k.order)
    ]


def _orderings(plan: ViewPlan, table: str | None, reverse: bool = False) -> list[exp.Ordered]:
    """The model's ORDER BY over the edge columns; `reverse`: worst first."""
    assert plan.top_k is not None
    return [
        exp.Ordered(
            this=exp.column(_edge_column(i), table=ident(table) if table else None, quoted=True),
            desc=o.descending != reverse,
            nulls_first=o.nulls_first != reverse,
        )
        for i, o in enumerate(plan.top_k.order)
    ]


def _last(plan: ViewPlan, values: exp.Select) -> exp.Select:
    """The worst row of `values` (edge columns) in the model's order: the edge."""
    return (
        exp.select(exp.Star())
        .from_(values.subquery(ident(EDGE_ALIAS)))
        .order_by(*_orderings(plan, None, reverse=True))
        .limit(1)
    )


def _within_edge(
    plan: ViewPlan, rows: exp.Expr, edge: exp.Select, unless: exp.Expr | None = None
) -> exp.Select:
    """`rows` (a relation named KEPT_ALIAS) at or before the one-row `edge` in the model's
    order (all of them where `unless` holds); none if `edge` has no row."""
    assert plan.top_k is not None
    values = [_qualified(_output(plan, o), KEPT_ALIAS) for o in plan.top_k.order]
    edges = [
        exp.column(_edge_column(i), table=ident(EDGE_ALIAS), quoted=True)
        for i in range(len(plan.top_k.order))
    ]
    within = at_or_before(values, edges, plan.top_k.order)
    return (
        exp.select(exp.Column(this=exp.Star(), table=ident(KEPT_ALIAS)))
        .from_(rows)
        .join(edge.subquery(ident(EDGE_ALIAS)), join_type="CROSS")
        .where(exp.or_(unless, within) if unless is not None else within)
    )


def at_or_before(
    values: Sequence[exp.Expr], edges: Sequence[exp.Expr], order: tuple[Ordering, ...]
) -> exp.Expr:
    """`values` come at or before `edges` in `order` (directions and NULL placement as Spark's).

    Descending with NULLs last, `a` is before a NULL edge, after it if NULL
    itself (unless both are), and otherwise by the greater value:

    >>> o = (Ordering("v", descending=True, nulls_first=False),)
    >>> at_or_before([exp.column("a")], [exp.column("e")], o).sql(dialect="spark")
    '((e IS NULL AND NOT a IS NULL) OR COALESCE(a > e, FALSE)) OR a IS NOT DISTINCT FROM e'
    """
    if not order:
        return exp.true()
    value, edge, ordering = values[0], edges[0], order[0]
    rest = at_or_before(values[1:], edges[1:], order[1:])
    same = exp.NullSafeEQ(this=value.copy(), expression=edge.copy())
    tied = same if isinstance(rest, exp.Boolean) else exp.and_(same, exp.paren(rest))
    return exp.or_(_strictly_before(value, edge, ordering), tied)


def _strictly_before(value: exp.Expr, edge: exp.Expr, ordering: Ordering) -> exp.Expr:
    """`value` strictly before `edge` in one ordering: by NULL placement, then by value."""
    null, present = (value, edge) if ordering.nulls_first else (edge, value)
    by_null = exp.paren(
        exp.and_(null.copy().is_(exp.null()), exp.not_(present.copy().is_(exp.null())))
    )
    compare = exp.GT if ordering.descending else exp.LT
    by_value = exp.func("COALESCE", compare(this=value.copy(), expression=edge.copy()), exp.false())
    return exp.or_(by_null, by_value)
