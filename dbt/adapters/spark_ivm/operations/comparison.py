"""The oracle query of `ivm_matches_query`: a model's rows against its query's, as bags.

Exact columns must be equal; FLOAT and DOUBLE columns within a tolerance,
because a refresh adds floating-point values in another order than a
recomputation does (two recomputations in Spark differ the same way):
|model - query| <= absolute + relative * max(|model|, |query|), NaN equal to
NaN, an infinity to itself. Without floating-point columns, or with both
tolerances 0, the bags are compared with EXCEPT ALL both ways.

With a tolerance, rows are paired: numbered within their exact columns in
the order of their floating-point ones on each side, then joined on the exact
columns and that number. Values within the tolerance of each other sort
alike, so they pair up; a row without a close partner counts as missing (a
query row) or extra (a model row).

The answer is one row, returned only when the bags differ: how many query
rows the model misses, how many model rows are extra, and both row counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from ivm_compiler.sql import DIALECT, minus, plus, times

FLOATING_POINT_TYPES = frozenset({"double", "float", "real"})
MAINTAINED = "maintained"
RECOMPUTED = "recomputed"
PAIR = "__ivm_pair"
CLOSE = "__ivm_close"


# Two recomputations of a DOUBLE SUM in Spark differ by far less; a refresh's
# error is of the same order (rules/floating.py, rules/moments.py).
DEFAULT_RELATIVE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Tolerance:
    relative: float = 0.0
    absolute: float = 0.0

    @property
    def exact(self) -> bool:
        return self.relative == 0 and self.absolute == 0


def tolerance(model: str, relative: object, absolute: object) -> Tolerance:
    """The test's arguments, checked: two numbers >= 0.

    >>> tolerance("m", 1e-9, 0)
    Tolerance(relative=1e-09, absolute=0.0)
    >>> tolerance("m", "1e-6", "0")
    Tolerance(relative=1e-06, absolute=0.0)
    >>> tolerance("m", "a lot", 0)
    Traceback (most recent call last):
    ...
    ValueError: ivm_matches_query on m: relative_tolerance must be a number >= 0, got 'a lot'; ...
    """
    values = {}
    for name, value in (("relative_tolerance", relative), ("absolute_tolerance", absolute)):
        number = _number(value)
        if number is None or not number >= 0:
            raise ValueError(
                f"ivm_matches_query on {model}: {name} must be a number >= 0, got {value!r}; "
                "e.g. relative_tolerance: 1.0e-9 (0 compares FLOAT and DOUBLE columns exactly)"
            )
        values[name] = number
    return Tolerance(values["relative_tolerance"], values["absolute_tolerance"])


def _number(value: object) -> float | None:
    """A float from a number, or from a string of one (YAML 1.1 reads `1e-9` as a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def query(
    model: str, recomputed: str, columns: Sequence[tuple[str, str]], tolerance: Tolerance
) -> str:
    """The comparison of `model` (a relation's name) with `recomputed` (a query's SQL).

    `columns`: the model's (name, Spark type).

    >>> print(query("m", "select 1 as k", [("k", "int")], Tolerance(1e-9)))  # doctest: +ELLIPSIS
    WITH ... SELECT * FROM (SELECT (SELECT COUNT(*) FROM (SELECT * FROM recomputed EXCEPT ALL ...
    """
    floating = [name for name, data_type in columns if data_type.lower() in FLOATING_POINT_TYPES]
    exact = [name for name, _ in columns if name not in floating]
    if not floating or tolerance.exact:
        missing, extra = _except_all()
    else:
        missing, extra = _paired(exact, floating, tolerance)
    counts = exp.select(
        exp.alias_(_count(missing), "rows_missing_from_model"),
        exp.alias_(_count(extra), "rows_extra_in_model"),
        exp.alias_(_count(exp.select("*").from_(MAINTAINED)), "model_rows"),
        exp.alias_(_count(exp.select("*").from_(RECOMPUTED)), "query_rows"),
    )
    failing = exp.or_(
        exp.GT(this=exp.column("rows_missing_from_model"), expression=exp.Literal.number(0)),
        exp.GT(this=exp.column("rows_extra_in_model"), expression=exp.Literal.number(0)),
    )
    statement = (
        exp.select("*")
        .from_(counts.subquery("__ivm_counts"))
        .where(failing)
        .with_(MAINTAINED, as_=exp.select("*").from_(exp.to_table(model, dialect=DIALECT)))
        .with_(RECOMPUTED, as_=sqlglot.parse_one(recomputed, dialect=DIALECT))
    )
    return statement.sql(dialect=DIALECT)


def _count(rows: exp.Query) -> exp.Expr:
    return exp.select(exp.Count(this=exp.Star())).from_(rows.subquery("__ivm_rows")).subquery()


def _except_all() -> tuple[exp.Query, exp.Query]:
    def minus_all(left: str, right: str) -> exp.Query:
        return exp.Except(
            this=exp.select("*").from_(left),
            expression=exp.select("*").from_(right),
            distinct=False,
        )

    return minus_all(RECOMPUTED, MAINTAINED), minus_all(MAINTAINED, RECOMPUTED)


def _quoted(name: str, table: str | None = None) -> exp.Column:
    return exp.column(name, table=table, quoted=True)


def _numbered(relation: str, exact: list[str], floating: list[str]) -> exp.Select:
    number = exp.Window(
        this=exp.RowNumber(),
        partition_by=[_quoted(c) for c in exact] or None,
        order=exp.Order(expressions=[exp.Ordered(this=_quoted(c)) for c in floating]),
    )
    return exp.select("*", exp.alias_(number, PAIR)).from_(relation)


def _close(model: exp.Expr, query_value: exp.Expr, tolerance: Tolerance) -> exp.Expr:
    """Equal (NULL and NaN included), or within the tolerance."""
    bound = plus(
        exp.Literal.number(repr(tolerance.absolute)),
        times(
            exp.Literal.number(repr(tolerance.relative)),
            exp.Greatest(
                this=exp.Abs(this=model.copy()), expressions=[exp.Abs(this=query_value.copy())]
            ),
        ),
    )
    within = exp.LTE(this=exp.Abs(this=minus(model.copy(), query_value.copy())), expression=bound)
    return exp.or_(exp.NullSafeEQ(this=model, expression=query_value), exp.paren(within))


def _paired(
    exact: list[str], floating: list[str], tolerance: Tolerance
) -> tuple[exp.Query, exp.Query]:
    """The query rows without a close model row, and the model rows without a close query row."""
    left, right = "m", "q"
    on = exp.and_(
        *[exp.NullSafeEQ(this=_quoted(c, left), expression=_quoted(c, right)) for c in exact],
        exp.EQ(this=_quoted(PAIR, left), expression=_quoted(PAIR, right)),
    )
    close = exp.and_(*[_close(_quoted(c, left), _quoted(c, right), tolerance) for c in floating])
    joined = (
        exp.select(
            exp.alias_(_quoted(PAIR, left), "__ivm_model_pair"),
            exp.alias_(_quoted(PAIR, right), "__ivm_query_pair"),
            exp.alias_(exp.Coalesce(this=close, expressions=[exp.false()]), CLOSE),
        )
        .from_(_numbered(MAINTAINED, exact, floating).subquery(left))
        .join(_numbered(RECOMPUTED, exact, floating).subquery(right), on=on, join_type="FULL")
    )

    def unmatched(side: str) -> exp.Query:
        present = exp.Not(this=exp.Is(this=exp.column(side), expression=exp.Null()))
        return (
            exp.select("*")
            .from_(joined.subquery("__ivm_paired"))
            .where(exp.and_(present, exp.Not(this=exp.column(CLOSE))))
        )

    return unmatched("__ivm_query_pair"), unmatched("__ivm_model_pair")
