"""COVAR_POP, COVAR_SAMP and CORR: a co-moment beside the moments of each argument.

Spark computes all three as DOUBLE over the pairs where neither argument is
NULL; a NaN or an infinity in a pair makes the answer NaN. For the pairs
where both values are finite the state keeps, beside each argument's moments
(rules/moments.py: count, mean, M2), their co-moment

    C = sum((x - mean x) * (y - mean y))    (names.co_moment_of)

merged by the same rule of Chan, Golub and LeVeque as M2, with the product
of the two arguments' mean differences where M2 has a square:
C = Ca + Cb + (mean xb - mean xa) (mean yb - mean ya) na nb / n. The
textbook sum of products, sum(xy) - n mean x mean y, would cancel
catastrophically as a sum of squares does.

compile.py rewrites every call before a view class plans the query, as
rules/booleans.py does for BOOL_AND, into an expression over aggregates the
aggregate class keeps: the COUNT of pairs, the COUNT of pairs with a
non-finite value, the co-moment (CoMoment, an aggregate of this module's
own, never sent to Spark) and, for CORR, the two VAR_POPs, MIN and MAX:

    COVAR_POP(x, y)   ->  CASE WHEN pairs = 0 THEN NULL WHEN non-finite > 0 THEN NaN
                               ELSE C / pairs END
    COVAR_SAMP(x, y)  ->  the same with pairs < 2 and C / (pairs - 1)
    CORR(x, y)        ->  CASE WHEN pairs < 2 THEN NULL WHEN non-finite > 0 THEN NaN
                               WHEN MIN(x) = MAX(x) OR MIN(y) = MAX(y) THEN NULL
                               ELSE C / pairs / SQRT(VAR_POP(x) * VAR_POP(y)) END

Spark's CORR is NULL when either argument takes one value only (it divides
by a zero variance). A variance kept through deletions may end a few ulps
above zero where the recomputed one is exactly zero, which would turn that
NULL into noise; MIN = MAX (pre-aggregations, rules/extremes.py) says exactly
that all values are equal.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar, cast

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn
from ivm_compiler.rules import floating, moments
from ivm_compiler.rules.counting import sign
from ivm_compiler.rules.floating import DOUBLE, Columns, double
from ivm_compiler.rules.moments import is_zero, product
from ivm_compiler.sql import divided, minus, plus, times

Tree = TypeVar("Tree", bound=exp.Expr)

AGGREGATES: tuple[type[exp.Expr], ...] = (exp.CovarPop, exp.CovarSamp, exp.Corr)


class CoMoment(exp.Expression, exp.AggFunc):
    """sum((x - mean x) * (y - mean y)) of a group: as_aggregates writes it, the state keeps it."""

    arg_types: ClassVar[dict[str, bool]] = {"this": True, "expression": True}


def as_aggregates(tree: Tree) -> Tree:
    """Every COVAR_POP/COVAR_SAMP/CORR of a group as its expression over kept aggregates.

    A window's COVAR_POP is left to the window class, which refuses it.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select covar_pop(x, y) as c from t", read="spark")
    >>> print(as_aggregates(q).sql("spark"))  # doctest: +ELLIPSIS
    SELECT CASE WHEN COUNT(CASE WHEN NOT CAST(x AS DOUBLE) IS NULL AND ... THEN 1 END) = 0 THEN NULL WHEN COUNT(...) > 0 THEN CAST('NaN' AS DOUBLE) ELSE CO_MOMENT(...) / COUNT(...) END AS c FROM t
    """

    def rewritten(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, AGGREGATES) or isinstance(node.parent, exp.Window):
            return node
        return _as_aggregates(node)

    return cast(Tree, tree.transform(rewritten))


def _as_aggregates(call: exp.Expr) -> exp.Expr:
    x = exp.cast(call.this.copy(), DOUBLE)
    y = exp.cast(call.expression.copy(), DOUBLE)
    is_pair = exp.and_(_is_known(x), _is_known(y))
    both_finite = exp.and_(floating.finite(x), floating.finite(y))
    pairs = _count_where(is_pair)
    non_finite = _count_where(exp.and_(is_pair.copy(), exp.Not(this=exp.paren(both_finite))))
    # Each argument where the pair is finite: the rows the moments and co-moment read.
    x_kept, y_kept = _where(both_finite, x), _where(both_finite, y)
    co_moment = CoMoment(this=x_kept, expression=y_kept)

    def below(count: int) -> exp.Expr:
        return exp.LT(this=pairs.copy(), expression=exp.Literal.number(count))

    nan = exp.If(this=exp.GT(this=non_finite, expression=exp.Literal.number(0)), true=double("NaN"))
    if isinstance(call, exp.CovarPop):
        none = exp.EQ(this=pairs.copy(), expression=exp.Literal.number(0))
        return _case([(none, exp.null()), nan], divided(co_moment, pairs.copy()))
    if isinstance(call, exp.CovarSamp):
        samples = exp.paren(minus(pairs.copy(), exp.Literal.number(1)))
        return _case([(below(2), exp.null()), nan], divided(co_moment, samples))

    def constant(value: exp.Expr) -> exp.Expr:
        return exp.EQ(this=exp.Min(this=value.copy()), expression=exp.Max(this=value.copy()))

    spread = exp.Sqrt(
        this=times(exp.VariancePop(this=x_kept.copy()), exp.VariancePop(this=y_kept.copy()))
    )
    return _case(
        [
            (below(2), exp.null()),
            nan,
            (exp.or_(constant(x_kept), constant(y_kept)), exp.null()),
        ],
        divided(divided(co_moment, pairs.copy()), spread),
    )


def _is_known(value: exp.Expr) -> exp.Expr:
    return exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))


def _count_where(condition: exp.Expr) -> exp.Expr:
    return exp.Count(this=exp.Case(ifs=[exp.If(this=condition.copy(), true=exp.Literal.number(1))]))


def _where(condition: exp.Expr, value: exp.Expr) -> exp.Expr:
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])


def _case(ifs: list[tuple[exp.Expr, exp.Expr] | exp.If], default: exp.Expr) -> exp.Expr:
    return exp.Case(
        ifs=[i if isinstance(i, exp.If) else exp.If(this=i[0], true=i[1]) for i in ifs],
        default=default,
    )


def columns(x_index: int, y_index: int) -> list[StateColumn]:
    """The co-moment of arguments x_index and y_index, and its change's removed part.

    Both arguments are NULL outside the pairs the co-moment reads, so
    Spark's COVAR_POP over them times their count is the co-moment.
    """
    x = exp.column(names.argument(x_index), quoted=True)
    y = exp.column(names.argument(y_index), quoted=True)

    def co_moment(condition: exp.Expr | None) -> exp.Expr:
        def kept(value: exp.Expr) -> exp.Expr:
            return value.copy() if condition is None else _where(condition, value)

        return exp.Coalesce(
            this=times(
                exp.CovarPop(this=kept(x), expression=kept(y)),
                exp.Count(this=kept(x), big_int=True),
            ),
            expressions=[double("0")],
        )

    inserted = exp.GT(this=sign(), expression=exp.Literal.number(0))
    removed = exp.LT(this=sign(), expression=exp.Literal.number(0))
    return [
        StateColumn(
            names.co_moment_of(x_index, y_index),
            MergeRule.CO_MOMENT,
            co_moment(None),
            co_moment(inserted),
            argument=x_index,
            partner=y_index,
        ),
        StateColumn(
            names.removed_co_moment_of(x_index, y_index),
            MergeRule.CHANGE_ONLY,
            None,
            co_moment(removed),
        ),
    ]


def merged(
    column: StateColumn, stored: Columns, change: Columns, counts: moments.CountsOf | None = None
) -> exp.Expr:
    """The new co-moment of a group: stored (+) inserted (-) removed.

    With each argument's counts and means as rules/moments.py merges them
    (or as `counts` gives them):
    adding b to a, C = Ca + Cb + dx * dy * na * nb / n (d: mean_b - mean_a);
    taking b out of s, Ca = Cs - Cb - dx * dy * na * nb / ns, where a's means
    are those after the removal. A new group's stored co-moment is NULL: 0;
    one pair left has a co-moment of exactly 0.
    """
    assert column.argument is not None and column.partner is not None

    def counted(index: int) -> moments.MergedCounts:
        return counts(index) if counts else moments.merged_counts(index, stored, change)

    x, y = counted(column.argument), counted(column.partner)
    name = names.co_moment_of(column.argument, column.partner)
    removed_name = names.removed_co_moment_of(column.argument, column.partner)
    c_s = floating.zero_if_null(stored(name))
    c_in = floating.zero_if_null(change(name))
    c_out = floating.zero_if_null(change(removed_name))

    union_step = divided(
        product(minus(x.mean_in, x.mean_s), minus(y.mean_in, y.mean_s), x.n_s, x.n_in),
        x.n_union,
    )
    c_union = _case(
        [(is_zero(x.n_in), c_s.copy()), (is_zero(x.n_s), c_in.copy())],
        plus(plus(c_s, c_in), union_step),
    )
    removal_step = divided(
        product(minus(x.mean_out, x.mean_new), minus(y.mean_out, y.mean_new), x.n_new, x.n_out),
        x.n_union,
    )
    return _case(
        [
            (is_zero(x.n_out), c_union.copy()),
            (exp.LTE(this=x.n_new.copy(), expression=exp.Literal.number(1)), double("0")),
        ],
        minus(minus(c_union, c_out), removal_step),
    )
