"""STDDEV and VARIANCE (sample and population): the count, mean and squared deviations of a group.

For each argument x the state keeps, over the group's finite x,
- names.moment_count_of(i): n, how many there are,
- names.mean_of(i): their mean (NULL when n = 0), and
- names.squared_deviations_of(i): M2 = sum((x - mean)^2),
from which VAR_POP = M2 / n and VAR_SAMP = M2 / (n - 1), as Spark's own
aggregates compute them. The textbook alternative, a sum and a sum of squares,
cancels catastrophically (for values near 1e9 with a spread of 1, the two
terms agree in their first 18 digits and their difference is noise); the mean
and M2 do not.

A change is kept as two parts, because a signed batch has no mean when its
inserts and deletes are as many (an update): the inserted values' (n, mean,
M2), in the state's column names, and the removed values' (CHANGE_ONLY
columns). The MERGE combines them into the stored moments in two steps, each
by Chan, Golub and LeVeque's rule for the moments of a union:
first the inserted values are added (the union), then the removed ones taken
out of it (the same rule solved for one part), so no step has a negative
count. A group whose count returns to 0 gets exactly (0, NULL, 0), and
rounding never makes M2 negative (it is clamped at 0).

A floating-point argument's NaN and infinities are counted by
rules/floating.py and left out of the moments: Spark's result is NaN then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn
from ivm_compiler.rules import floating
from ivm_compiler.rules.counting import sign
from ivm_compiler.rules.floating import Columns, double
from ivm_compiler.sql import divided, minus, plus, times

# sqlglot's node for each maintained aggregate, and (population?, square root?).
KINDS: dict[type[exp.Expr], tuple[bool, bool]] = {
    exp.Stddev: (False, True),
    exp.StddevSamp: (False, True),
    exp.StddevPop: (True, True),
    exp.Variance: (False, False),
    exp.VariancePop: (True, False),
}
AGGREGATES: tuple[type[exp.Expr], ...] = tuple(KINDS)


def columns(index: int, argument: exp.Expr, is_floating: bool) -> list[StateColumn]:
    """The moments' state columns (n, mean, M2) and the change's removed part."""
    value = floating.as_double(argument)
    kept: exp.Expr = (
        floating.finite(value)
        if is_floating
        else exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))
    )
    inserted = exp.and_(kept.copy(), exp.GT(this=sign(), expression=exp.Literal.number(0)))
    removed = exp.and_(kept.copy(), exp.LT(this=sign(), expression=exp.Literal.number(0)))

    def count(condition: exp.Expr, weight: exp.Expr) -> exp.Expr:
        return exp.Sum(this=exp.If(this=condition.copy(), true=weight, false=exp.Literal.number(0)))

    def values(condition: exp.Expr) -> exp.Expr:
        return exp.If(this=condition.copy(), true=value.copy(), false=exp.null())

    def mean(condition: exp.Expr) -> exp.Expr:
        return exp.Avg(this=values(condition))

    def deviations(condition: exp.Expr) -> exp.Expr:
        # VAR_POP * n is M2 as Spark's CentralMomentAgg accumulates it.
        return exp.Coalesce(
            this=times(
                exp.VariancePop(this=values(condition)),
                exp.Count(this=values(condition), big_int=True),
            ),
            expressions=[double("0")],
        )

    one = exp.Literal.number(1)
    # COUNT, not SUM: a global aggregate over no rows must store 0, not NULL.
    counted = exp.Count(this=values(kept), big_int=True)
    return [
        StateColumn(names.moment_count_of(index), MergeRule.ADD, counted, count(kept, sign())),
        StateColumn(
            names.mean_of(index), MergeRule.MOMENT, mean(kept), mean(inserted), argument=index
        ),
        StateColumn(
            names.squared_deviations_of(index),
            MergeRule.MOMENT,
            deviations(kept),
            deviations(inserted),
            argument=index,
        ),
        StateColumn(names.added_count_of(index), MergeRule.CHANGE_ONLY, None, count(inserted, one)),
        StateColumn(
            names.removed_count_of(index), MergeRule.CHANGE_ONLY, None, count(removed, one)
        ),
        StateColumn(names.removed_mean_of(index), MergeRule.CHANGE_ONLY, None, mean(removed)),
        StateColumn(
            names.removed_squared_deviations_of(index),
            MergeRule.CHANGE_ONLY,
            None,
            deviations(removed),
        ),
    ]


def _as_double(value: exp.Expr) -> exp.Expr:
    return exp.cast(value, floating.DOUBLE)


def _when(condition: exp.Expr, then: exp.Expr, otherwise: exp.Expr) -> exp.Expr:
    return exp.Case(ifs=[exp.If(this=condition, true=then)], default=otherwise)


def is_zero(value: exp.Expr) -> exp.Expr:
    return exp.EQ(this=value.copy(), expression=exp.Literal.number(0))


def product(*factors: exp.Expr) -> exp.Expr:
    product = factors[0].copy()
    for factor in factors[1:]:
        product = times(product, factor.copy())
    return product


@dataclass(frozen=True)
class MergedCounts:
    """One argument's counts and means through a MERGE's two steps (see merged).

    s: the stored values, in: the inserted ones, union: both, out: the
    removed ones, new: what remains. rules/covariance.py reads them for two
    arguments at once.
    """

    n_s: exp.Expr
    n_in: exp.Expr
    n_union: exp.Expr
    n_out: exp.Expr
    n_new: exp.Expr
    mean_s: exp.Expr
    mean_in: exp.Expr
    mean_union: exp.Expr
    mean_out: exp.Expr
    mean_new: exp.Expr


def merged_counts(index: int, stored: Columns, change: Columns) -> MergedCounts:
    """Argument `index`'s counts and means: stored (+) inserted (-) removed.

    Adding part b to a: n = na + nb, mean = mean_a + (mean_b - mean_a) * nb / n.
    Taking part b out of s (so a = s - b, na = ns - nb):
    mean_a = mean_s + (mean_s - mean_b) * nb / na.
    A new group's stored values are NULL: n 0.
    """
    zero = exp.Literal.number(0)
    n_s = _as_double(exp.Coalesce(this=stored(names.moment_count_of(index)), expressions=[zero]))
    mean_s = stored(names.mean_of(index))
    n_in = _as_double(change(names.added_count_of(index)))
    mean_in = change(names.mean_of(index))
    n_out = _as_double(change(names.removed_count_of(index)))
    mean_out = change(names.removed_mean_of(index))
    # Step 1: the union of the stored values and the inserted ones.
    n_union = plus(n_s, n_in)
    mean_union = _when(
        is_zero(n_in),
        mean_s.copy(),
        _when(
            is_zero(n_s),
            mean_in.copy(),
            plus(mean_s.copy(), divided(product(minus(mean_in, mean_s), n_in), n_union)),
        ),
    )
    # Step 2: the removed values taken out of that union.
    n_new = minus(n_union, n_out)
    mean_new = mean_after_removal(mean_union, n_out, n_new, mean_out)
    return MergedCounts(
        n_s, n_in, n_union, n_out, n_new, mean_s, mean_in, mean_union, mean_out, mean_new
    )


def mean_after_removal(
    mean_union: exp.Expr, n_out: exp.Expr, n_new: exp.Expr, mean_out: exp.Expr
) -> exp.Expr:
    """The mean of what remains when n_out values of mean mean_out leave the union."""
    return _when(
        is_zero(n_out),
        mean_union.copy(),
        _when(
            is_zero(n_new),
            exp.null(),
            plus(
                mean_union.copy(),
                divided(product(minus(mean_union.copy(), mean_out), n_out), n_new),
            ),
        ),
    )


# An argument's MergedCounts: merged_counts's expressions, or columns that hold them.
CountsOf = Callable[[int], MergedCounts]


def merged(
    column: StateColumn, stored: Columns, change: Columns, counts: CountsOf | None = None
) -> exp.Expr:
    """The new mean or M2 of a group: stored (+) inserted (-) removed.

    The means as merged_counts (or as `counts` gives them); adding part b to
    a, with d = mean_b - mean_a: M2 = M2_a + M2_b + d^2 * na * nb / n. Taking
    part b out of s: M2_a = M2_s - M2_b - (mean_b - mean_a)^2 * na * nb / ns.
    A new group's stored M2 is NULL: 0; one value left has an M2 of exactly 0.
    """
    index = column.argument
    assert index is not None
    c = counts(index) if counts else merged_counts(index, stored, change)
    if column.name == names.mean_of(index):
        return c.mean_new
    assert column.name == names.squared_deviations_of(index)
    m2_union, taken_out = _m2_steps(index, c, stored, change)
    return _when(
        is_zero(c.n_out),
        m2_union,
        _when(
            exp.LTE(this=c.n_new.copy(), expression=exp.Literal.number(1)),
            double("0"),
            # Not GREATEST(taken_out, 0), which is 0 where taken_out is NULL: on a
            # pre-aggregation's row (slot > 0) the build's NULL must stay NULL.
            _when(exp.LT(this=taken_out, expression=double("0")), double("0"), taken_out.copy()),
        ),
    )


def _m2_steps(
    index: int, c: MergedCounts, stored: Columns, change: Columns
) -> tuple[exp.Expr, exp.Expr]:
    """Argument `index`'s M2 of the union, and of what remains once the removed values are out."""
    m2_s = floating.zero_if_null(stored(names.squared_deviations_of(index)))
    m2_in = floating.zero_if_null(change(names.squared_deviations_of(index)))
    m2_out = floating.zero_if_null(change(names.removed_squared_deviations_of(index)))
    step = minus(c.mean_in, c.mean_s)
    m2_union = _when(
        is_zero(c.n_in),
        m2_s.copy(),
        _when(
            is_zero(c.n_s),
            m2_in.copy(),
            plus(
                plus(m2_s.copy(), m2_in.copy()),
                divided(product(step, step, c.n_s, c.n_in), c.n_union),
            ),
        ),
    )
    apart = minus(c.mean_out.copy(), c.mean_new)
    taken_out = minus(
        minus(m2_union.copy(), m2_out),
        divided(product(apart, apart, c.n_new, c.n_out), c.n_union),
    )
    return m2_union, taken_out


def cancels(index: int, stored: Columns, change: Columns, counts: CountsOf) -> exp.Expr:
    """Whether removing argument `index`'s removed values cancels past floating.CANCELLATION_LIMIT.

    Two ways: the remaining values' sum (n * mean) is below the limit of the
    sums it was taken from (|union| + |removed|), unless the remaining
    values' spread, sqrt(M2 * n), is above it (a mean near 0 is known as
    well as their spread); or, with two values or more left, their M2 is
    below the limit of the union's M2. NULL (no cancellation) on a row
    without moments. The refresh then recomputes the model (emit.CANCELLED).
    """
    c = counts(index)
    m2_union, taken_out = _m2_steps(index, c, stored, change)
    limit = double(repr(floating.CANCELLATION_LIMIT))

    def magnitude(n: exp.Expr, mean: exp.Expr) -> exp.Expr:
        return exp.Abs(this=times(n.copy(), mean.copy()))

    before = times(plus(magnitude(c.n_union, c.mean_union), magnitude(c.n_out, c.mean_out)), limit)
    spread = exp.Sqrt(
        this=times(exp.Greatest(this=taken_out.copy(), expressions=[double("0")]), c.n_new.copy())
    )
    mean_lost = exp.GT(
        this=before,
        expression=exp.Greatest(this=magnitude(c.n_new, c.mean_new), expressions=[spread]),
    )
    spread_lost = exp.and_(
        exp.GT(this=c.n_new.copy(), expression=exp.Literal.number(1)),
        exp.GT(this=m2_union.copy(), expression=double("0")),
        exp.LT(this=taken_out.copy(), expression=times(m2_union.copy(), limit.copy())),
    )
    return exp.and_(
        exp.GT(this=c.n_out.copy(), expression=exp.Literal.number(0)),
        exp.GT(this=c.n_new.copy(), expression=exp.Literal.number(0)),
        exp.paren(exp.or_(mean_lost, exp.paren(spread_lost))),
    )


def finalize(node: exp.Expr, index: int, is_floating: bool) -> exp.Expr:
    """STDDEV*/VAR* of a group from its moments, with Spark's NULLs and NaN.

    NULL without values, VAR_SAMP and STDDEV_SAMP NULL with one value
    (spark.sql.legacy.statisticalAggregate off, the default), NaN when a
    floating-point argument has a NaN or an infinity.

    >>> finalize(exp.VariancePop(this=exp.column("x")), 0, False).sql(dialect="spark")
    'CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_m2_a0` AS DOUBLE) / `__ivm_nn_a0` END'
    """
    population, root = KINDS[type(node)]
    values = exp.column(names.non_null_count_of(index), quoted=True)
    m2 = _as_double(exp.column(names.squared_deviations_of(index), quoted=True))
    divisor: exp.Expr = (
        values.copy()
        if population
        else exp.paren(exp.Sub(this=values.copy(), expression=exp.Literal.number(1)))
    )
    result: exp.Expr = divided(m2, divisor)
    if root:
        result = exp.Sqrt(this=result)
    ifs = [exp.If(this=is_zero(values), true=exp.null())]
    if not population:
        ifs.append(
            exp.If(
                this=exp.EQ(this=values.copy(), expression=exp.Literal.number(1)), true=exp.null()
            )
        )
    if is_floating:
        ifs.append(exp.If(this=floating.has_non_finite(index), true=double("NaN")))
    return exp.Case(ifs=ifs, default=result)
