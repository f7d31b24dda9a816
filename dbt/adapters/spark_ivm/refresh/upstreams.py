"""Views the refresh reads: the model's own, and upstream ivm models among its sources.

An ivm model's relation is a view over its state table, reading it at a fixed
version; its properties name the state. Upstream ivm models are read through
their state's change feed, with the view's definition applied to each change
row (ivm_compiler's UpstreamModel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlglot import exp, parse_one

from dbt.adapters.spark_ivm.consistency.publish import Runner
from dbt.adapters.spark_ivm.delta.tables import show_properties
from dbt.adapters.spark_ivm.refresh.state_history import table_name_of
from ivm_compiler import TableName, emit, log_state
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.sql import DIALECT


def view_text(runner: Runner, view: TableName) -> str | None:
    """The SELECT a view was defined with, as Spark stores it."""
    _, rows = runner.query(f"DESCRIBE TABLE EXTENDED {view.sql()}")
    return next((str(row[1]) for row in rows if str(row[0]) == "View Text"), None)


def properties(runner: Runner, relation: TableName) -> dict[str, str]:
    _, rows = runner.query(show_properties(relation))
    return {str(row[0]): str(row[1]) for row in rows}


def version_read(view: exp.Expr, state: TableName) -> int | None:
    """The VERSION AS OF at which a view reads `state`, if it pins one."""
    for node in view.find_all(exp.Table):
        if TableName.of(node) == state and node.args.get("version") is not None:
            return int(node.args["version"].expression.name)
    return None


def published_version(runner: Runner, view: TableName, state: TableName) -> int | None:
    """The state version a model's view shows (None: a view that does not pin one)."""
    text = view_text(runner, view)
    if text is None:
        return None
    return version_read(parse_one(text, read=DIALECT), state)


def upstream_models(
    runner: Runner,
    tables: Iterable[TableName],
    relation_exists: Callable[[TableName], str | None],
    view_properties: dict[TableName, dict[str, str]] | None = None,
) -> dict[TableName, UpstreamModel]:
    """The sources that are ivm models: views that name their state table.

    `view_properties` collects the properties of each ivm model's view (what
    its publication recorded, which the no-change shortcut compares); those
    it holds already (the shortcut read them) are not read again.
    """
    found = {}
    known = view_properties if view_properties is not None else {}
    for table in tables:
        if relation_exists(table) != "view":
            continue
        shown = known[table] if table in known else properties(runner, table)
        state = shown.get(emit.STATE_PROPERTY)
        if not state:
            continue  # a plain view: pinning it explains why it cannot be read
        text = view_text(runner, table)
        assert text is not None, f"{table} is a view without a view text"
        view = parse_one(text, read=DIALECT)
        assert isinstance(view, exp.Select), f"{table}'s view text is not a SELECT"
        if view_properties is not None:
            view_properties[table] = shown
        state_table = table_name_of(state)
        found[table] = UpstreamModel(
            state=state_table,
            view=log_state.summed_view(view, state_table),
            published_version=version_read(view, state_table),
        )
    return found
