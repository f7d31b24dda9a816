"""Which columns of each source a model reads: what a source's schema change can break.

A refresh records these columns, with their types, beside each source's
version. When a source's schema changes between two refreshes, only a change
to one of them can make the maintained state wrong (a column the model does
not read can be added, renamed, dropped or retyped freely: the change feed
is read column by column).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from ivm_compiler.sql import TableName


def columns_read(
    qualified: exp.Expr, schemas: Mapping[TableName, list[tuple[str, str]]]
) -> dict[TableName, dict[str, str]]:
    """Source -> {column: Spark type} for every source column the qualified query names.

    The query must be qualified (every column carries its relation, every `*`
    expanded), so a column is a source's exactly when its qualifier resolves,
    in its scope or an enclosing one (a correlated subquery), to that source
    table rather than to a subquery or CTE.
    """
    types = {
        table: {name.lower(): (name, data_type) for name, data_type in columns}
        for table, columns in schemas.items()
    }
    read: dict[TableName, dict[str, str]] = {table: {} for table in schemas}
    for scope in traverse_scope(qualified):
        for column in scope.columns:
            table = _table_of(scope, column.table)
            if table is None or table not in types:
                continue
            found = types[table].get(column.name.lower())
            if found is not None:
                read[table][found[0]] = found[1]
    return {table: dict(sorted(columns.items())) for table, columns in read.items()}


def _table_of(scope: Scope | None, qualifier: str) -> TableName | None:
    """The source table a column qualifier names, looked up from `scope` outwards."""
    while scope is not None:
        source = scope.sources.get(qualifier)
        if isinstance(source, exp.Table):
            return TableName.of(source)
        if source is not None:
            return None  # a subquery or CTE: its own scope names the tables
        scope = scope.parent
    return None
