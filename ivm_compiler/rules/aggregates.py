"""COUNT(x), SUM(x) and AVG(x): additive state with Spark's NULL semantics.

For each distinct argument x the state keeps
- names.non_null_count_of(i): how many rows in the group have x NOT NULL, and
- names.sum_of(i): the sum of those x (only when SUM or AVG needs it).
COUNT(x) reads the non-NULL count; SUM(x) is NULL when that count is zero
(Spark's SUM over only NULLs); AVG(x) is the sum over the count, computed the
way Spark's Average computes it, so the view equals the query exactly for
integral and decimal inputs. A floating-point x keeps a compensated sum and
counts of its NaN and infinities instead (rules/floating.py), and STDDEV/VAR
keep x's moments (rules/moments.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.plan import MergeRule, StateColumn
from ivm_compiler.rules import covariance, floating, moments
from ivm_compiler.rules.counting import sign
from ivm_compiler.sql import DIALECT, divided

# Spark's Average divides a decimal sum by the count cast to this type.
LONG_DECIMAL = exp.DataType.build("DECIMAL(20, 0)")


@dataclass(frozen=True)
class ArgumentState:
    """The state kept for one distinct aggregate argument."""

    index: int
    # The argument over the model's sources; the state reads its flattened column.
    argument: exp.Expr
    needs_sum: bool = False
    needs_count: bool = False
    # STDDEV or VARIANCE (rules/moments.py).
    needs_moments: bool = False
    # COVAR/CORR: the arguments it keeps a co-moment with (rules/covariance.py).
    co_moment_partners: frozenset[int] = frozenset()
    # Recomputed, not summed: MIN, MAX, COUNT(DISTINCT) (rules/extremes.py).
    recomputed: frozenset[str] = frozenset()
    # Spark sums it as a DOUBLE (FLOAT, DOUBLE, or a STRING it casts): set
    # from the type probe (view_classes/aggregate.py).
    is_floating: bool = False

    @property
    def flat(self) -> exp.Column:
        return exp.column(names.argument(self.index), quoted=True)

    @property
    def needs_sum_type(self) -> bool:
        """Whether the type probe must say how Spark sums it (a DOUBLE sum means floating point)."""
        return self.needs_sum or self.needs_moments

    def columns(self) -> list[StateColumn]:
        """The state of this argument: its non-NULL count, sum and moments, as needed."""
        if not (self.needs_count or self.needs_sum or self.needs_moments):
            return []
        non_null = exp.Not(this=exp.Is(this=self.flat, expression=exp.Null()))
        columns = [
            StateColumn(
                name=names.non_null_count_of(self.index),
                rule=MergeRule.ADD,
                build=exp.Count(this=self.flat, big_int=True),
                change=exp.Sum(
                    this=exp.If(this=non_null, true=sign(), false=exp.Literal.number(0))
                ),
            )
        ]
        if self.is_floating:
            columns += floating.columns(self.index, self.flat, self.needs_sum)
        elif self.needs_sum:
            # -x rather than x * sign: negation keeps x's type, so the delta's
            # SUM has exactly the type of the build's SUM.
            signed_argument = exp.If(
                this=exp.GT(this=sign(), expression=exp.Literal.number(0)),
                true=self.flat,
                false=exp.Neg(this=self.flat),
            )
            columns.append(
                StateColumn(
                    name=names.sum_of(self.index),
                    rule=MergeRule.ADD_NULLABLE,
                    build=exp.Sum(this=self.flat),
                    change=exp.Sum(this=signed_argument),
                )
            )
        if self.needs_moments:
            columns += moments.columns(self.index, self.flat, self.is_floating)
        for partner in sorted(self.co_moment_partners):
            columns += covariance.columns(self.index, partner)
        return columns


def arguments_of(model: str, expressions: list[exp.Expr]) -> dict[str, ArgumentState]:
    """One ArgumentState per distinct aggregate argument, in query order, with what it needs.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select sum(x), avg(x), min(y), count(distinct y) from t")
    >>> [(k, a.needs_sum, sorted(a.recomputed)) for k, a in arguments_of("m", q.expressions).items()]
    [('x', True, []), ('y', False, ['COUNT', 'MIN'])]
    >>> arguments_of("m", [sqlglot.parse_one("stddev(x)")])["x"].needs_moments
    True
    """
    found: dict[str, ArgumentState] = {}

    def noted(argument: exp.Expr) -> ArgumentState:
        key = argument.sql(dialect=DIALECT)
        if key not in found:
            found[key] = ArgumentState(index=len(found), argument=argument)
        return found[key]

    for expression in expressions:
        for call in expression.find_all(
            exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, *moments.AGGREGATES, covariance.CoMoment
        ):
            if isinstance(call, exp.Count) and isinstance(call.this, exp.Star):
                continue
            if isinstance(call, covariance.CoMoment):
                # The co-moment merges with both arguments' moments (their counts and means).
                x = replace(noted(call.this), needs_moments=True)
                y = replace(noted(call.expression), needs_moments=True)
                found[y.argument.sql(dialect=DIALECT)] = y
                found[x.argument.sql(dialect=DIALECT)] = replace(
                    x, co_moment_partners=x.co_moment_partners | {y.index}
                )
                continue
            argument = argument_of(model, call)
            previous = noted(argument)
            recomputed = set(previous.recomputed)
            if isinstance(call, (exp.Min, exp.Max)):
                recomputed.add("MIN" if isinstance(call, exp.Min) else "MAX")
            elif isinstance(call.this, exp.Distinct):
                recomputed.add("COUNT")
            found[argument.sql(dialect=DIALECT)] = replace(
                previous,
                needs_sum=previous.needs_sum or isinstance(call, (exp.Sum, exp.Avg)),
                needs_count=previous.needs_count
                or (isinstance(call, exp.Count) and not isinstance(call.this, exp.Distinct)),
                needs_moments=previous.needs_moments or isinstance(call, moments.AGGREGATES),
                recomputed=frozenset(recomputed),
            )
    return found


def argument_of(model: str, call: exp.Expr) -> exp.Expr:
    """x of COUNT(x), SUM(x), AVG(x), MIN(x), MAX(x) and COUNT(DISTINCT x)."""
    if not isinstance(call.this, exp.Distinct):
        return call.this
    if isinstance(call, exp.Count) and len(call.this.expressions) == 1:
        return call.this.expressions[0]
    raise NotMaintainable(
        model,
        f"{call.sql(dialect=DIALECT)} (only COUNT(DISTINCT x) of one expression is maintained)",
        "aggregate a DISTINCT model of its own, or " + FALLBACK_HINT,
    )


def state_column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _null_unless_rows(non_null_count: str, value: exp.Expr) -> exp.Expr:
    return exp.Case(
        ifs=[
            exp.If(
                this=exp.EQ(this=state_column(non_null_count), expression=exp.Literal.number(0)),
                true=exp.Null(),
            )
        ],
        default=value,
    )


def finalize_count_star() -> exp.Expr:
    return state_column(names.COUNT)


def finalize_count(argument_index: int) -> exp.Expr:
    return state_column(names.non_null_count_of(argument_index))


def finalize_sum(argument_index: int, is_floating: bool = False) -> exp.Expr:
    total: exp.Expr = state_column(names.sum_of(argument_index))
    if is_floating:
        total = floating.with_non_finite(argument_index, floating.finite_sum(argument_index))
    return _null_unless_rows(names.non_null_count_of(argument_index), total)


def finalize_avg(
    argument_index: int, avg_type: exp.DataType, is_floating: bool = False
) -> exp.Expr:
    """AVG as Spark's Average evaluates it, from the stored sum and non-NULL count.

    >>> finalize_avg(0, exp.DataType.build("DOUBLE")).sql(dialect="spark")
    'CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_sum_a0` AS DOUBLE) / CAST(`__ivm_nn_a0` AS DOUBLE) END'
    """
    total = state_column(names.sum_of(argument_index))
    rows = state_column(names.non_null_count_of(argument_index))
    if is_floating:
        mean = divided(floating.finite_sum(argument_index), exp.cast(rows, floating.DOUBLE))
        return _null_unless_rows(
            names.non_null_count_of(argument_index),
            floating.with_non_finite(argument_index, mean),
        )
    if avg_type.is_type(*exp.DataType.REAL_TYPES) and avg_type.this == exp.DataType.Type.DECIMAL:
        quotient: exp.Expr = exp.cast(
            exp.Div(this=total, expression=exp.cast(rows, LONG_DECIMAL)), avg_type
        )
    else:
        quotient = exp.Div(this=exp.cast(total, avg_type), expression=exp.cast(rows, avg_type))
    return _null_unless_rows(names.non_null_count_of(argument_index), quotient)
