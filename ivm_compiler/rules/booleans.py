"""BOOL_AND (EVERY) and BOOL_OR (SOME): two counts of a group.

BOOL_AND(x) is NULL when the group has no non-NULL x, and otherwise true
exactly when none of its x is false; BOOL_OR(x) is NULL likewise, and
otherwise true when some x is true. Each is therefore a function of two
counts that a change adds to, which rules/aggregates.py keeps already: the
non-NULL x, and the false (or true) x. compile.py rewrites every such call
into its expression over COUNTs before a view class plans the query:

    BOOL_AND(x)  ->  CASE WHEN COUNT(x) = 0 THEN NULL ELSE COUNT(CASE WHEN NOT x THEN 1 END) = 0 END
    BOOL_OR(x)   ->  CASE WHEN COUNT(x) = 0 THEN NULL ELSE COUNT(CASE WHEN x THEN 1 END) > 0 END

A deleted false value then turns BOOL_AND true again, which a stored boolean
could not tell.
"""

from __future__ import annotations

from typing import TypeVar, cast

from sqlglot import exp

Tree = TypeVar("Tree", bound=exp.Expr)

AGGREGATES: tuple[type[exp.Expr], ...] = (exp.LogicalAnd, exp.LogicalOr)
# Spark's other names for them, which sqlglot parses as anonymous functions
# (and ANY(x), which it parses as the ANY of `x = ANY (subquery)`).
SYNONYMS: dict[str, type[exp.Expr]] = {"every": exp.LogicalAnd, "some": exp.LogicalOr}


def as_named(tree: Tree) -> Tree:
    """EVERY(x) as BOOL_AND(x), SOME(x) and ANY(x) as BOOL_OR(x): later stages see one node each.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select every(b), some(b), any(b) from t", read="spark")
    >>> as_named(q).sql("spark")
    'SELECT BOOL_AND(b), BOOL_OR(b), BOOL_OR(b) FROM t'
    """

    def named(node: exp.Expr) -> exp.Expr:
        name = str(node.this).lower() if isinstance(node, exp.Anonymous) else None
        if name in SYNONYMS and len(node.expressions) == 1:
            return SYNONYMS[name](this=node.expressions[0].copy())
        # The aggregate, not a comparison's `= ANY (...)`.
        if (
            isinstance(node, exp.Any)
            and isinstance(node.this, exp.Paren)
            and not isinstance(node.parent, exp.Binary)
        ):
            return exp.LogicalOr(this=node.this.this.copy())
        return node

    return cast(Tree, tree.transform(named, copy=False))


def as_counts(tree: Tree) -> Tree:
    """Every BOOL_AND/BOOL_OR of a group as its expression over two COUNTs (see above).

    A window's BOOL_AND is left to the window class, which refuses it.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select g, bool_and(b) as a from t group by g", read="spark")
    >>> as_counts(q).sql("spark")
    'SELECT g, CASE WHEN COUNT(b) = 0 THEN NULL ELSE COUNT(CASE WHEN NOT b THEN 1 END) = 0 END AS a FROM t GROUP BY g'
    """

    def counted(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, AGGREGATES) or isinstance(node.parent, exp.Window):
            return node
        value = node.this
        is_and = isinstance(node, exp.LogicalAnd)
        witness = exp.Count(
            this=exp.Case(
                ifs=[
                    exp.If(
                        this=exp.not_(value.copy()) if is_and else value.copy(),
                        true=exp.Literal.number(1),
                    )
                ]
            )
        )
        answer = (
            exp.EQ(this=witness, expression=exp.Literal.number(0))
            if is_and
            else exp.GT(this=witness, expression=exp.Literal.number(0))
        )
        return exp.Case(
            ifs=[
                exp.If(
                    this=exp.EQ(
                        this=exp.Count(this=value.copy()), expression=exp.Literal.number(0)
                    ),
                    true=exp.Null(),
                )
            ],
            default=answer,
        )

    return cast(Tree, tree.transform(counted))
