"""SQL -> ViewPlan: qualify the model against its source's schema and derive its state.

The one entry point is compile_model(). It needs two facts from Spark, asked
through the Catalog protocol so this module stays pure Python: the source's
columns (to qualify columns and expand ``*``) and the types Spark gives the
model's output columns (so the view users query has exactly the query's
names and types).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Protocol

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from ivm_compiler import names
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.parse import DIALECT, TableName, parse_model
from ivm_compiler.plan import OutputColumn, StateColumn, ViewClass, ViewPlan
from ivm_compiler.rules import aggregates, counting

# Bump when the meaning of stored state changes: every model is then rebuilt once.
STATE_FORMAT_VERSION = 1


class Catalog(Protocol):
    def columns(self, table: TableName) -> list[tuple[str, str]]:
        """(name, Spark type) of each column of a table."""

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        """(name, Spark type) of each output column of a query, without running it."""


def compile_model(model: str, sql: str, catalog: Catalog) -> ViewPlan:
    tree = parse_model(model, sql)
    source = TableName.of(tree.find(exp.Table))  # parse_model guarantees exactly one
    source_columns = catalog.columns(source)
    _refuse_reserved_source_columns(model, source, source_columns)
    qualified = _qualify(model, tree, source, source_columns)
    table = qualified.find(exp.Table)
    alias = table.alias_or_name
    described = catalog.describe_query(sql)
    projections = [p.this if isinstance(p, exp.Alias) else p for p in qualified.expressions]
    if len(described) != len(projections):
        raise NotMaintainable(
            model,
            f"a query whose {len(projections)} parsed columns differ from the "
            f"{len(described)} Spark reports",
            "give every output column an alias",
        )
    _refuse_untyped_outputs(model, described)
    where = qualified.args.get("where")
    group = qualified.args.get("group")
    having = qualified.args.get("having")
    is_aggregate = bool(group) or any(
        p.find(exp.AggFunc) for p in projections + ([having] if having else [])
    )

    if not is_aggregate:
        if having:
            raise NotMaintainable(model, "HAVING without aggregates")
        view_class = ViewClass.DISTINCT if qualified.args.get("distinct") else ViewClass.PROJECTION
        _refuse_incomparable_keys(model, described, "column")
        keys = _distinct_expressions(projections)
        key_columns = [counting.key_column(i, key) for i, key in enumerate(keys)]
        key_names = {key.sql(dialect=DIALECT): col.name for key, col in zip(keys, key_columns)}
        finals = [aggregates.state_column(key_names[p.sql(dialect=DIALECT)]) for p in projections]
        state = [*key_columns, counting.count_column(alias)]
        having_final = None
    else:
        if qualified.args.get("distinct"):
            raise NotMaintainable(model, "SELECT DISTINCT together with aggregates")
        keys = _distinct_expressions(_group_keys(group, projections))
        # GROUP BY ALL over aggregates only is, for Spark, an aggregate without GROUP BY.
        view_class = ViewClass.GROUPED_AGGREGATE if keys else ViewClass.GLOBAL_AGGREGATE
        key_columns = [counting.key_column(i, key) for i, key in enumerate(keys)]
        aggregated = projections + ([having.this] if having else [])
        arguments = _aggregate_arguments(aggregated)
        avg_types = _probe_types(model, catalog, table, keys, aggregated, arguments)
        rewrite = _finalizer(model, keys, key_columns, arguments, avg_types)
        finals = [rewrite(p) for p in projections]
        having_final = rewrite(having.this) if having else None
        state = [*key_columns, counting.count_column(alias)]
        for argument in arguments.values():
            state.extend(argument.columns(alias))

    outputs = tuple(
        OutputColumn(name=name, data_type=data_type, expression=final)
        for (name, data_type), final in zip(described, finals)
    )
    return ViewPlan(
        model=model,
        view_class=view_class,
        sql=sql,
        query=tree,
        source=source,
        source_alias=alias,
        where=where.this if where else None,
        keys=tuple(keys),
        state_columns=tuple(state),
        outputs=outputs,
        having=having_final,
        fingerprint=_fingerprint(view_class, source, qualified, described),
    )


def _qualify(
    model: str, tree: exp.Select, source: TableName, columns: list[tuple[str, str]]
) -> exp.Select:
    nested: dict = {source.name: {n: t for n, t in columns}}
    for part in reversed(source.parts()[:-1]):
        nested = {part: nested}
    try:
        qualified = qualify(
            tree.copy(),
            schema=nested,
            dialect=DIALECT,
            quote_identifiers=True,
            validate_qualify_columns=True,
        )
    except OptimizeError as error:
        raise NotMaintainable(
            model,
            f"a column the compiler cannot resolve against {source} ({error})",
            "check the column exists in the source",
        ) from error
    assert isinstance(qualified, exp.Select)
    return qualified


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
    expressions: list[exp.Expression],
) -> dict[str, aggregates.ArgumentState]:
    """One ArgumentState per distinct argument of COUNT(x), SUM(x), AVG(x), in query order."""
    found: dict[str, aggregates.ArgumentState] = {}
    for expression in expressions:
        for call in expression.find_all(exp.Count, exp.Sum, exp.Avg):
            if isinstance(call, exp.Count) and isinstance(call.this, exp.Star):
                continue
            key = call.this.sql(dialect=DIALECT)
            needs_sum = not isinstance(call, exp.Count)
            previous = found.get(key)
            found[key] = aggregates.ArgumentState(
                index=previous.index if previous else len(found),
                argument=call.this,
                needs_sum=needs_sum or bool(previous and previous.needs_sum),
            )
    return found


def _probe_types(
    model: str,
    catalog: Catalog,
    table: exp.Table,
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
    probe_columns: list[exp.Expression] = [
        exp.alias_(key.copy(), f"key_{i}") for i, key in enumerate(keys)
    ]
    probe_columns += [exp.alias_(exp.Sum(this=a.argument.copy()), f"sum_{a.index}") for a in summed]
    probe_columns += [
        exp.alias_(exp.Avg(this=a.argument.copy()), f"avg_{a.index}")
        for key, a in arguments.items()
        if key in averaged
    ]
    if not probe_columns:
        return {}
    probe = exp.select(*probe_columns).from_(table.copy())
    if keys:
        probe = probe.group_by(*[key.copy() for key in keys])
    types = dict(catalog.describe_query(probe.sql(dialect=DIALECT)))

    _refuse_incomparable_keys(
        model,
        [(key.sql(dialect=DIALECT), types[f"key_{i}"]) for i, key in enumerate(keys)],
        "GROUP BY key",
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
    return {
        key: exp.DataType.build(types[f"avg_{a.index}"], dialect=DIALECT)
        for key, a in arguments.items()
        if key in averaged
    }


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
        if isinstance(node, (exp.Count, exp.Sum, exp.Avg)):
            key = node.this.sql(dialect=DIALECT)
            index = arguments[key].index
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


def _fingerprint(
    view_class: ViewClass,
    source: TableName,
    qualified: exp.Select,
    described: list[tuple[str, str]],
) -> str:
    payload = json.dumps(
        [
            STATE_FORMAT_VERSION,
            view_class.value,
            str(source),
            qualified.sql(dialect=DIALECT),
            described,
        ]
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
