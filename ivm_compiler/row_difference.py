"""A table's rows against a query's: their difference, staged, counted and merged by whole row.

An ivm_fallback model (a query the compiler refuses) is a Delta table
computed whole on every run. Replaced (CREATE OR REPLACE), it is a new table
to the ivm models that read it, and each would rebuild. Written with the
difference between its rows and its query's instead, it stays the table
they recorded, and its change feed holds just the rows that differ, which
they apply as any change (refresh/fallback.py):

1. stage_difference: every distinct row, with how many copies the query
   gives (`__ivm_new`) and the table holds (`__ivm_old`), where they differ:
   one grouping of the two bags, the difference computed once;
2. count_difference: its rows and copies, which size the write (none: no
   write at all);
3. merge_difference: one MERGE that deletes every old copy of a changed row
   and inserts its new copies (or, for a difference too large to merge,
   overwrite_with_difference: the table's unchanged rows and the changed
   rows' new copies, written over it). Rows have no key but themselves, and Delta
   cannot delete k of n equal rows, so a row going from 3 copies to 2 is
   written as 3 deleted and 2 inserted: its net change, as the readers sum
   it, is the one copy.

Rows are matched NULL-safely on every column; a MAP column cannot be
grouped or compared, and refresh/fallback.py replaces such a table instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.sql import DIALECT, TableName, ident

# Copies of a distinct row in the new rows (the query's) and the old (the table's).
NEW = f"{names.RESERVED_PREFIX}new"
OLD = f"{names.RESERVED_PREFIX}old"
# +1 on a row of the query, -1 on a row of the table, before they are grouped.
SIDE = f"{names.RESERVED_PREFIX}side"
# The MERGE source's action for a row: delete its old copies, or insert one new copy.
ACTION = f"{names.RESERVED_PREFIX}action"
DELETE, INSERT = "delete", "insert"
# A changed row's new copies, one per element of an array of `__ivm_new` ones.
COPY = f"{names.RESERVED_PREFIX}copy"
COPIES = f"{names.RESERVED_PREFIX}copies"


def _columns(columns: Sequence[str], table: str | None = None) -> list[exp.Column]:
    return [exp.column(c, table=ident(table) if table else None, quoted=True) for c in columns]


def _count_where(positive: bool) -> exp.Sum:
    side = exp.column(SIDE, quoted=True)
    test = exp.GT if positive else exp.LT
    return exp.Sum(
        this=exp.If(
            this=test(this=side, expression=exp.Literal.number(0)),
            true=exp.Literal.number(1),
            false=exp.Literal.number(0),
        )
    )


def difference(table: TableName, query: exp.Query, columns: Sequence[str]) -> exp.Select:
    """Each distinct row whose copies differ between `query` and `table`, with both counts.

    >>> sql = difference(TableName("m", "t"), exp.select("a").from_("s"), ["a"]).sql("spark")
    >>> sql.startswith("SELECT `a`, SUM(IF(`__ivm_side` > 0, 1, 0)) AS `__ivm_new`")
    True
    >>> sql[sql.index("GROUP BY"):]
    'GROUP BY `a` HAVING SUM(IF(`__ivm_side` > 0, 1, 0)) <> SUM(IF(`__ivm_side` < 0, 1, 0))'

    """
    side = [
        exp.select(*_columns(columns), exp.alias_(exp.Literal.number(sign), SIDE, quoted=True))
        for sign in (1, -1)
    ]
    new = side[0].from_(query.subquery(ident(f"{names.RESERVED_PREFIX}query")))
    old = side[1].from_(table.to_table())
    both = exp.union(new, old, distinct=False)
    return (
        exp.select(
            *_columns(columns),
            exp.alias_(_count_where(True), NEW, quoted=True),
            exp.alias_(_count_where(False), OLD, quoted=True),
        )
        .from_(both.subquery(ident(f"{names.RESERVED_PREFIX}both")))
        .group_by(*_columns(columns))
        .having(exp.NEQ(this=_count_where(True), expression=_count_where(False)))
    )


def stage_difference(table: TableName, query: exp.Query, columns: Sequence[str], name: str) -> str:
    """CACHE TABLE <name> AS the difference: computed once, then counted and merged from memory."""
    cache = exp.Cache(
        this=exp.Table(this=ident(name)), expression=difference(table, query, columns)
    )
    return cache.sql(dialect=DIALECT)


def count_difference(name: str) -> str:
    """The staged difference's distinct rows, new copies and old copies.

    >>> count_difference("s")
    'SELECT COUNT(*), COALESCE(SUM(`__ivm_new`), 0), COALESCE(SUM(`__ivm_old`), 0) FROM `s`'
    """
    sums = [
        exp.Coalesce(
            this=exp.Sum(this=exp.column(c, quoted=True)), expressions=[exp.Literal.number(0)]
        )
        for c in (NEW, OLD)
    ]
    return (
        exp.select(exp.Count(this=exp.Star()), *sums)
        .from_(exp.Table(this=ident(name)))
        .sql(dialect=DIALECT)
    )


def merge_difference(table: TableName, staged: str, columns: Sequence[str]) -> str:
    """MERGE the staged difference into `table`: a changed row's old copies out, its new ones in.

    The source has, per changed row, one DELETE row if the table holds it
    (it matches every copy, and each target row matches only it, as Delta
    requires) and one INSERT row per new copy, which never matches.
    """
    actions = exp.Concat(
        expressions=[
            _repeat(
                exp.Literal.string(DELETE),
                exp.If(
                    this=exp.GT(
                        this=exp.column(OLD, quoted=True), expression=exp.Literal.number(0)
                    ),
                    true=exp.Literal.number(1),
                    false=exp.Literal.number(0),
                ),
            ),
            _repeat(exp.Literal.string(INSERT), exp.column(NEW, quoted=True)),
        ]
    )
    source = exp.select(
        *_columns(columns), exp.alias_(exp.Explode(this=actions), ACTION, quoted=True)
    ).from_(exp.Table(this=ident(staged)))
    target, change = names.TARGET_ALIAS, names.CHANGE_ALIAS
    action = exp.column(ACTION, table=ident(change), quoted=True)
    on = exp.and_(
        exp.EQ(this=action.copy(), expression=exp.Literal.string(DELETE)),
        *_same_row(columns, target, change),
    )
    whens = [
        exp.When(matched=True, then=exp.var("DELETE")),
        exp.When(
            matched=False,
            condition=exp.EQ(this=action.copy(), expression=exp.Literal.string(INSERT)),
            then=exp.Insert(
                this=exp.Tuple(expressions=_columns(columns)),
                expression=exp.Tuple(expressions=_columns(columns, change)),
            ),
        ),
    ]
    merge = exp.Merge(
        this=exp.alias_(table.to_table(), target, table=True),
        using=source.subquery(ident(change)),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return merge.sql(dialect=DIALECT)


def _repeat(value: exp.Expr, times: exp.Expr) -> exp.Expr:
    """An array of `times` copies of `value`: EXPLODE makes that many rows of one."""
    count = exp.cast(times, exp.DataType.build("INT"))
    return exp.Anonymous(this="ARRAY_REPEAT", expressions=[value, count])


def _same_row(columns: Sequence[str], left: str, right: str) -> list[exp.Expr]:
    """`left`'s row equals `right`'s on every column, NULL equal to NULL (rows have no other key)."""
    return [
        exp.NullSafeEQ(this=a, expression=b)
        for a, b in zip(_columns(columns, left), _columns(columns, right))
    ]


def overwrite_with_difference(table: TableName, staged: str, columns: Sequence[str]) -> str:
    """INSERT OVERWRITE `table` with its rows the staged difference leaves, and the new copies.

    The query's rows, without running the query again: every copy of a row
    the difference does not name (NULL-safe on every column) is as the query
    gives it, and each row it names has `__ivm_new` copies. Delta reads the
    table at the version the overwrite replaces.

    >>> sql = overwrite_with_difference(TableName("m", "t"), "d", ["a"])
    >>> unchanged, changed = sql.split(" UNION ALL ")
    >>> unchanged
    'INSERT OVERWRITE TABLE `m`.`t` SELECT `a` FROM `m`.`t` AS __ivm_t LEFT ANTI JOIN `d` AS __ivm_d ON `__ivm_t`.`a` IS NOT DISTINCT FROM `__ivm_d`.`a`'
    >>> changed
    'SELECT `a` FROM (SELECT `a`, EXPLODE(ARRAY_REPEAT(1, CAST(`__ivm_new` AS INT))) AS `__ivm_copy` FROM `d`) AS `__ivm_copies`'
    """
    target, change = names.TARGET_ALIAS, names.CHANGE_ALIAS
    unchanged = (
        exp.select(*_columns(columns))
        .from_(exp.alias_(table.to_table(), target, table=True))
        .join(
            exp.alias_(exp.Table(this=ident(staged)), change, table=True),
            on=exp.and_(*_same_row(columns, target, change)),
            join_type="LEFT ANTI",
        )
    )
    repeat = _repeat(exp.Literal.number(1), exp.column(NEW, quoted=True))
    copies = exp.select(
        *_columns(columns), exp.alias_(exp.Explode(this=repeat), COPY, quoted=True)
    ).from_(exp.Table(this=ident(staged)))
    changed = exp.select(*_columns(columns)).from_(copies.subquery(ident(COPIES)))
    rows = exp.union(unchanged, changed, distinct=False)
    return exp.Insert(this=table.to_table(), expression=rows, overwrite=True).sql(dialect=DIALECT)


def overwrite(table: TableName, query: exp.Query) -> str:
    """INSERT OVERWRITE `table` with the query's rows (no readers: the cheapest write)."""
    return exp.Insert(this=table.to_table(), expression=query.copy(), overwrite=True).sql(
        dialect=DIALECT
    )
