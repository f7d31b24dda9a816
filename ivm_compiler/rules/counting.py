"""Row identity and multiplicity: the count-column rule for projections, DISTINCT and groups.

A state row is identified by its key expressions; its names.COUNT column holds
how many source rows map to it (the bag multiplicity). A change row adds its
sign, so inserts and deletes of duplicates are exact and a row or group leaves
the state when its count reaches zero (the consistency-levels paper's count
columns for projections that drop the key). A view shows a row while its
count is positive, and a bag view shows it count times (`repeated`).
"""

from __future__ import annotations

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn
from ivm_compiler.sql import ident


def sign() -> exp.Column:
    """The +1/-1 of a flattened change row (changes.signed_rows puts it there)."""
    return exp.column(names.SIGN, quoted=True)


def key_column(index: int) -> StateColumn:
    """The index-th row key: the flattened row column of the same name, passed through."""
    name = names.group_key(index)
    return StateColumn(
        name=name,
        rule=MergeRule.KEY,
        build=exp.column(name, quoted=True),
        change=exp.column(name, quoted=True),
    )


def count_column() -> StateColumn:
    """Rows per state row: COUNT(*) at build time, the sum of signs on refresh.

    >>> count_column().change.sql(dialect="spark")
    'SUM(`__ivm_sign`)'
    """
    return StateColumn(
        name=names.COUNT,
        rule=MergeRule.ADD,
        build=exp.Count(this=exp.Star(), big_int=True),
        change=exp.Sum(this=sign()),
    )


def operand_count_column(index: int) -> StateColumn:
    """A set operation's count of one operand: COUNT(*) and signs of that operand's rows only."""
    of_operand = exp.EQ(
        this=exp.column(names.OPERAND, quoted=True), expression=exp.Literal.number(index)
    )
    return StateColumn(
        name=names.operand_count_of(index),
        rule=MergeRule.ADD,
        build=exp.Sum(
            this=exp.If(this=of_operand, true=exp.Literal.number(1), false=exp.Literal.number(0))
        ),
        change=exp.Sum(
            this=exp.If(this=of_operand.copy(), true=sign(), false=exp.Literal.number(0))
        ),
    )


def count() -> exp.Column:
    """A state row's multiplicity."""
    return exp.column(names.COUNT, quoted=True)


def populated() -> exp.Expr:
    """The state rows that stand for at least one row of the query.

    >>> populated().sql(dialect="spark")
    '`__ivm_count` > 0'
    """
    return exp.GT(this=count(), expression=exp.Literal.number(0))


def repeated(select: exp.Select, copies: exp.Expr) -> exp.Select:
    """The select (changed in place) with each row repeated `copies` times.

    >>> repeated(exp.select("a").from_("s"), count()).sql(dialect="spark")
    'SELECT a FROM s LATERAL VIEW EXPLODE(SEQUENCE(1, `__ivm_count`)) __ivm_copies AS `__ivm_copy`'
    """
    repeat = exp.Lateral(
        this=exp.Explode(this=exp.GenerateSeries(start=exp.Literal.number(1), end=copies)),
        view=True,
        alias=exp.TableAlias(this=ident(names.COPIES_ALIAS), columns=[ident(names.COPY)]),
    )
    select.append("laterals", repeat)
    return select
