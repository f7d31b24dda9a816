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


def sign(source_alias: str) -> exp.Column:
    return exp.column(names.SIGN, table=exp.to_identifier(source_alias, quoted=True), quoted=True)


def key_column(index: int, expression: exp.Expression) -> StateColumn:
    return StateColumn(
        name=names.group_key(index),
        rule=MergeRule.KEY,
        build=expression.copy(),
        delta=expression.copy(),
    )


def count_column(source_alias: str) -> StateColumn:
    """Rows per state row: COUNT(*) at build time, the sum of signs on refresh.

    >>> count_column("o").delta.sql(dialect="spark")
    'SUM(`o`.`__ivm_sign`)'
    """
    return StateColumn(
        name=names.COUNT,
        rule=MergeRule.ADD,
        build=exp.Count(this=exp.Star(), big_int=True),
        delta=exp.Sum(this=sign(source_alias)),
    )
