"""SQL -> ViewPlan: qualify the model against its source's schema and derive its state.

The one entry point is compile_model(). It needs two facts from Spark, asked
through the Catalog protocol so this module stays pure Python: the source's
columns (to qualify columns and expand ``*``) and the types Spark gives the
model's output columns (so the view users query has exactly the query's
names and types).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Protocol

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify

from ivm_compiler import lineage, names
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.parse import parse_model, parse_statement
from ivm_compiler.plan import (
    OutputColumn,
    PreAggregation,
    SourceRef,
    StateColumn,
    UpstreamModel,
    ViewClass,
    ViewPlan,
)
from ivm_compiler.rules import (
    aggregates,
    counting,
    extremes,
    outer_joins,
    semi_joins,
    top_k,
    windows,
)
from ivm_compiler.rules.top_k import is_top_k, without_top_k
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    from_tables,
    set_operation_branches,
    set_operation_kind,
)

# Bump when the meaning of stored state changes: every model is then rebuilt once.
# 3: every state has a guard row (names.GUARD) that each MERGE checks and moves.
STATE_FORMAT_VERSION = 3


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
) -> ViewPlan:
    """Compile a model's SQL; `upstreams` are the sources that are ivm models themselves.

    `written` is the model's SQL as its author wrote it when `sql` is that query
    rewritten to read plan nodes (nodes.py): the view keeps the written query's
    column names, and the plan keeps the written query, the one the model must
    equal at the pinned source versions.
    """
    upstreams = {t: u for t, u in (upstreams or {}).items()}
    plan = _compile(model, sql, catalog, upstreams, written or sql)
    top = top_k.extract(model, parse_model(model, sql), [o.name for o in plan.outputs])
    if top is not None:
        # The state is the same for any k; the fingerprint still changes with
        # the ordering, so a new k republishes the view through a rebuild.
        fingerprint = hashlib.sha256(f"{plan.fingerprint} {top.describe()}".encode()).hexdigest()
        plan = dataclasses.replace(
            plan, top_k=top, fingerprint=fingerprint[:16], query=parse_model(model, sql)
        )
    if written is None:
        return plan
    written_tree = parse_statement(model, written)
    tables = {*source_tables(plan.query), *source_tables(written_tree)}
    return dataclasses.replace(
        plan,
        sql=written,
        query=written_tree,
        upstreams={t: u for t, u in upstreams.items() if t in tables},
    )


def _compile(
    model: str,
    sql: str,
    catalog: Catalog,
    upstreams: dict[TableName, UpstreamModel],
    written: str,
) -> ViewPlan:
    # A top-k model keeps every row of its query without ORDER BY and LIMIT.
    tree = without_top_k(parse_model(model, sql))
    for table, upstream in upstreams.items():
        if is_top_k(upstream.view):
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
    qualified = _inline_relations(model, qualify_model(model, written_as_exists, schemas))
    described = catalog.describe_query(written)
    plan = _compile_qualified(
        model, sql, catalog, upstreams, tree, tables, schemas, qualified, described
    )
    return dataclasses.replace(plan, source_columns=lineage.columns_read(qualified, schemas))


def _compile_qualified(
    model: str,
    sql: str,
    catalog: Catalog,
    upstreams: dict[TableName, UpstreamModel],
    tree: exp.Select,
    tables: list[TableName],
    schemas: dict[TableName, list[tuple[str, str]]],
    qualified: exp.Query,
    described: list[tuple[str, str]],
) -> ViewPlan:
    if isinstance(qualified, exp.SetOperation):
        return _compile_set_operation(model, sql, tree, tables, qualified, described, upstreams)
    if windows.windows_of(qualified):
        return _compile_window(model, sql, tree, tables, schemas, qualified, described, upstreams)
    # The rows without their semi and anti joins, which become key relations of join terms.
    unfiltered, semis = semi_joins.extract(model, qualified)
    projections = _typed_projections(model, qualified, described)
    group = qualified.args.get("group")
    having = qualified.args.get("having")
    is_aggregate = bool(group) or any(
        p.find(exp.AggFunc) for p in projections + ([having] if having else [])
    )

    preaggregations: list[PreAggregation] = []
    arguments: dict[str, aggregates.ArgumentState] = {}
    if not is_aggregate:
        if having:
            raise NotMaintainable(model, "HAVING without aggregates")
        view_class = ViewClass.DISTINCT if qualified.args.get("distinct") else ViewClass.PROJECTION
        _refuse_incomparable_keys(model, described, "column")
        keys = _distinct_expressions(projections)
        key_columns = [counting.key_column(i) for i in range(len(keys))]
        key_names = {key.sql(dialect=DIALECT): col.name for key, col in zip(keys, key_columns)}
        finals = [aggregates.state_column(key_names[p.sql(dialect=DIALECT)]) for p in projections]
        state = [*key_columns, counting.count_column()]
        having_final = None
    else:
        if qualified.args.get("distinct"):
            raise NotMaintainable(model, "SELECT DISTINCT together with aggregates")
        keys = _distinct_expressions(_group_keys(group, projections))
        # GROUP BY ALL over aggregates only is, for Spark, an aggregate without GROUP BY.
        view_class = ViewClass.GROUPED_AGGREGATE if keys else ViewClass.GLOBAL_AGGREGATE
        key_columns = [counting.key_column(i) for i in range(len(keys))]
        aggregated = projections + ([having.this] if having else [])
        arguments = _aggregate_arguments(model, aggregated)
        avg_types = _probe_types(model, catalog, qualified, keys, aggregated, arguments)
        rewrite = _finalizer(model, keys, key_columns, arguments, avg_types)
        finals = [rewrite(p) for p in projections]
        having_final = rewrite(having.this) if having else None
        state = [*key_columns, counting.count_column()]
        for argument in arguments.values():
            state.extend(argument.columns())
        for argument in arguments.values():
            if argument.recomputed:
                columns, preaggregation = extremes.columns(argument, slot=len(preaggregations) + 1)
                state.extend(columns)
                preaggregations.append(preaggregation)

    outputs = tuple(
        OutputColumn(name=name, data_type=data_type, expression=final)
        for (name, data_type), final in zip(described, finals)
    )
    unfiltered_rows = _flattened_rows(unfiltered, keys, arguments)
    rows = semi_joins.as_joins(unfiltered_rows, semis)
    sources = tuple(
        SourceRef(alias=node.alias_or_name, table=TableName.of(node)) for node in from_tables(rows)
    )
    column_types = {
        ref.alias: {name.lower(): data_type for name, data_type in schemas[ref.table]}
        for ref in sources
    }
    return ViewPlan(
        model=model,
        view_class=view_class,
        sql=sql,
        query=tree,
        sources=sources,
        rows=rows,
        keys=tuple(c.name for c in key_columns),
        state_columns=tuple(state),
        preaggregations=tuple(preaggregations),
        upstreams={t: u for t, u in upstreams.items() if t in tables},
        outputs=outputs,
        having=having_final,
        fingerprint=_fingerprint(view_class, tables, qualified, described, upstreams),
        join_terms=semi_joins.expand(model, unfiltered_rows, semis, column_types),
    )


def source_tables(tree: exp.Expression) -> list[TableName]:
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
    merged = eliminate_ctes(merge_subqueries(eliminate_subqueries(qualified)))
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


# The view each set operation shows, from one multiplicity per operand.
SET_OPERATION_CLASSES = {
    "UNION ALL": ViewClass.PROJECTION,
    "UNION": ViewClass.DISTINCT,
    "INTERSECT": ViewClass.SET_OPERATION,
    "INTERSECT ALL": ViewClass.SET_OPERATION,
    "EXCEPT": ViewClass.SET_OPERATION,
    "EXCEPT ALL": ViewClass.SET_OPERATION,
}


def _compile_set_operation(
    model: str,
    sql: str,
    tree: exp.Query,
    tables: list[TableName],
    qualified: exp.SetOperation,
    described: list[tuple[str, str]],
    upstreams: dict[TableName, UpstreamModel],
) -> ViewPlan:
    """a OP b OP ...: one state row per distinct output row, with its count in every operand.

    The rows of all operands are flattened into one relation with the operand's
    index; UNION ALL and UNION keep the total count (a projection and a
    DISTINCT), INTERSECT and EXCEPT [ALL] also one count per operand, from which
    the view decides whether and how often a row appears (the consistency-levels
    paper's set-operation views with auxiliary counts).
    """
    kind = set_operation_kind(qualified)
    operands = set_operation_branches(qualified)
    _refuse_untyped_outputs(model, described)
    _refuse_incomparable_keys(model, described, "column")
    per_operand = SET_OPERATION_CLASSES[kind] is ViewClass.SET_OPERATION
    flattened = []
    for index, operand in enumerate(operands):
        assert isinstance(operand, exp.Select)
        if (
            operand.args.get("group")
            or operand.args.get("having")
            or operand.args.get("distinct")
            or any(p.find(exp.AggFunc) for p in operand.expressions)
        ):
            raise NotMaintainable(
                model,
                f"an operand of {kind} that aggregates or uses DISTINCT",
                "build that operand as an ivm model of its own and ref() it, or " + FALLBACK_HINT,
            )
        if semi_joins.has_semi_join(operand):
            raise NotMaintainable(
                model,
                f"a LEFT SEMI or LEFT ANTI JOIN inside an operand of {kind}",
                "build that operand as an ivm model of its own and ref() it, or " + FALLBACK_HINT,
            )
        if outer_joins.has_outer_join(operand):
            raise NotMaintainable(
                model,
                f"an outer join inside an operand of {kind}",
                "build that operand as an ivm model of its own and ref() it, or " + FALLBACK_HINT,
            )
        if len(operand.expressions) != len(described):
            raise NotMaintainable(
                model,
                f"{kind} operands with {len(operand.expressions)} and {len(described)} columns",
                "give every operand the same columns",
            )
        columns = [
            exp.alias_(
                (p.this if isinstance(p, exp.Alias) else p).copy(), names.group_key(i), quoted=True
            )
            for i, p in enumerate(operand.expressions)
        ]
        if per_operand:
            columns.append(exp.alias_(exp.Literal.number(index), names.OPERAND, quoted=True))
        flattened.append(
            _with_clauses(exp.Select(expressions=columns), operand, ("from_", "joins", "where"))
        )
    union: exp.Query = flattened[0]
    for rows in flattened[1:]:
        union = exp.union(union, rows, distinct=False)

    key_columns = [counting.key_column(i) for i in range(len(described))]
    state = [*key_columns, counting.count_column()]
    if per_operand:
        state += [counting.operand_count_column(i) for i in range(len(operands))]
    sources = tuple(
        SourceRef(alias=node.alias_or_name, table=TableName.of(node))
        for operand in operands
        for node in from_tables(operand)
    )
    view_class = SET_OPERATION_CLASSES[kind]
    return ViewPlan(
        model=model,
        view_class=view_class,
        sql=sql,
        query=tree,
        sources=sources,
        rows=union,
        keys=tuple(c.name for c in key_columns),
        state_columns=tuple(state),
        preaggregations=(),
        upstreams={t: u for t, u in upstreams.items() if t in tables},
        outputs=tuple(
            OutputColumn(name=name, data_type=data_type, expression=aggregates.state_column(c.name))
            for (name, data_type), c in zip(described, key_columns)
        ),
        having=None,
        fingerprint=_fingerprint(view_class, tables, qualified, described, upstreams),
        set_operation=kind,
    )


def _compile_window(
    model: str,
    sql: str,
    tree: exp.Query,
    tables: list[TableName],
    schemas: dict[TableName, list[tuple[str, str]]],
    qualified: exp.Select,
    described: list[tuple[str, str]],
    upstreams: dict[TableName, UpstreamModel],
) -> ViewPlan:
    """SELECT ..., f() OVER (PARTITION BY p ...) FROM src WHERE q: the projection's state.

    The window values are computed in the flattened rows, so the state is the
    projection's (one row per distinct output row, with its multiplicity),
    keyed also by the partition columns when the outputs lack them: the
    refresh replaces the state rows of the partitions it touched
    (rules/windows.py) and finds them by those columns.
    """
    windows.check_shape(model, qualified)
    projections = _typed_projections(model, qualified, described)
    _refuse_incomparable_keys(model, described, "column")
    table = TableName.of(from_tables(qualified)[0])
    source_columns = schemas[table]
    partition = windows.partition_columns(
        qualified, {name.lower(): data_type for name, data_type in source_columns}
    )
    keys = _distinct_expressions(projections + [column for column, _ in partition])
    key_columns = [counting.key_column(i) for i in range(len(keys))]
    key_names = {key.sql(dialect=DIALECT): col.name for key, col in zip(keys, key_columns)}
    rows = _flattened_rows(qualified, keys, {})
    view_class = ViewClass.WINDOW
    return ViewPlan(
        model=model,
        view_class=view_class,
        sql=sql,
        query=tree,
        sources=tuple(
            SourceRef(alias=node.alias_or_name, table=TableName.of(node))
            for node in from_tables(rows)
        ),
        rows=rows,
        keys=tuple(c.name for c in key_columns),
        state_columns=(*key_columns, counting.count_column()),
        preaggregations=(),
        upstreams={t: u for t, u in upstreams.items() if t in tables},
        outputs=tuple(
            OutputColumn(
                name=name,
                data_type=data_type,
                expression=aggregates.state_column(key_names[p.sql(dialect=DIALECT)]),
            )
            for (name, data_type), p in zip(described, projections)
        ),
        having=None,
        fingerprint=_fingerprint(view_class, tables, qualified, described, upstreams),
        window_partition=windows.partition_state_columns(partition, key_names),
        tie_warnings=tuple(
            windows.tie_warnings(model, qualified, [name for name, _ in source_columns])
        ),
    )


def _flattened_rows(
    qualified: exp.Select,
    keys: list[exp.Expression],
    arguments: dict[str, aggregates.ArgumentState],
) -> exp.Select:
    """SELECT <row keys and aggregate arguments, named> FROM <the model's sources> WHERE <filter>.

    Everything after this point (grouping, aggregates, the state's merge) reads
    these named columns only, so it is the same for one source or a join.
    """
    columns = [
        exp.alias_(key.copy(), names.group_key(i), quoted=True) for i, key in enumerate(keys)
    ]
    columns += [
        exp.alias_(a.argument.copy(), names.argument(a.index), quoted=True)
        for a in arguments.values()
    ]
    if not columns:
        # COUNT(*) alone reads no column; a SELECT still needs one.
        columns = [exp.alias_(exp.true(), names.argument(0), quoted=True)]
    return _with_clauses(exp.Select(expressions=columns), qualified, ("from_", "joins", "where"))


def _with_clauses(target: exp.Select, source: exp.Select, clauses: tuple[str, ...]) -> exp.Select:
    """target with copies of source's clauses (e.g. FROM, JOINs, WHERE)."""
    for clause in clauses:
        value = source.args.get(clause)
        if value:
            target.set(
                clause, [v.copy() for v in value] if isinstance(value, list) else value.copy()
            )
    return target


def qualify_model(
    model: str, tree: exp.Expression, schemas: dict[TableName, list[tuple[str, str]]]
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


def _typed_projections(
    model: str, qualified: exp.Select, described: list[tuple[str, str]]
) -> list[exp.Expression]:
    """The SELECT list without aliases, one per column Spark describes, each of a usable type."""
    projections = [p.this if isinstance(p, exp.Alias) else p for p in qualified.expressions]
    if len(described) != len(projections):
        raise NotMaintainable(
            model,
            f"a query whose {len(projections)} parsed columns differ from the "
            f"{len(described)} Spark reports",
            "give every output column an alias",
        )
    _refuse_untyped_outputs(model, described)
    return projections


def _distinct_expressions(expressions: list[exp.Expression]) -> list[exp.Expression]:
    seen: dict[str, exp.Expression] = {}
    for expression in expressions:
        seen.setdefault(expression.sql(dialect=DIALECT), expression)
    return list(seen.values())


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


def _type_names(data_type: str) -> set[str]:
    """The type names in a Spark type string, nested ones included, struct field names excluded.

    sqlglot drops a VOID nested in ARRAY/STRUCT when it builds a DataType, so the
    string Spark reports is scanned instead.

    >>> sorted(_type_names("struct<variant:string,m:array<map<string,void>>>"))
    ['array', 'map', 'string', 'struct', 'void']
    """
    names_found: set[str] = set()
    token = ""
    for char in data_type.lower() + ",":
        if char.isalnum() or char == "_":
            token += char
            continue
        if token and char != ":" and not token.isdigit():
            names_found.add(token)
        token = ""
    return names_found


def _refuse_untyped_outputs(model: str, described: list[tuple[str, str]]) -> None:
    for name, data_type in described:
        if _type_names(data_type) & {"void", "null"}:
            raise NotMaintainable(
                model,
                f"the untyped NULL in column {name!r} of type {data_type} (Delta cannot "
                "store a column of type VOID)",
                f"give it a type, e.g. CAST(NULL AS STRING) AS {name}",
            )


# Types Spark cannot compare for equality: a state row keyed by one could never
# be matched again by MERGE.
INCOMPARABLE_TYPES = ("map", "variant")


def _refuse_incomparable_keys(model: str, typed_keys: list[tuple[str, str]], role: str) -> None:
    for name, data_type in typed_keys:
        found = _type_names(data_type)
        if found & {"void", "null"}:
            raise NotMaintainable(
                model,
                f"the untyped NULL {role} {name!r} (Delta cannot store a column of type VOID)",
                "give it a type, e.g. CAST(NULL AS STRING)",
            )
        kind = next((t.upper() for t in INCOMPARABLE_TYPES if t in found), None)
        if kind is not None:
            raise NotMaintainable(
                model,
                f"the {kind} {role} {name!r} of type {data_type} (rows are identified by their "
                f"key values, and Spark cannot compare {kind} values)",
                "leave it out, or turn a MAP into an ARRAY of entries with map_entries() "
                "and a VARIANT into a STRING with to_json()",
            )


def _group_keys(group: exp.Group | None, projections: list[exp.Expression]) -> list[exp.Expression]:
    if group is None:
        return []
    if group.args.get("all"):
        # GROUP BY ALL groups by every output that is not an aggregate.
        return [p for p in projections if not p.find(exp.AggFunc)]
    return list(group.expressions)


def _aggregate_arguments(
    model: str, expressions: list[exp.Expression]
) -> dict[str, aggregates.ArgumentState]:
    """One ArgumentState per distinct aggregate argument, in query order, with what it needs."""
    found: dict[str, aggregates.ArgumentState] = {}
    for expression in expressions:
        for call in expression.find_all(exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max):
            if isinstance(call, exp.Count) and isinstance(call.this, exp.Star):
                continue
            argument = _aggregate_argument(model, call)
            key = argument.sql(dialect=DIALECT)
            previous = found.get(key) or aggregates.ArgumentState(
                index=len(found), argument=argument
            )
            recomputed = set(previous.recomputed)
            if isinstance(call, (exp.Min, exp.Max)):
                recomputed.add("MIN" if isinstance(call, exp.Min) else "MAX")
            elif isinstance(call.this, exp.Distinct):
                recomputed.add("COUNT")
            found[key] = aggregates.ArgumentState(
                index=previous.index,
                argument=argument,
                needs_sum=previous.needs_sum or isinstance(call, (exp.Sum, exp.Avg)),
                needs_count=previous.needs_count
                or (isinstance(call, exp.Count) and not isinstance(call.this, exp.Distinct)),
                recomputed=frozenset(recomputed),
            )
    return found


def _aggregate_argument(model: str, call: exp.Expression) -> exp.Expression:
    """x of COUNT(x), SUM(x), AVG(x), MIN(x), MAX(x) and COUNT(DISTINCT x)."""
    if not isinstance(call.this, exp.Distinct):
        return call.this
    if isinstance(call, exp.Count) and len(call.this.expressions) == 1:
        return call.this.expressions[0]
    raise NotMaintainable(
        model,
        f"{call.sql(dialect=DIALECT)} (only COUNT(DISTINCT x) of one expression is maintained)",
        "aggregate a DISTINCT model of its own, or " + FALLBACK_HINT,
    )


def _probe_types(
    model: str,
    catalog: Catalog,
    qualified: exp.Select,
    keys: list[exp.Expression],
    expressions: list[exp.Expression],
    arguments: dict[str, aggregates.ArgumentState],
) -> dict[str, exp.DataType]:
    """Ask Spark the types that decide what can be maintained; return AVG's result types.

    One DESCRIBE QUERY over the source gives the type of every group key (which
    must be comparable), of SUM(x) for every summed x (a DOUBLE sum means x is
    floating point), and of AVG(x) for every averaged x.
    """
    averaged = {call.this.sql(dialect=DIALECT) for e in expressions for call in e.find_all(exp.Avg)}
    summed = [a for a in arguments.values() if a.needs_sum]
    recomputed = [a for a in arguments.values() if a.recomputed]
    probe_columns: list[exp.Expression] = [
        exp.alias_(key.copy(), f"key_{i}") for i, key in enumerate(keys)
    ]
    probe_columns += [exp.alias_(exp.Sum(this=a.argument.copy()), f"sum_{a.index}") for a in summed]
    probe_columns += [
        exp.alias_(exp.Avg(this=a.argument.copy()), f"avg_{a.index}")
        for key, a in arguments.items()
        if key in averaged
    ]
    # MIN/MAX/COUNT(DISTINCT) group by the argument's values in the pre-aggregation.
    # FIRST rather than MIN: it accepts every type, so a MAP argument reaches
    # the refusal below instead of failing Spark's analysis with a raw error.
    probe_columns += [
        exp.alias_(exp.First(this=a.argument.copy()), f"value_{a.index}") for a in recomputed
    ]
    if not probe_columns:
        return {}
    probe = _with_clauses(exp.Select(expressions=probe_columns), qualified, ("from_", "joins"))
    if keys:
        probe = probe.group_by(*[key.copy() for key in keys])
    types = dict(catalog.describe_query(probe.sql(dialect=DIALECT)))

    _refuse_incomparable_keys(
        model,
        [(key.sql(dialect=DIALECT), types[f"key_{i}"]) for i, key in enumerate(keys)],
        "GROUP BY key",
    )
    _refuse_incomparable_keys(
        model,
        [(a.argument.sql(dialect=DIALECT), types[f"value_{a.index}"]) for a in recomputed],
        "MIN/MAX/COUNT(DISTINCT) argument",
    )
    for argument in summed:
        if types[f"sum_{argument.index}"].lower() == "double":
            shown = argument.argument.sql(dialect=DIALECT)
            raise NotMaintainable(
                model,
                f"SUM/AVG over the floating-point expression {shown} (adding and subtracting "
                "floating-point values drifts from a recomputation, for good)",
                f"cast it to a DECIMAL, e.g. SUM(CAST({shown} AS DECIMAL(38, 6))), or "
                + FALLBACK_HINT,
            )
        _refuse_inexact_decimal_sum(model, argument, types[f"sum_{argument.index}"])
    return {
        key: exp.DataType.build(types[f"avg_{a.index}"], dialect=DIALECT)
        for key, a in arguments.items()
        if key in averaged
    }


# Spark's decimal `+` widens its result by one digit; past precision 38 it
# keeps the integer digits and cuts the scale to max(scale - 1, 6)
# (spark.sql.decimalOperations.allowPrecisionLoss). A refresh adds a sum's
# change to the stored sum with `+`, so a DECIMAL(38, s) sum with s > 6 would
# lose its last digit on every refresh (and a sum near the maximum overflows
# when cast back), while Spark's own SUM adds at DECIMAL(38, s) exactly.
EXACT_DECIMAL_ADD_SCALE = 6


def _refuse_inexact_decimal_sum(
    model: str, argument: aggregates.ArgumentState, sum_type: str
) -> None:
    """Refuse SUM/AVG whose DECIMAL(38, s > 6) sum Spark's `+` cannot add exactly.

    >>> from ivm_compiler.rules.aggregates import ArgumentState
    >>> amount = ArgumentState(index=0, argument=exp.column("amount"), needs_sum=True)
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(38,6)")
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(37,10)")
    >>> _refuse_inexact_decimal_sum("m", amount, "decimal(38,10)")
    Traceback (most recent call last):
    ...
    ivm_compiler.errors.NotMaintainable: ...DECIMAL(38, 10)...
    """
    data_type = exp.DataType.build(sum_type, dialect=DIALECT)
    if data_type.this != exp.DataType.Type.DECIMAL or len(data_type.expressions) != 2:
        return
    precision, scale = (int(e.this.name) for e in data_type.expressions)
    if precision < 38 or scale <= EXACT_DECIMAL_ADD_SCALE:
        return
    shown = argument.argument.sql(dialect=DIALECT)
    raise NotMaintainable(
        model,
        f"SUM/AVG over {shown}, whose sum is a DECIMAL(38, {scale}) (Spark adds two such "
        f"decimals at scale {scale - 1}, so every refresh would round the stored sum)",
        f"cast it to at most {EXACT_DECIMAL_ADD_SCALE} decimal places, e.g. "
        f"SUM(CAST({shown} AS DECIMAL(38, {EXACT_DECIMAL_ADD_SCALE}))), or to at most 27 "
        f"digits, e.g. DECIMAL(27, {scale}), or " + FALLBACK_HINT,
    )


def _finalizer(
    model: str,
    keys: list[exp.Expression],
    key_columns: list[StateColumn],
    arguments: dict[str, aggregates.ArgumentState],
    avg_types: dict[str, exp.DataType],
) -> Callable[[exp.Expression], exp.Expression]:
    """Rewrite an output (or HAVING) expression of an aggregate query over state columns."""
    key_names = {key.sql(dialect=DIALECT): column.name for key, column in zip(keys, key_columns)}

    def replace(node: exp.Expression) -> exp.Expression:
        key_name = key_names.get(node.sql(dialect=DIALECT))
        if key_name is not None:
            return aggregates.state_column(key_name)
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
            return aggregates.finalize_count_star()
        if isinstance(node, (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)):
            key = _aggregate_argument(model, node).sql(dialect=DIALECT)
            index = arguments[key].index
            if isinstance(node, exp.Min):
                return aggregates.state_column(extremes.state_name("MIN", index))
            if isinstance(node, exp.Max):
                return aggregates.state_column(extremes.state_name("MAX", index))
            if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
                return aggregates.state_column(extremes.state_name("COUNT", index))
            if isinstance(node, exp.Count):
                return aggregates.finalize_count(index)
            if isinstance(node, exp.Sum):
                return aggregates.finalize_sum(index)
            return aggregates.finalize_avg(index, avg_types[key])
        return node

    def rewrite(expression: exp.Expression) -> exp.Expression:
        final = expression.copy().transform(replace)
        for column in final.find_all(exp.Column):
            if not names.is_reserved(column.name):
                raise NotMaintainable(
                    model,
                    f"the column {column.sql(dialect=DIALECT)} outside GROUP BY and aggregates",
                    "add it to GROUP BY or aggregate it",
                )
        return final

    return rewrite


def _unpinned(view: exp.Expression) -> exp.Expression:
    """A view definition without the state version it reads: that moves with every publication."""
    view = view.copy()
    for table in view.find_all(exp.Table):
        table.set("version", None)
    return view


def _fingerprint(
    view_class: ViewClass,
    sources: list[TableName],
    qualified: exp.Select,
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
