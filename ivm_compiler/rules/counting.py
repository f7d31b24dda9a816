"""Row identity and multiplicity: the count-column rule for projections, DISTINCT and groups.

A state row is identified by its key expressions; its names.COUNT column holds
how many source rows map to it (the bag multiplicity). A change row adds its
sign, so inserts and deletes of duplicates are exact and a row or group leaves
the state when its count reaches zero (the consistency-levels paper's count
columns for projections that drop the key).
"""

from __future__ import annotations

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import MergeRule, StateColumn


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
