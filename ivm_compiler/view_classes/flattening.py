"""What every view class's plan does alike: typed outputs, comparable keys, flattened rows.

A plan holds the model's rows as one flattened SELECT: named key columns
(names.group_key) and aggregate arguments (names.argument) over the model's
FROM, JOINs and WHERE. Everything after it (grouping, aggregates, the
state's MERGE) reads those named columns only, so it is the same for one
source or a join. Semi joins are appended to the rows as Spark's own LEFT
SEMI/ANTI joins for the build, and expanded into signed inner-join terms for
the change (rules/semi_joins.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.errors import NotMaintainable
from ivm_compiler.plan import JoinTerm, SourceRef
from ivm_compiler.rules import aggregates, semi_joins
from ivm_compiler.sql import DIALECT, TableName, from_tables
from ivm_compiler.view_classes.protocol import QualifiedModel

# Types Spark cannot compare for equality: a state row keyed by one could never
# be matched again by MERGE.
INCOMPARABLE_TYPES = ("map", "variant")


def typed_projections(
    model: str, qualified: exp.Select, described: list[tuple[str, str]]
) -> list[exp.Expr]:
    """The SELECT list without aliases, one per column Spark describes, each of a usable type."""
    projections = [p.this if isinstance(p, exp.Alias) else p for p in qualified.expressions]
    if len(described) != len(projections):
        raise NotMaintainable(
            model,
            f"a query whose {len(projections)} parsed columns differ from the "
            f"{len(described)} Spark reports",
            "give every output column an alias",
        )
    refuse_untyped_outputs(model, described)
    return projections


def distinct_expressions(expressions: list[exp.Expr]) -> list[exp.Expr]:
    """The expressions without repeats (the same SQL), in order.

    >>> [e.sql() for e in distinct_expressions([exp.column("a"), exp.column("b"), exp.column("a")])]
    ['a', 'b']
    """
    seen: dict[str, exp.Expr] = {}
    for expression in expressions:
        seen.setdefault(expression.sql(dialect=DIALECT), expression)
    return list(seen.values())


def type_names(data_type: str) -> set[str]:
    """The type names in a Spark type string, nested ones included, struct field names excluded.

    sqlglot drops a VOID nested in ARRAY/STRUCT when it builds a DataType, so the
    string Spark reports is scanned instead.

    >>> sorted(type_names("struct<variant:string,m:array<map<string,void>>>"))
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


def refuse_untyped_outputs(model: str, described: list[tuple[str, str]]) -> None:
    for name, data_type in described:
        if type_names(data_type) & {"void", "null"}:
            raise NotMaintainable(
                model,
                f"the untyped NULL in column {name!r} of type {data_type} (Delta cannot "
                "store a column of type VOID)",
                f"give it a type, e.g. CAST(NULL AS STRING) AS {name}",
            )


def refuse_incomparable_keys(model: str, typed_keys: list[tuple[str, str]], role: str) -> None:
    for name, data_type in typed_keys:
        found = type_names(data_type)
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


def with_clauses(target: exp.Select, source: exp.Select, clauses: tuple[str, ...]) -> exp.Select:
    """target with copies of source's clauses (e.g. FROM, JOINs, WHERE)."""
    for clause in clauses:
        value = source.args.get(clause)
        if value:
            target.set(
                clause, [v.copy() for v in value] if isinstance(value, list) else value.copy()
            )
    return target


def flattened_rows(
    qualified: exp.Select,
    keys: list[exp.Expr],
    arguments: dict[str, aggregates.ArgumentState],
) -> exp.Select:
    """SELECT <row keys and aggregate arguments, named> FROM <the model's sources> WHERE <filter>."""
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
    return with_clauses(exp.Select(expressions=columns), qualified, ("from_", "joins", "where"))


def sources_of(rows: exp.Select) -> tuple[SourceRef, ...]:
    """Every table occurrence of the rows' FROM and JOINs, in query order."""
    return tuple(
        SourceRef(alias=node.alias_or_name, table=TableName.of(node)) for node in from_tables(rows)
    )


@dataclass(frozen=True)
class Rows:
    """A plan's flattened rows with its semi joins: what the build reads and the change sums."""

    rows: exp.Select
    sources: tuple[SourceRef, ...]
    join_terms: tuple[JoinTerm, ...]


def rows_with_semi_joins(
    model: QualifiedModel,
    unfiltered: exp.Select,
    semis: tuple[semi_joins.SemiJoin, ...],
    keys: list[exp.Expr],
    arguments: dict[str, aggregates.ArgumentState],
) -> Rows:
    """The flattened rows of `unfiltered` (the query without its semi joins), semi joins appended.

    With semi or outer joins, the rows' change is a sum of signed inner-join
    terms (join_terms); without, it follows the join rule directly.
    """
    unfiltered_rows = flattened_rows(unfiltered, keys, arguments)
    rows = semi_joins.as_joins(unfiltered_rows, semis)
    sources = sources_of(rows)
    column_types = {
        ref.alias: {name.lower(): data_type for name, data_type in model.schemas[ref.table]}
        for ref in sources
    }
    terms = semi_joins.expand(model.model, unfiltered_rows, semis, column_types)
    return Rows(rows=rows, sources=sources, join_terms=terms)
