"""What every part of the compiler shares: the dialect, table names and sqlglot tree helpers.

The leaf of the package's import graph: it imports nothing from ivm_compiler,
so any module may import it (tests/unit/test_import_graph.py keeps the graph
free of cycles). These names used to live in parse.py, which nearly every
module then imported, and a rule that parse.py consulted imported parse.py
back.

Helpers are thin where sqlglot has its own: identifiers are
exp.to_identifier's, conjuncts come from Expression.flatten, and a node's
column qualifiers from exp.column_table_names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

DIALECT = "spark"


@dataclass(frozen=True)
class TableName:
    """A source table as the model names it (dbt renders `schema.identifier`).

    Parts are kept in lower case: Spark's session catalog matches table and
    schema names case-insensitively and stores them lower-cased, and sqlglot's
    qualify lower-cases them in the trees it returns, so `s.Orders` named by a
    model and `s.orders` in its qualified tree must be one key.

    >>> TableName(db="Sales", name="Select") == TableName(db="sales", name="select")
    True
    >>> TableName(db="Sales", name="Select").sql()
    '`sales`.`select`'
    """

    db: str | None
    name: str
    catalog: str | None = None

    def __post_init__(self) -> None:
        for part in ("db", "name", "catalog"):
            value = getattr(self, part)
            if value is not None:
                object.__setattr__(self, part, value.lower())

    @classmethod
    def of(cls, table: exp.Expr) -> TableName:
        """The name of a FROM relation (a table; `from_tables` types its answer more widely)."""
        return cls(
            db=table.text("db") or None, name=table.name, catalog=table.text("catalog") or None
        )

    def parts(self) -> list[str]:
        return [part for part in (self.catalog, self.db, self.name) if part]

    def to_table(self) -> exp.Table:
        return exp.table_(
            exp.to_identifier(self.name, quoted=True),
            db=exp.to_identifier(self.db, quoted=True) if self.db else None,
            catalog=exp.to_identifier(self.catalog, quoted=True) if self.catalog else None,
        )

    def sql(self) -> str:
        """The quoted multi-part identifier, as Spark parses it (also inside table_changes)."""
        return self.to_table().sql(dialect=DIALECT)

    def __str__(self) -> str:
        return ".".join(self.parts())


# -- building trees -------------------------------------------------------------


def ident(name: str) -> exp.Identifier:
    """A quoted identifier: every name the compiler writes is quoted, reserved words included.

    >>> ident("order").sql(dialect=DIALECT)
    '`order`'
    """
    return exp.to_identifier(name, quoted=True)


def aliased(relation: exp.Expr, alias: str) -> exp.Expr:
    """The relation (changed in place) under a quoted alias.

    >>> aliased(TableName("shop", "orders").to_table(), "o").sql(dialect=DIALECT)
    '`shop`.`orders` AS `o`'
    """
    relation.set("alias", exp.TableAlias(this=ident(alias)))
    return relation


def version_as_of(table: TableName, version: int) -> exp.Table:
    """`table VERSION AS OF version` (Delta time travel).

    >>> version_as_of(TableName(db="shop", name="orders"), 7).sql(dialect=DIALECT)
    '`shop`.`orders` VERSION AS OF 7'
    """
    node = table.to_table()
    node.set(
        "version",
        exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(version)),
    )
    return node


def parsed_type(text: str) -> exp.DataType:
    """`text` (a type as Spark names it) as a type node of its own, parsed once per text.

    A change's listed keys and recomputed partitions are cast one literal
    at a time, and parsing the type's text for each was 111 of the 1,137
    py-spy samples of dbt's Python in a day's batch on the warehouse at
    scale 6000 (2026-12-07); a copy of the parsed node costs a few nodes.

    >>> parsed_type("decimal(10,2)").sql(dialect=DIALECT)
    'DECIMAL(10, 2)'
    >>> parsed_type("date") is parsed_type("date")
    False
    """
    return _parsed_types(text).copy()


@functools.lru_cache(maxsize=256)
def _parsed_types(text: str) -> exp.DataType:
    return exp.DataType.build(text, dialect=DIALECT)


# A literal's text that reads the same in Spark and in any other dialect the
# trees are written in (the rules oracle's DuckDB): a plain number, a string
# without quotes or backslashes (which Spark escapes its own way), and casts
# of such a string to a type whose name no dialect spells otherwise.
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_PLAIN_STRING = re.compile(r"[\w .:+\-/]*")
_PLAIN_CASTS = {
    exp.DataType.Type.DATE: "DATE",
    exp.DataType.Type.TINYINT: "TINYINT",
    exp.DataType.Type.SMALLINT: "SMALLINT",
    exp.DataType.Type.INT: "INT",
    exp.DataType.Type.BIGINT: "BIGINT",
}


def _plain_text(value: exp.Expr) -> str | None:
    """`value`'s SQL where it is a plain literal (or a plain cast of one); None otherwise."""
    cast = _PLAIN_CASTS.get(value.to.this) if isinstance(value, exp.Cast) else None
    literal = value.this if cast else value
    if not isinstance(literal, exp.Literal):
        return None
    text = literal.this
    if literal.is_string:
        if not _PLAIN_STRING.fullmatch(text):
            return None
        return f"CAST('{text}' AS {cast})" if cast else f"'{text}'"
    return text if not cast and _PLAIN_NUMBER.fullmatch(text) else None


def joined_literals(values: Sequence[exp.Expr]) -> list[exp.Expr]:
    """An IN list's `values`, each run of plain literals joined into one node of their text.

    A change's listed keys run to 50,000 literals, and sqlglot copies a tree
    node by node: building a refresh's statements copies each tree many
    times, and on the warehouse those copies were 582 of the 1,123 busy
    py-spy samples of dbt's Python in a day's batch at scale 1500
    (2026-12-07; a 50,000-key list copies in 0.1 s). One exp.Var holding the literals' text copies in
    microseconds and is written as the same SQL in every dialect; a literal
    that would not read the same everywhere (_plain_text) stays a node.

    >>> values = [exp.Literal.number(1), exp.Literal.number(2), exp.Literal.string("it's")]
    >>> joined = joined_literals([*values, exp.Literal.string("b")])
    >>> [type(v).__name__ for v in joined]
    ['Var', 'Literal', 'Var']
    >>> print(exp.In(this=exp.column("k"), expressions=joined).sql(dialect="spark"))
    k IN (1, 2, 'it\\'s', 'b')
    """
    joined: list[exp.Expr] = []
    run: list[str] = []
    for value in values:
        text = _plain_text(value)
        if text is not None:
            run.append(text)
            continue
        if run:
            joined.append(exp.Var(this=", ".join(run)))
            run = []
        joined.append(value)
    if run:
        joined.append(exp.Var(this=", ".join(run)))
    return joined


def union_all(selects: list[exp.Select]) -> exp.Query:
    """The selects under UNION ALL, left to right (the one select when there is one).

    The union takes the selects over (no copy: each is built for it, and
    copying the union so far at every step made emitting a statement
    quadratic in its branches).

    >>> union_all([exp.select("1"), exp.select("2"), exp.select("3")]).sql(dialect=DIALECT)
    'SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3'
    """
    union: exp.Query = selects[0]
    for select in selects[1:]:
        union = exp.union(union, select, distinct=False, copy=False)
    return union


def create_delta_table(
    table: TableName, properties: Mapping[str, str], query: exp.Query
) -> exp.Create:
    """CREATE OR REPLACE TABLE table USING DELTA TBLPROPERTIES (properties) AS query.

    >>> create_delta_table(TableName("s", "t"), {"k": "v"}, exp.select("1")).sql(dialect=DIALECT)
    "CREATE OR REPLACE TABLE `s`.`t` USING DELTA TBLPROPERTIES ('k'='v') AS SELECT 1"
    """
    return exp.Create(
        this=table.to_table(),
        kind="TABLE",
        replace=True,
        properties=exp.Properties(
            expressions=[
                exp.FileFormatProperty(this=exp.Var(this="DELTA")),
                *(
                    exp.Property(this=exp.Literal.string(key), value=exp.Literal.string(value))
                    for key, value in properties.items()
                ),
            ]
        ),
        expression=query,
    )


def conjunction(
    conditions: list[exp.Expr] | tuple[exp.Expr, ...],
) -> exp.Expr | None:
    """Copies of the conditions AND-ed together; None for no condition.

    >>> conjunction([exp.column("a"), exp.column("b")]).sql(dialect=DIALECT)
    'a AND b'
    >>> conjunction([]) is None
    True
    """
    return exp.and_(*[c.copy() for c in conditions]) if conditions else None


# -- reading trees --------------------------------------------------------------


def from_tables(select: exp.Select) -> list[exp.Expr]:
    """The relations of a SELECT's FROM and its JOINs, in query order.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select * from a join b on a.k = b.k, c")
    >>> [t.sql() for t in from_tables(q)]
    ['a', 'b', 'c']
    """
    found = [select.args["from_"].this] if select.args.get("from_") else []
    found += [join.this for join in select.args.get("joins") or []]
    return found


def set_operation_kind(node: exp.SetOperation) -> str:
    """UNION, UNION ALL, INTERSECT, INTERSECT ALL, EXCEPT or EXCEPT ALL.

    >>> import sqlglot
    >>> set_operation_kind(sqlglot.parse_one("select 1 except all select 2"))
    'EXCEPT ALL'
    """
    kind = type(node).__name__.upper()
    return kind if node.args.get("distinct") else f"{kind} ALL"


def set_operation_branches(tree: exp.Expr) -> list[exp.Expr]:
    """The operands of a chain of one set operation (a UNION b UNION c), left to right.

    A chain that mixes operations, or a parenthesised operand, is one operand.

    >>> import sqlglot
    >>> chain = sqlglot.parse_one("select 1 union select 2 union select 3 except select 4")
    >>> [b.sql() for b in set_operation_branches(chain)]
    ['SELECT 1 UNION SELECT 2 UNION SELECT 3', 'SELECT 4']
    """
    if not isinstance(tree, exp.SetOperation):
        return [tree]
    kind = set_operation_kind(tree)
    branches = []
    for side in (tree.left, tree.right):
        if isinstance(side, exp.SetOperation) and set_operation_kind(side) == kind:
            branches.extend(set_operation_branches(side))
        else:
            branches.append(side)
    return branches


def conjuncts(condition: exp.Expr | None, nested: bool = False) -> list[exp.Expr]:
    """The AND-ed conditions of `condition`, without their parentheses.

    The top-level conjuncts only (sqlglot's flatten): a parenthesised AND
    inside is one conjunct, as the model writes it. With `nested`, such ANDs
    are split too: merge_subqueries ANDs a merged subquery's WHERE to the
    outer one in parentheses, and the join-key walk (key_bounds.py) looks
    through them, while refusals and semi-join extraction read conjuncts as
    written.

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select 1 from t where (a = 1 and b = 2) and c = 3")
    >>> [c.sql() for c in conjuncts(q.args["where"].this)]
    ['a = 1 AND b = 2', 'c = 3']
    >>> [c.sql() for c in conjuncts(q.args["where"].this, nested=True)]
    ['a = 1', 'b = 2', 'c = 3']
    """
    if condition is None:
        return []
    if nested:
        if isinstance(condition, exp.And):
            return [*conjuncts(condition.left, True), *conjuncts(condition.right, True)]
        if isinstance(condition, exp.Paren):
            return conjuncts(condition.this, True)
        return [condition]
    condition = condition.unnest()
    found = condition.flatten() if isinstance(condition, exp.And) else [condition]
    return [c.unnest() for c in found]


def equality_sides(
    conjunct: exp.Expr, one_side: set[str], other_side: str
) -> tuple[exp.Expr, exp.Expr] | None:
    """(one side's expression, the other's) of an equality between the two sides, else None.

    `one_side` are the aliases of one side (several inputs joined so far, or
    an outer query), `other_side` the alias of the one input on the other.

    >>> import sqlglot
    >>> eq = sqlglot.parse_one("r.k = l.k + 1")
    >>> [e.sql() for e in equality_sides(eq, {"l"}, "r")]
    ['l.k + 1', 'r.k']
    >>> equality_sides(sqlglot.parse_one("r.k = 1"), {"l"}, "r") is None
    True
    """
    if not isinstance(conjunct, exp.EQ):
        return None
    a, b = conjunct.this, conjunct.expression
    a_uses, b_uses = exp.column_table_names(a), exp.column_table_names(b)
    if a_uses and b_uses and a_uses <= one_side and b_uses == {other_side}:
        return a, b
    if a_uses and b_uses and b_uses <= one_side and a_uses == {other_side}:
        return b, a
    return None


def _operand(value: exp.Expr) -> exp.Expr:
    # sqlglot prints a tree as it is, without adding parentheses for precedence:
    # Sub(a, Sub(b, c)) prints `a - b - c`. Arithmetic operands are wrapped here.
    return exp.paren(value, copy=False) if isinstance(value, (exp.Binary, exp.Neg)) else value


def plus(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    """left + right, each side parenthesized when it is an operation.

    >>> minus(exp.column("a"), plus(exp.column("b"), exp.column("c"))).sql()
    'a - (b + c)'
    """
    return exp.Add(this=_operand(left), expression=_operand(right))


def minus(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    return exp.Sub(this=_operand(left), expression=_operand(right))


def times(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    return exp.Mul(this=_operand(left), expression=_operand(right))


def divided(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    return exp.Div(this=_operand(left), expression=_operand(right))
