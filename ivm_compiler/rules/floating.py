"""SUM and AVG over floating-point arguments: a compensated sum and counts of non-finite values.

Spark adds DOUBLEs in whatever order its tasks meet them, so two
recomputations of one SUM may differ in the last bits; a refresh stays within
that, where a plain stored sum would not, for three reasons:

- Rounding that a delete does not undo. Add 1e17, then (in a later refresh)
  1.0, and a stored sum reads 1e17: the 1.0 was rounded away. Delete the
  1e17 and it reads 0.0 where the query says 1.0. So the sum is kept as a
  pair: every MERGE adds the change to the sum column and the exact rounding
  error of that addition (Knuth's TwoSum) to an error column, and the
  aggregate reads sum + error. Across refreshes the pair holds the exact sum
  of the changes; within one change the rows are summed by Spark's SUM, as a
  recomputation sums them.
- NaN and the infinities. Once added, no subtraction removes them (NaN - NaN
  and inf - inf are NaN). They are counted instead, the sum holds the finite
  values only, and the result follows Spark's arithmetic: NaN when the group
  has a NaN or both infinities, else the infinity it has, else the sum.

- Rounding within one SUM that a delete then exposes. Build over 1e17 and
  1.0 and Spark's SUM reads 1e17; delete the 1e17 and the stored sum is 0.0.
  No stored pair can know what a SUM rounded away, so each sum also keeps the
  mass that went through an inexact SUM (names.sum_mass_of: the absolute
  values summed, added on every build and change whose SUM may have rounded,
  never taken out) and its values' absolute total (names.sum_magnitude_of,
  added and taken out as the rows come and go). The MERGE refuses a change
  that leaves both the sum and that total below CANCELLATION_LIMIT of the
  mass (`cancels`): the refresh recomputes the group from the sources
  (emit.CANCELLED). A SUM is exact, and adds no mass, over one value, or
  over integers whose absolute sum is at most 2**53. The total, not the sum,
  decides for a ledger whose entries cancel (a balance back to 0): there a
  recomputation rounds as much as the refresh, and recomputing would not end.

These counts also decide STDDEV and VARIANCE over a floating-point argument
(rules/moments.py).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn
from ivm_compiler.rules.counting import sign
from ivm_compiler.sql import minus, plus, times

DOUBLE = exp.DataType.build("DOUBLE")

# A removal leaves what remains as the difference of two larger numbers, so
# it keeps the rounding error of those (a few units in their last place).
# Where what remains is below this fraction of them, more than 20 of a
# double's 53 bits cancelled, and the rest no longer holds the value to
# the last bits a recomputation would: deleting 1e9 from {-0.2, 0.1, 1e9}
# left an M2 of 128 where the two values left have 0.045 (rules/moments.py),
# and deleting 1e17 from a SUM built over {1e17, 1.0} left 0.0.
CANCELLATION_LIMIT = 2.0**-20
# Integers up to this magnitude are doubles, and so is every sum of them
# that stays within it: such a SUM does not round.
EXACT_INTEGERS = 2.0**53

# The stored value of a state column by name (the MERGE target's, or NULL for a new row),
# and the change row's.
Columns = Callable[[str], exp.Expr]


def double(value: str) -> exp.Expr:
    """A DOUBLE constant Spark and DuckDB both read: 'NaN', 'Infinity', '-Infinity' or a number."""
    return exp.cast(exp.Literal.string(value), DOUBLE)


def as_double(argument: exp.Expr) -> exp.Expr:
    return exp.cast(argument.copy(), DOUBLE)


def is_nan(value: exp.Expr) -> exp.Expr:
    return exp.IsNan(this=value.copy())


def finite(value: exp.Expr) -> exp.Expr:
    """The value is a finite number (neither NULL, NaN nor an infinity).

    >>> finite(exp.column("x")).sql(dialect="spark")
    "NOT ISNAN(x) AND ABS(x) <> CAST('Infinity' AS DOUBLE)"
    """
    return exp.and_(
        exp.Not(this=is_nan(value)),
        exp.NEQ(this=exp.Abs(this=value.copy()), expression=double("Infinity")),
    )


def _count_if(condition: exp.Expr, weight: exp.Expr) -> exp.Expr:
    return exp.Sum(this=exp.If(this=condition, true=weight, false=exp.Literal.number(0)))


# The state columns counting an argument's NaN, +Infinity and -Infinity values.
NON_FINITE_COUNTS: tuple[Callable[[int], str], ...] = (
    names.nan_count_of,
    names.positive_infinity_count_of,
    names.negative_infinity_count_of,
)


def _non_finite_kinds(value: exp.Expr) -> list[tuple[Callable[[int], str], exp.Expr]]:
    """Each count's column name and the condition it counts, in NON_FINITE_COUNTS' order."""
    conditions = (
        is_nan(value),
        exp.EQ(this=value.copy(), expression=double("Infinity")),
        exp.EQ(this=value.copy(), expression=double("-Infinity")),
    )
    return list(zip(NON_FINITE_COUNTS, conditions))


def columns(index: int, argument: exp.Expr, needs_sum: bool) -> list[StateColumn]:
    """The non-finite counts of a floating-point argument and, for SUM/AVG, its compensated sum."""
    value = as_double(argument)
    state = [
        StateColumn(
            name=name(index),
            rule=MergeRule.ADD,
            # COUNT, not SUM: a global aggregate over no rows must store 0, not NULL.
            build=exp.Count(
                this=exp.If(this=condition, true=exp.Literal.number(1), false=exp.null()),
                big_int=True,
            ),
            change=_count_if(condition.copy(), sign()),
        )
        for name, condition in _non_finite_kinds(value)
    ]
    if needs_sum:
        finite_value = exp.If(this=finite(value), true=value.copy(), false=exp.null())
        signed = exp.If(
            this=exp.GT(this=sign(), expression=exp.Literal.number(0)),
            true=finite_value,
            false=exp.Neg(this=finite_value.copy()),
        )
        state += [
            StateColumn(
                name=names.sum_of(index),
                rule=MergeRule.COMPENSATED_SUM,
                build=exp.Sum(this=finite_value.copy()),
                change=exp.Sum(this=signed),
                argument=index,
            ),
            StateColumn(
                name=names.sum_error_of(index),
                rule=MergeRule.SUM_ERROR,
                build=double("0"),
                change=double("0"),
                argument=index,
            ),
            StateColumn(
                name=names.sum_magnitude_of(index),
                rule=MergeRule.ADD,
                build=zero_if_null(exp.Sum(this=exp.Abs(this=finite_value.copy()))),
                change=zero_if_null(exp.Sum(this=_signed_magnitude(finite_value))),
            ),
            StateColumn(
                name=names.sum_mass_of(index),
                rule=MergeRule.MASS,
                build=inexact_mass(finite_value.copy()),
                change=inexact_mass(finite_value.copy()),
            ),
        ]
    return state


def _signed_magnitude(value: exp.Expr) -> exp.Expr:
    """|value| on an added row, -|value| on a removed one."""
    magnitude = exp.Abs(this=value.copy())
    return exp.If(
        this=exp.GT(this=sign(), expression=exp.Literal.number(0)),
        true=magnitude,
        false=exp.Neg(this=magnitude.copy()),
    )


def inexact_mass(value: exp.Expr) -> exp.Expr:
    """The group's SUM(ABS(value)), or 0 where its SUM(value) cannot have rounded.

    It cannot over one value, nor over integers whose absolute sum is at
    most EXACT_INTEGERS (every partial sum is then an integer within it).

    >>> inexact_mass(exp.column("x")).sql(dialect="spark")  # doctest: +ELLIPSIS
    "IF(COUNT(x) <= 1 OR (SUM(ABS(x)) <= CAST('9007199254740992.0' AS DOUBLE) AND SUM(IF(x % 1 <> 0, 1, 0)) = 0), CAST('0' AS DOUBLE), COALESCE(SUM(ABS(x)), ...))"
    """
    magnitude = exp.Sum(this=exp.Abs(this=value.copy()))
    # A NULL value (NULL, or not finite) is no fraction: x % 1 <> 0 is NULL there.
    fractions = exp.Sum(
        this=exp.If(
            this=exp.NEQ(
                this=exp.Mod(this=value.copy(), expression=exp.Literal.number(1)),
                expression=exp.Literal.number(0),
            ),
            true=exp.Literal.number(1),
            false=exp.Literal.number(0),
        )
    )
    exact = exp.or_(
        exp.LTE(this=exp.Count(this=value.copy()), expression=exp.Literal.number(1)),
        exp.paren(
            exp.and_(
                exp.LTE(this=magnitude.copy(), expression=double(repr(EXACT_INTEGERS))),
                exp.EQ(this=fractions, expression=exp.Literal.number(0)),
            )
        ),
    )
    return exp.If(this=exact, true=double("0"), false=zero_if_null(magnitude))


def cancels(index: int, stored: Columns, change: Columns) -> exp.Expr:
    """Whether merging the change leaves the sum and its values' absolute total
    below CANCELLATION_LIMIT of the inexact mass.

    Only while finite values are left (over none the sum is NULL, NaN or an
    infinity, whatever is stored); the sum is merged()'s, the total and the
    mass stored + change.
    """

    def merged_count(name: Callable[[int], str]) -> exp.Expr:
        return plus(
            exp.Coalesce(this=stored(name(index)), expressions=[exp.Literal.number(0)]),
            exp.Coalesce(this=change(name(index)), expressions=[exp.Literal.number(0)]),
        )

    finite_left = merged_count(names.non_null_count_of)
    for name in NON_FINITE_COUNTS:
        finite_left = minus(finite_left, merged_count(name))
    total = plus(finite_sum(index, stored), zero_if_null(change(names.sum_of(index))))
    magnitude, mass = (
        plus(zero_if_null(stored(name(index))), zero_if_null(change(name(index))))
        for name in (names.sum_magnitude_of, names.sum_mass_of)
    )
    return exp.and_(
        exp.GT(this=finite_left, expression=exp.Literal.number(0)),
        exp.GT(
            this=times(mass, double(repr(CANCELLATION_LIMIT))),
            expression=exp.Greatest(this=exp.Abs(this=total), expressions=[magnitude]),
        ),
    )


def merged(column: StateColumn, stored: Columns, change: Columns) -> exp.Expr:
    """The new sum, or its new error: stored + change, the addition's rounding error kept.

    TwoSum: for s = a + b rounded, b' = s - a, the error is exactly
    (a - (s - b')) + (b - b'), so a + b = s + error with no rounding.
    """
    assert column.argument is not None
    stored_sum = zero_if_null(stored(names.sum_of(column.argument)))
    change_sum = zero_if_null(change(names.sum_of(column.argument)))
    total = plus(stored_sum, change_sum)
    if column.rule is MergeRule.COMPENSATED_SUM:
        return total
    assert column.rule is MergeRule.SUM_ERROR
    added = minus(total.copy(), stored_sum.copy())
    error = plus(
        minus(stored_sum.copy(), minus(total.copy(), added.copy())),
        minus(change_sum.copy(), added.copy()),
    )
    return plus(zero_if_null(stored(names.sum_error_of(column.argument))), error)


def zero_if_null(value: exp.Expr) -> exp.Expr:
    return exp.Coalesce(this=value, expressions=[double("0")])


def _state(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _positive(count: str) -> exp.Expr:
    return exp.GT(this=_state(count), expression=exp.Literal.number(0))


def with_non_finite(index: int, finite_result: exp.Expr) -> exp.Expr:
    """A SUM or AVG of the group as Spark computes it, given its value over the finite values.

    >>> with_non_finite(0, exp.column("s")).sql(dialect="spark")  # doctest: +ELLIPSIS
    "CASE WHEN `__ivm_nan_a0` > 0 OR (`__ivm_pinf_a0` > 0 AND `__ivm_ninf_a0` > 0) THEN CAST('NaN' AS DOUBLE) WHEN ... ELSE s END"
    """
    both = exp.and_(
        _positive(names.positive_infinity_count_of(index)),
        _positive(names.negative_infinity_count_of(index)),
    )
    return exp.Case(
        ifs=[
            exp.If(
                this=exp.or_(_positive(names.nan_count_of(index)), exp.paren(both)),
                true=double("NaN"),
            ),
            exp.If(
                this=_positive(names.positive_infinity_count_of(index)), true=double("Infinity")
            ),
            exp.If(
                this=_positive(names.negative_infinity_count_of(index)), true=double("-Infinity")
            ),
        ],
        default=finite_result,
    )


def has_non_finite(index: int) -> exp.Expr:
    """The group has a NaN or an infinity among the argument's values."""
    return exp.or_(*[_positive(name(index)) for name in NON_FINITE_COUNTS])


def finite_sum(index: int, stored: Columns = _state) -> exp.Expr:
    """The stored sum of the finite values: sum + its rounding error (the state's, or `stored`'s)."""
    return plus(
        zero_if_null(stored(names.sum_of(index))), zero_if_null(stored(names.sum_error_of(index)))
    )
