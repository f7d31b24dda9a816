"""Plan nodes: the CTEs, FROM-subqueries and EXISTS/IN subqueries that cannot be merged into the model's query.

A relation that only filters, projects and joins is merged into the query that
reads it (compile.py). One that aggregates, removes duplicates or is a set
operation changes row counts, so its rows cannot be re-derived from the rows
of the outer query; the outer query needs that relation's own changes. A plan
node is such a relation maintained as an ivm model of its own: a view over a
state table, named after the model (`<model>__ivm_cte_<name>`), refreshed
before the model in the same refresh, at the same pinned source versions. The
model then reads the node as it reads an upstream ivm model: through the
change feed of the node's state. It is the KV-store paper's idea of auxiliary
views (maintained views that other views are maintained from) applied inside
one query: the node boundary is where the outer query's delta rules stop.

split_nodes() is pure: it needs the sources' columns to qualify the query (as
sqlglot's optimizer needs them to know what merges) and returns the node
queries and the model's query rewritten to read the nodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries

from ivm_compiler import names, subquery_inputs, window_filters, window_inputs
from ivm_compiler.compile import qualify_model, source_tables
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.parse import parse_model, parse_statement
from ivm_compiler.rules import semi_joins
from ivm_compiler.sql import DIALECT, TableName, set_operation_branches
from ivm_compiler.view_classes.top_k import is_top_k

NODE_INFIX = f"{names.RESERVED_PREFIX}cte_"


@dataclass(frozen=True)
class PlanNode:
    """One CTE or FROM-subquery of a model, kept as an ivm model of its own."""

    name: str  # as the model's (qualified) query names it
    relation: TableName  # the node's view; its state is `<relation>__ivm_state`
    sql: str  # its query, reading sources and earlier nodes' relations


@dataclass(frozen=True)
class Split:
    """A model's query and the nodes it reads, in the order they must be refreshed."""

    sql: str  # the model's query reading the nodes (the original SQL when there are none)
    nodes: tuple[PlanNode, ...] = ()


def node_relation(model_relation: TableName, cte: str) -> TableName:
    """`<model>__ivm_cte_<name>` beside the model: a plain identifier for any CTE name."""
    plain = re.sub(r"[^0-9a-z_]", "_", cte.lower()) or "cte"
    return TableName(db=model_relation.db, name=f"{model_relation.name}{NODE_INFIX}{plain}")


def split_nodes(
    model: str,
    sql: str,
    model_relation: TableName,
    columns: Callable[[TableName], list[tuple[str, str]]],
) -> Split:
    """The model's query with its unmergeable CTEs and FROM-subqueries made plan nodes.

    A model without any keeps its SQL as written, so its plan, its messages and
    its state fingerprint are what they were before nodes existed.
    """
    tree = _operands_as_subqueries(parse_statement(model, sql))
    if not _has_relations_to_split(tree):
        parse_model(model, sql)  # refuses what it refused before nodes existed
        return Split(sql=sql)

    schemas = {table: columns(table) for table in source_tables(tree)}
    # LEFT SEMI/ANTI JOINs as EXISTS first, as compile_model does before qualifying.
    qualified = subquery_inputs.mark(
        qualify_model(model, semi_joins.joins_as_exists(model, tree), schemas)
    )
    inlined = eliminate_ctes(merge_subqueries(eliminate_subqueries(qualified)))
    assert isinstance(inlined, exp.Query)  # the qualified model, its relations merged
    inlined = window_filters.fold(inlined)
    merged = window_inputs.split_inputs(subquery_inputs.split_subqueries(model, inlined))
    with_ = merged.args.get("with_")
    if with_ is None or not with_.expressions:
        parse_model(model, sql)
        return Split(sql=sql)

    relations: dict[str, TableName] = {}
    nodes = []
    for cte in with_.expressions:
        name = cte.alias_or_name
        relation = node_relation(model_relation, name)
        if relation in relations.values():
            raise NotMaintainable(
                model,
                f"two CTEs or subqueries whose names both become the node {relation.name}",
                "give them names that differ in more than case and punctuation",
            )
        body = _reading_nodes(cte.this, relations)
        nodes.append(PlanNode(name=name, relation=relation, sql=body.sql(dialect=DIALECT)))
        relations[name.lower()] = relation
    outer = merged.copy()
    outer.set("with_", None)
    split = Split(sql=_reading_nodes(outer, relations).sql(dialect=DIALECT), nodes=tuple(nodes))
    # Every part is checked now, before any node is refreshed: a refusal of
    # the outer query must not come after the nodes have been built.
    for node in split.nodes:
        label = f"{model} (CTE {node.name})"
        if is_top_k(parse_statement(label, node.sql)):
            raise NotMaintainable(
                label,
                "ORDER BY ... LIMIT inside a CTE or subquery (which rows it keeps can "
                "change with any row, so the query reading it has no change to apply)",
                "make the top-k the whole model, or " + FALLBACK_HINT,
            )
        _check_part(label, node.sql)
    _check_part(model, split.sql)
    return split


def _check_part(model: str, sql: str) -> None:
    """Refuse a part now, unless it has nodes of its own: its refresh splits and checks those."""
    if not _has_relations_to_split(_operands_as_subqueries(parse_statement(model, sql))):
        parse_model(model, sql)


def _operands_as_subqueries(tree: exp.Expr) -> exp.Expr:
    """A set operation's operands that its counting rule cannot take, as derived tables.

    An operand that aggregates, removes duplicates, or is itself another set
    operation (`a UNION b EXCEPT c`) has no delta rule inside a chain; as
    `SELECT * FROM (operand) AS operand_<i>` it becomes a plan node, and the
    operand reads the node's rows.
    """
    if not isinstance(tree, exp.SetOperation):
        return tree
    tree = tree.copy()
    for index, branch in enumerate(set_operation_branches(tree), start=1):
        inner = branch.unnest() if isinstance(branch, exp.Subquery) else branch
        needs_node = isinstance(inner, exp.SetOperation) or (
            isinstance(inner, exp.Select)
            and (
                inner.args.get("group")
                or inner.args.get("having")
                or inner.args.get("distinct")
                or any(p.find(exp.AggFunc) for p in inner.expressions)
            )
        )
        if needs_node:
            branch.replace(
                exp.select("*").from_(
                    exp.Subquery(
                        this=inner.copy(),
                        alias=exp.TableAlias(this=exp.to_identifier(f"operand_{index}")),
                    )
                )
            )
    return tree


def _has_relations_to_split(tree: exp.Expr) -> bool:
    """A CTE, a derived table in FROM/JOIN, windows over more than one relation
    (window_inputs.py), or an EXISTS/IN subquery that is not one table's rows
    (subquery_inputs.py)."""
    if any(True for _ in tree.find_all(exp.CTE)) or subquery_inputs.needs_nodes(tree):
        return True
    if any(window_inputs.needs_split(select) for select in tree.find_all(exp.Select)):
        return True
    return any(
        isinstance(node.parent, (exp.From, exp.Join)) for node in tree.find_all(exp.Subquery)
    )


def _reading_nodes(query: exp.Expr, relations: Mapping[str, TableName]) -> exp.Expr:
    """The query with every reference to a node's CTE name replaced by the node's relation."""

    def replace(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Table) or node.db or node.name.lower() not in relations:
            return node
        table = relations[node.name.lower()].to_table()
        # The qualified query names the CTE's columns by the reference's alias.
        table.set("alias", exp.TableAlias(this=exp.to_identifier(node.alias_or_name, quoted=True)))
        return table

    return query.transform(replace)
