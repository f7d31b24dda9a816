"""SQL -> ViewPlan: qualify the model against its sources' schemas and let its view class plan it.

The one entry point is compile_model(): parse and refuse (parse.py), qualify
and merge CTEs and FROM-subqueries (sqlglot's optimizer), then the first of
the view classes in VIEW_CLASSES that takes the qualified query plans it
(view_classes/), and a top-k modifier wraps the plan. It needs two facts
from Spark, asked through the Catalog protocol so this module stays pure
Python: the sources' columns (to qualify columns and expand ``*``) and the
types Spark gives the model's output columns (so the view users query has
exactly the query's names and types). The state fingerprint is computed
here, with STATE_FORMAT_VERSION.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Protocol

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify

from ivm_compiler import lineage, names, reads, window_filters
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.parse import parse_model, parse_statement
from ivm_compiler.plan import UpstreamModel, ViewClass, ViewPlan
from ivm_compiler.rules import booleans, covariance, extremes, semi_joins
from ivm_compiler.sql import DIALECT, TableName, from_tables, set_operation_branches
from ivm_compiler.view_classes import aggregate, projection, set_operation, top_k, window
from ivm_compiler.view_classes.protocol import QualifiedModel, ViewClassRule

# Bump when the meaning of stored state changes: every model is then rebuilt once.
# 3: every state has a guard row (names.GUARD) that each MERGE checks and moves.
STATE_FORMAT_VERSION = 3

# The view classes (view_classes/), tried in this order on the qualified query:
# the first that takes it plans it, the way sqlglot's optimizer runs its RULES.
# A set operation is recognised first; a SELECT with window functions next (it
# refuses GROUP BY beside them); then aggregates; what is left is a projection.
VIEW_CLASSES: tuple[ViewClassRule, ...] = (set_operation, window, aggregate, projection)


def view_class_rule(view_class: ViewClass) -> ViewClassRule:
    """The module whose rules maintain a plan of this class (emit.py asks).

    It need not be the module that planned it: set_operation.py plans a UNION
    ALL chain as a PROJECTION, which projection.py maintains.

    >>> view_class_rule(ViewClass.GLOBAL_AGGREGATE).__name__
    'ivm_compiler.view_classes.aggregate'
    """
    return next(rule for rule in VIEW_CLASSES if view_class in rule.CLASSES)


class Catalog(Protocol):
    def columns(self, table: TableName) -> list[tuple[str, str]]:
        """(name, Spark type) of each column of a table."""

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        """(name, Spark type) of each output column of a query, without running it."""


def compile_model(
    model: str,
    sql: str,
    catalog: Catalog,
    upstreams: Mapping[TableName, UpstreamModel] | None = None,
    written: str | None = None,
    extremes_kept: int | None = extremes.KEPT_VALUES,
) -> ViewPlan:
    """Compile a model's SQL; `upstreams` are the sources that are ivm models themselves.

    `written` is the model's SQL as its author wrote it when `sql` is that query
    rewritten to read plan nodes (nodes.py): the view keeps the written query's
    column names, and the plan keeps the written query, the one the model must
    equal at the pinned source versions. `extremes_kept`: how many extreme
    values a MIN or MAX keeps per group (None: every value; rules/extremes.py).
    """
    upstreams = {t: u for t, u in (upstreams or {}).items()}
    plan = _compile(model, sql, catalog, upstreams, written or sql, extremes_kept)
    # Top-k modifies any class: the state is the class's, the view orders and limits it.
    top = top_k.extract(model, parse_model(model, sql), [o.name for o in plan.outputs])
    if top is not None:
        # The state is the same for any k; the fingerprint still changes with
        # the ordering, so a new k republishes the view through a rebuild.
        fingerprint = hashlib.sha256(f"{plan.fingerprint} {top.describe()}".encode()).hexdigest()
        plan = dataclasses.replace(
            plan, top_k=top, fingerprint=fingerprint[:16], query=parse_model(model, sql)
        )
    if written is None:
        return _narrowed_upstreams(plan)
    written_tree = parse_statement(model, written)
    assert isinstance(written_tree, exp.Query)  # the SQL the plan was compiled from
    tables = {*source_tables(plan.query), *source_tables(written_tree)}
    return _narrowed_upstreams(
        dataclasses.replace(
            plan,
            sql=written,
            query=written_tree,
            upstreams={t: u for t, u in upstreams.items() if t in tables},
        )
    )


def _narrowed_upstreams(plan: ViewPlan) -> ViewPlan:
    """The plan with each log upstream read for the columns the model reads (reads.narrowed).

    The columns kept are those the compiled query reads of it, and any column
    the model's own query names (its ORDER BY of a top-k, the written query
    of a model read through plan nodes): more than needed is only less
    narrow. After the fingerprint: a state's meaning does not change with
    how its upstreams are read. A query taking every column (`*`, `t.*`)
    reads them whole.
    """
    if any(not isinstance(star.parent, exp.Count) for star in plan.query.find_all(exp.Star)):
        return plan
    named = {column.name for column in plan.query.find_all(exp.Column)}
    upstreams = {
        table: reads.narrowed(upstream, {*plan.source_columns.get(table, {}), *named})
        for table, upstream in plan.upstreams.items()
    }
    return dataclasses.replace(plan, upstreams=upstreams)


def _compile(
    model: str,
    sql: str,
    catalog: Catalog,
    upstreams: dict[TableName, UpstreamModel],
    written: str,
    extremes_kept: int | None,
) -> ViewPlan:
    # A top-k model keeps every row of its query without ORDER BY and LIMIT.
    tree = top_k.without_top_k(parse_model(model, sql))
    for table, upstream in upstreams.items():
        if top_k.is_top_k(upstream.view):
            raise NotMaintainable(
                model,
                f"reading the ivm model {table}, whose view shows only its top rows "
                "(ORDER BY ... LIMIT)",
                f"rank in this model instead (drop the LIMIT of {table}), or " + FALLBACK_HINT,
            )
    tables = source_tables(tree)
    schemas = {table: catalog.columns(table) for table in tables}
    for table, columns in schemas.items():
        _refuse_reserved_source_columns(model, table, columns)
    # LEFT SEMI/ANTI JOINs as EXISTS/NOT EXISTS first: sqlglot's qualify reads
    # `d.k` in a semi join's ON as a field of a column `d` of the left side.
    written_as_exists = semi_joins.joins_as_exists(model, tree)
    # BOOL_AND/BOOL_OR as counts, COVAR_*/CORR over co-moments: aggregates the view classes keep.
    qualified = covariance.as_aggregates(
        booleans.as_counts(
            _inline_relations(model, qualify_model(model, written_as_exists, schemas))
        )
    )
    described = catalog.describe_query(written)
    qualified_model = QualifiedModel(
        model=model,
        sql=sql,
        query=tree,
        tables=tables,
        schemas=schemas,
        qualified=qualified,
        described=described,
        upstreams=upstreams,
        describe_query=catalog.describe_query,
        fingerprint=lambda view_class: _fingerprint(
            view_class, tables, qualified, described, upstreams
        ),
        extremes_kept=extremes_kept,
    )
    rule = next(rule for rule in VIEW_CLASSES if rule.takes(qualified))
    plan = rule.plan(qualified_model)
    return dataclasses.replace(plan, source_columns=lineage.columns_read(qualified, schemas))


def source_tables(tree: exp.Expr) -> list[TableName]:
    """The distinct tables a query reads, in query order (CTE names are not tables)."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    found = [
        TableName.of(node)
        for node in tree.find_all(exp.Table)
        if node.db or node.name.lower() not in ctes
    ]
    return list(dict.fromkeys(found))


def _inline_relations(model: str, qualified: exp.Query) -> exp.Query:
    """Merge CTEs and subqueries in FROM into the query; refuse those that cannot merge.

    sqlglot's optimizer merges a relation that only filters, projects and joins
    (the same rewrite Spark's optimizer does); what remains aggregates, removes
    duplicates or otherwise changes row counts, and has no delta rule here yet.
    """
    merged = window_filters.fold(eliminate_ctes(merge_subqueries(eliminate_subqueries(qualified))))
    assert isinstance(merged, (exp.Select, exp.SetOperation))
    left = merged.args.get("with_")
    if left is not None and left.expressions:
        name = left.expressions[0].alias_or_name
        body = left.expressions[0].this
        why = (
            "aggregates"
            if isinstance(body, exp.Select) and (body.args.get("group") or body.find(exp.AggFunc))
            else "removes duplicates"
            if isinstance(body, exp.Select) and body.args.get("distinct")
            else "cannot be merged into the model's query"
        )
        raise NotMaintainable(
            model,
            f"the CTE or subquery {name!r}, which {why} before the outer query reads it",
            "build it as an ivm model of its own and select from it with ref(), "
            "or " + FALLBACK_HINT,
        )
    for branch in set_operation_branches(merged):
        assert isinstance(branch, exp.Select)
        aliases = [node.alias_or_name.lower() for node in from_tables(branch)]
        repeated = next((a for a in aliases if aliases.count(a) > 1), None)
        if repeated is not None:
            raise NotMaintainable(
                model,
                f"two sources under the one name {repeated!r}",
                "give each occurrence of a table its own alias",
            )
    return merged


def qualify_model(
    model: str, tree: exp.Expr, schemas: dict[TableName, list[tuple[str, str]]]
) -> exp.Query:
    """Every column qualified by its relation and every `*` expanded, or NotMaintainable."""
    nested: dict = {}
    for table, columns in schemas.items():
        level = nested
        for part in table.parts()[:-1]:
            level = level.setdefault(part, {})
        level[table.name] = {n: t for n, t in columns}
    try:
        qualified = qualify(
            tree.copy(),
            schema=nested,
            dialect=DIALECT,
            quote_identifiers=True,
            validate_qualify_columns=True,
        )
    except OptimizeError as error:
        shown = ", ".join(str(t) for t in schemas)
        raise NotMaintainable(
            model,
            f"a column the compiler cannot resolve against {shown} ({error})",
            "check the column exists in the source",
        ) from error
    assert isinstance(qualified, (exp.Select, exp.SetOperation))
    return qualified


def _refuse_reserved_source_columns(
    model: str, source: TableName, columns: list[tuple[str, str]]
) -> None:
    for name, _ in columns:
        if names.is_reserved(name):
            raise NotMaintainable(
                model,
                f"the source column {name!r} of {source} (the prefix __ivm_ is reserved "
                "for bookkeeping, and change rows would carry it twice)",
                "rename the column in the source",
            )


def _unpinned(view: exp.Expr) -> exp.Expr:
    """A view definition without the state version it reads: that moves with every publication."""
    view = view.copy()
    for table in view.find_all(exp.Table):
        table.set("version", None)
    return view


def _fingerprint(
    view_class: ViewClass,
    sources: list[TableName],
    qualified: exp.Query,
    described: list[tuple[str, str]],
    upstreams: Mapping[TableName, UpstreamModel],
) -> str:
    # An upstream's state layout is part of what this state means.
    upstream_views = [
        _unpinned(u.view).sql(dialect=DIALECT) for _, u in sorted(upstreams.items(), key=str)
    ]
    payload = json.dumps(
        [
            STATE_FORMAT_VERSION,
            view_class.value,
            [str(source) for source in sources],
            qualified.sql(dialect=DIALECT),
            described,
            upstream_views,
        ]
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
