"""A filter over window functions folded into their SELECT as its QUALIFY.

The latest-row-per-key idiom ranks every row of a relation, then keeps the
first of each key::

    SELECT id, name FROM (
        SELECT id, name, ROW_NUMBER() OVER (PARTITION BY id ORDER BY ts DESC) AS rn
        FROM t
    ) AS ranked WHERE rn = 1

sqlglot's merge_subqueries does not merge a windowed SELECT into a query
that filters it (the filter must see the window values), so the ranking
would become a plan node (nodes.py) holding every row of `t` with its rank,
and the model a second state over that node: two MERGEs per refresh, the
first into a table as large as `t` (the warehouse's order dedupe: its node
held every version of every order). A filter and a projection evaluated
after the windows are still partition-local: the rows a partition keeps
depend on that partition's rows alone. So the outer SELECT is folded into
the windowed one::

    SELECT id, name FROM t QUALIFY ROW_NUMBER() OVER (PARTITION BY id ORDER BY ts DESC) = 1

and view_classes/window.py maintains it as it maintains any window model,
recomputing the partitions a change touches, with the QUALIFY kept on the
recomputed rows; its state holds the kept rows only. Spark 4.0 does not parse
QUALIFY, but sqlglot writes it back for Spark as the filtered subquery
(transforms.eliminate_qualify), so no statement sent to Spark carries it.

fold() runs on a qualified query whose relations sqlglot has merged as far as
it can (compile.py and nodes.py), where the windowed SELECT is a CTE read once.
"""

from __future__ import annotations

from sqlglot import exp

from ivm_compiler.rules.semi_joins import subquery_predicates
from ivm_compiler.sql import from_tables
from ivm_compiler.view_classes.window import takes

# Clauses that change which rows a SELECT gives or how many: neither side of
# the fold may have them (the windowed side may have WHERE and QUALIFY).
_ROW_CLAUSES = ("joins", "group", "having", "distinct", "order", "limit", "offset", "laterals")


def fold(query: exp.Query) -> exp.Query:
    """The query with each filter or projection over a windowed CTE made that CTE's QUALIFY.

    >>> import sqlglot
    >>> q = sqlglot.parse_one(
    ...     "WITH r AS (SELECT t.id AS id, t.v AS v, "
    ...     "ROW_NUMBER() OVER (PARTITION BY t.id ORDER BY t.ts DESC) AS rn FROM t AS t) "
    ...     "SELECT r.id AS id, r.v AS v FROM r AS r WHERE r.rn = 1", read="spark")
    >>> fold(q).sql(dialect="duckdb")
    'SELECT t.id AS id, t.v AS v FROM t AS t QUALIFY ROW_NUMBER() OVER (PARTITION BY t.id ORDER BY t.ts DESC) = 1'

    A windowed CTE read twice, or under a join, stays a CTE (a plan node):

    >>> q = sqlglot.parse_one(
    ...     "WITH r AS (SELECT t.id AS id, RANK() OVER (ORDER BY t.v) AS rk FROM t AS t) "
    ...     "SELECT a.id AS id FROM r AS a JOIN r AS b ON a.id = b.id WHERE a.rk = 1",
    ...     read="spark")
    >>> fold(q) is q
    True
    """
    folded = query
    while True:
        step = _fold_one(folded)
        if step is None:
            return folded
        folded = step


def _fold_one(query: exp.Query) -> exp.Query | None:
    """The query with one windowed CTE folded into the SELECT that reads it, or None."""
    with_ = query.args.get("with_")
    if with_ is None:
        return None
    bodies = {cte.alias_or_name.lower(): cte.this for cte in with_.expressions}
    readers = [query, *(cte.this for cte in with_.expressions)]
    for position, reader in enumerate(readers):
        if not isinstance(reader, exp.Select) or not _plain_filter(reader):
            continue
        (table,) = from_tables(reader)
        if not isinstance(table, exp.Table) or table.db:
            continue
        body = bodies.get(table.name.lower())
        if body is None or not _foldable_windows(body):
            continue
        if _references(query, table.name) != 1:
            continue
        merged = _merged(reader, table.alias_or_name, body)
        if merged is None:
            continue
        result = query.copy()
        ctes = result.args["with_"]
        if position > 0:
            # The same CTE in the copy, by its position.
            ctes.expressions[position - 1].this.replace(merged)
        else:
            result = merged
        remaining = [c for c in ctes.expressions if c.alias_or_name.lower() != table.name.lower()]
        ctes.set("expressions", remaining)
        result.set("with_", ctes if remaining else None)
        return result
    return None


def filtered_windows(select: exp.Select) -> exp.Select | None:
    """The windowed SELECT that `select` only filters and projects, as written (before qualifying).

    parse.py allows window functions there: fold() makes them the model's
    own, or, where it cannot, nodes.py makes their SELECT a plan node.

    >>> import sqlglot
    >>> q = sqlglot.parse_one(
    ...     "select * from (select *, rank() over (partition by k order by v) as r from t) "
    ...     "where r = 1", read="spark")
    >>> filtered_windows(q).sql(dialect="spark")
    'SELECT *, RANK() OVER (PARTITION BY k ORDER BY v) AS r FROM t'
    """
    if not _plain_filter(select):
        return None
    (relation,) = from_tables(select)
    body: exp.Expr | None = None
    if isinstance(relation, exp.Subquery):
        body = relation.unnest()
    elif isinstance(relation, exp.Table) and not relation.db:
        ctes = select.args.get("with_")
        body = next(
            (
                cte.this
                for cte in (ctes.expressions if ctes else [])
                if cte.alias_or_name.lower() == relation.name.lower()
            ),
            None,
        )
    else:
        return None
    return body if isinstance(body, exp.Select) and _foldable_windows(body) else None


def _plain_filter(select: exp.Select) -> bool:
    """One relation filtered and projected: no join, grouping, window, subquery or row order."""
    if any(select.args.get(clause) for clause in _ROW_CLAUSES) or select.args.get("qualify"):
        return False
    if len(from_tables(select)) != 1:
        return False
    parts = [*select.expressions, select.args.get("where")]
    return not any(
        part is not None
        and (part.find(exp.Window, exp.AggFunc, exp.Subquery, exp.Exists) or part.find(exp.Select))
        for part in parts
    )


def _foldable_windows(body: exp.Expr) -> bool:
    """A SELECT of window functions over one table, maintained by view_classes/window.py as is."""
    if not isinstance(body, exp.Select) or not takes(body):
        return False
    if any(body.args.get(clause) for clause in _ROW_CLAUSES):
        return False
    relations = from_tables(body)
    return (
        len(relations) == 1
        and isinstance(relations[0], exp.Table)
        and not subquery_predicates(body)
    )


def _references(query: exp.Query, name: str) -> int:
    """How many times the query reads the CTE `name`."""
    return sum(
        1
        for table in query.find_all(exp.Table)
        if not table.db and table.name.lower() == name.lower()
    )


def _merged(reader: exp.Select, alias: str, body: exp.Select) -> exp.Select | None:
    """`body` with the reader's SELECT list and its WHERE (as QUALIFY), or None if a column of
    the reader is not one of body's outputs."""
    outputs = {p.alias_or_name.lower(): p for p in body.expressions}

    def inlined(expression: exp.Expr) -> exp.Expr | None:
        missing = False

        def replace(node: exp.Expr) -> exp.Expr:
            nonlocal missing
            if not isinstance(node, exp.Column):
                return node
            output = outputs.get(node.name.lower())
            if node.table.lower() != alias.lower() or output is None:
                missing = True
                return node
            value = output.this if isinstance(output, exp.Alias) else output
            return value.copy()

        result = expression.transform(replace)
        return None if missing else result

    projections = [inlined(p) for p in reader.expressions]
    where = reader.args.get("where")
    condition = inlined(where.this) if where is not None else None
    if any(p is None for p in projections) or (where is not None and condition is None):
        return None
    merged = body.copy()
    merged.set("expressions", projections)
    if condition is not None:
        existing = merged.args.get("qualify")
        merged.set(
            "qualify",
            exp.Qualify(this=exp.and_(existing.this, condition) if existing else condition),
        )
    return merged
