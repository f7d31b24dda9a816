"""EXISTS and IN subqueries over anything: the subquery made a relation of its own.

rules/semi_joins.py maintains a semi or anti join with one relation: the
subquery's rows are its table's, filtered, and their change is the table's
change. A subquery that reads a join, a CTE or a derived table, aggregates,
or nests another subquery has rows whose change no table gives; here it is
rewritten into a CTE that nodes.py makes a plan node (an ivm model of its
own, maintained by the delta rules of its class: the join's, the
aggregate's, DISTINCT's), and the outer query's test reads the node as one
relation. The semi join's key relation is then the node's distinct keys, and
their change (reads.key_changes over the node's change feed) drives the
semi and anti join terms as a table's would.

A correlated subquery is a function of the outer row; a node is one
relation, so the correlation is taken out of it:

    x IN (SELECT y FROM a JOIN b ON ... WHERE a.k = o.k AND q)

becomes

    WITH subquery AS (SELECT DISTINCT a.k AS k, y AS y FROM a JOIN b ON ... WHERE q)
    x IN (SELECT subquery.y FROM subquery WHERE subquery.k = o.k)

The conditions of the subquery's WHERE that read the outer row (its
top-level AND conjuncts) move to the outer test, over the node's columns of
the subquery's columns they read; the rest stays in the node. For EXISTS
and IN only whether a row with those columns exists matters, so the node is
DISTINCT over them (a row appears in its change only when the first of its
kind arrives or the last goes). The moved conditions may compare the two
sides any way: the outer test keeps them by a key relation or a partner
filter (rules/semi_joins.py).

An aggregating subquery's groups depend on its WHERE, so its correlation is
taken out only where that is exact: equalities `subquery column = outer
value`, whose subquery column joins the GROUP BY (the groups of the rows
equal to one outer value are the groups of that value). Without a GROUP BY
an aggregate has one row even over no rows (`COUNT(*)` is 0, `MAX` NULL),
which no grouped node can hold for an outer value it never saw: refused, as
is an aggregating subquery correlated other than by such equalities, and a
correlation anywhere but the top-level AND conjuncts of the subquery's WHERE
(in its ON, SELECT list, GROUP BY, HAVING or a subquery nested inside it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.rules.semi_joins import SubqueryPredicate, subquery_predicates, where_conjuncts
from ivm_compiler.sql import DIALECT, conjunction, from_tables

NODE_CTE = "subquery"  # the CTE (and plan node) a subquery becomes: subquery, subquery_2, ...
# The meta key marking a subquery, before relations are merged, as one that needs a node.
MARK = "ivm_subquery_node"


def reads_one_table(select: exp.Select) -> bool:
    """The subquery filters one table (a source, a ref() or a CTE): a semi join can read it alone.

    >>> import sqlglot
    >>> reads_one_table(sqlglot.parse_one("select k from t where v > 0"))
    True
    >>> reads_one_table(sqlglot.parse_one("select k from t join u on t.a = u.a"))
    False
    >>> reads_one_table(sqlglot.parse_one("select max(k) from t"))
    False
    """
    relations = from_tables(select)
    nested = any(n is not select for n in select.find_all(exp.Select, exp.Subquery))
    return (
        len(relations) == 1
        and isinstance(relations[0], exp.Table)
        and not select.args.get("with_")
        and not _aggregates(select)
        and not nested
    )


def needs_nodes(tree: exp.Expr) -> bool:
    """The model's query tests a subquery that is not one table's rows (needs a node)."""
    if not isinstance(tree, exp.Select):
        return False  # in a set operation's operand, semi_joins.check refuses it
    return any(not reads_one_table(p.subquery) for p in subquery_predicates(tree))


def mark(query: exp.Expr) -> exp.Expr:
    """Mark, before relations are merged, the outer query's subqueries that are not one table.

    A derived table that only filters is merged into the subquery later, which
    leaves one table; the subquery still needs its node, since the query as
    written (which a refresh checks without nodes) tests a derived table.
    """
    if isinstance(query, exp.Select):
        for predicate in subquery_predicates(query):
            if not reads_one_table(predicate.subquery):
                predicate.subquery.meta[MARK] = True
    return query


def split_subqueries(model: str, query: exp.Query) -> exp.Query:
    """The query with each subquery that needs it a CTE of its own, before the outer SELECT.

    `query` is qualified, its mergeable CTEs and subqueries merged, the
    subqueries marked first (mark). A subquery left reading one CTE that
    stays (a node of its own) and nothing else reads that node directly.
    """
    if not isinstance(query, exp.Select):
        return query
    query = query.copy()
    with_ = query.args.get("with_")
    ctes = list(with_.expressions) if with_ is not None else []
    kept = {cte.alias_or_name.lower() for cte in ctes}
    taken = set(kept)
    added: list[exp.CTE] = []
    outer_aliases = {node.alias_or_name for node in from_tables(query)}
    for predicate in subquery_predicates(query):
        subquery = predicate.subquery
        if reads_one_table(subquery) and (
            not subquery.meta.get(MARK) or from_tables(subquery)[0].name.lower() in kept
        ):
            continue
        name = _cte_name(taken)
        body, test = _decorrelated(model, predicate, outer_aliases, name)
        added.append(
            exp.CTE(this=body, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))
        )
        subquery.replace(test)
    if added:
        query.set("with_", exp.With(expressions=[*ctes, *added]))
    return query


@dataclass(frozen=True)
class _Columns:
    """The node's columns: each subquery expression the outer test reads, by its SQL, named."""

    names: dict[str, str]
    expressions: dict[str, exp.Expr]

    def add(self, expression: exp.Expr, proposed: str) -> str:
        key = expression.sql(dialect=DIALECT)
        if key not in self.names:
            taken = {n.lower() for n in self.names.values()}
            name, n = proposed, 1
            while name.lower() in taken:
                n += 1
                name = f"{proposed}_{n}"
            self.names[key] = name
            self.expressions[key] = expression
        return self.names[key]


def _decorrelated(
    model: str, predicate: SubqueryPredicate, outer_aliases: set[str], name: str
) -> tuple[exp.Select, exp.Select]:
    """(the node's query, the outer test's new subquery reading the node under `name`)."""
    subquery = predicate.subquery
    a_kind = predicate.a_kind
    inner_aliases = {
        node.alias_or_name
        for select in subquery.find_all(exp.Select)
        for node in from_tables(select)
    }
    outer = outer_aliases - inner_aliases

    def reads_outer(node: exp.Expr) -> bool:
        return any(c.table in outer for c in node.find_all(exp.Column))

    conjuncts = where_conjuncts(subquery)
    correlated = [c for c in conjuncts if reads_outer(c)]
    for condition in correlated:
        if condition.find(exp.Select, exp.Subquery) is not None:
            raise NotMaintainable(
                model,
                f"the condition {condition.sql(dialect=DIALECT)[:80]} in {a_kind} subquery, "
                "which nests a subquery that reads the outer query",
                "correlate the inner subquery with the subquery's own tables, or " + FALLBACK_HINT,
            )
    elsewhere = subquery.copy()
    elsewhere.set("where", None)
    stray = next((c for c in elsewhere.find_all(exp.Column) if c.table in outer), None)
    if stray is not None:
        raise NotMaintainable(
            model,
            f"the outer query's column {stray.sql(dialect=DIALECT)} read by {a_kind} subquery "
            "outside the top-level AND conditions of its WHERE (in its ON, SELECT list, "
            "GROUP BY, HAVING, or a nested subquery's condition)",
            "move the correlation into the subquery's WHERE as a condition of its own, joined "
            "to the others with AND, or " + FALLBACK_HINT,
        )
    aggregates = _aggregates(subquery)
    if aggregates and correlated:
        _check_correlated_aggregate(model, predicate, correlated, outer)

    columns = _Columns({}, {})

    def to_node(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table not in outer and node.table:
            column = columns.add(node, node.name)
            return exp.column(column, table=exp.to_identifier(name, quoted=True), quoted=True)
        return node

    moved = [c.transform(to_node) for c in correlated]
    body = subquery.copy()
    rest = [c.copy() for c in conjuncts if not reads_outer(c)]
    body.set("where", exp.Where(this=conjunction(rest)) if rest else None)
    grouped_by = [columns.expressions[key] for key in columns.names]
    values: list[str] = []
    if predicate.tested:
        values = [
            columns.add(
                projection.unalias(),
                projection.unalias().name
                if isinstance(projection.unalias(), exp.Column)
                else f"value_{i}",
            )
            for i, projection in enumerate(subquery.expressions, start=1)
        ]
    if aggregates:
        group = body.args.get("group")
        keys = {
            key.sql(dialect=DIALECT): key
            for key in (*(group.expressions if group is not None else []), *grouped_by)
        }
        if keys:
            body.set("group", exp.Group(expressions=[k.copy() for k in keys.values()]))
        selected = [
            exp.alias_(e.copy(), n, quoted=True)
            for key, n in columns.names.items()
            for e in [columns.expressions[key]]
        ] or [
            exp.alias_(p.unalias().copy(), f"value_{i}", quoted=True)
            for i, p in enumerate(subquery.expressions, start=1)
        ]
        body.set("expressions", selected)
    else:
        selected = [
            exp.alias_(columns.expressions[key].copy(), n, quoted=True)
            for key, n in columns.names.items()
        ] or [exp.alias_(exp.Literal.number(1), "present", quoted=True)]
        body.set("expressions", selected)
        body.set("distinct", exp.Distinct())
    reading = exp.Table(
        this=exp.to_identifier(name, quoted=True),
        alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)),
    )
    selected_by_test: list[exp.Expr] = [
        exp.column(v, table=exp.to_identifier(name, quoted=True), quoted=True) for v in values
    ]
    test = exp.select(*(selected_by_test or [exp.Literal.number(1)])).from_(reading)
    if moved:
        test = test.where(conjunction(moved))
    return body, test


def _check_correlated_aggregate(
    model: str, predicate: SubqueryPredicate, correlated: list[exp.Expr], outer: set[str]
) -> None:
    """Refuse an aggregating subquery whose correlation cannot join its GROUP BY."""
    subquery = predicate.subquery
    if subquery.args.get("group") is None:
        raise NotMaintainable(
            model,
            f"{predicate.a_kind} subquery that aggregates without GROUP BY and reads the "
            "outer query (over an outer row's empty set of rows it still has one row, "
            "which a node grouped by the correlation cannot hold)",
            "GROUP BY the subquery's correlated column, aggregate in a CTE joined to the "
            "query instead, or " + FALLBACK_HINT,
        )
    for condition in correlated:
        sides = (condition.this, condition.expression) if isinstance(condition, exp.EQ) else ()
        inner = [s for s in sides if isinstance(s, exp.Column) and s.table not in outer]
        other = [s for s in sides if s not in inner]
        if (
            len(inner) != 1
            or len(other) != 1
            or any(c.table not in outer for c in other[0].find_all(exp.Column))
        ):
            raise NotMaintainable(
                model,
                f"the condition {condition.sql(dialect=DIALECT)} in {predicate.a_kind} "
                "subquery that aggregates (it relates the subquery to the outer query other "
                "than by an equality of one of the subquery's columns, so the groups "
                "depend on the outer row)",
                "correlate an aggregating subquery by equalities of its columns with the "
                "outer query's, or aggregate in a CTE joined to the query, or " + FALLBACK_HINT,
            )


def _aggregates(select: exp.Select) -> bool:
    return bool(
        select.args.get("group")
        or select.args.get("having")
        or any(p.find(exp.AggFunc) for p in select.expressions)
    )


def _cte_name(taken: set[str]) -> str:
    name, n = NODE_CTE, 1
    while name in taken:
        n += 1
        name = f"{NODE_CTE}_{n}"
    taken.add(name)
    return name
