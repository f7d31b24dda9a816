"""What every part of the compiler shares: the dialect, table names and sqlglot tree helpers.

The leaf of the package's import graph: it imports nothing from ivm_compiler,
so any module may import it (tests/unit/test_import_graph.py keeps the graph
free of cycles). These names used to live in parse.py, which nearly every
module then imported, and a rule that parse.py consulted imported parse.py
back.
"""

from __future__ import annotations

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
    def of(cls, table: exp.Table) -> TableName:
        return cls(db=table.db or None, name=table.name, catalog=table.catalog or None)

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


# -- reading trees --------------------------------------------------------------


def from_tables(select: exp.Select) -> list[exp.Expression]:
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
    """UNION, UNION ALL, INTERSECT, INTERSECT ALL, EXCEPT or EXCEPT ALL."""
    kind = type(node).__name__.upper()
    return kind if node.args.get("distinct") else f"{kind} ALL"


def set_operation_branches(tree: exp.Expression) -> list[exp.Expression]:
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
