"""Orphaned ivm state: auxiliary tables no ivm model of the project owns any more.

dbt never drops the relations of a model that was deleted, renamed or moved
to another materialization; for an ivm model that leaves its state table (and
any other `<model>__ivm_*` table) and its view behind. `dbt run-operation
ivm_orphans` lists them; with `--args '{drop: true}'` it drops them.

Only relations the plugin made are considered: tables whose name carries the
reserved `__ivm_` infix, and views whose `spark_ivm.state` property names one
of those tables. Nothing else in a schema is ever touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ivm_compiler import TableName, names


@dataclass(frozen=True)
class Relation:
    name: TableName
    kind: str  # "table" | "view"


@dataclass(frozen=True)
class Orphan:
    relation: Relation
    # The model relation it belonged to (schema.identifier).
    owner: TableName


def _key(table: TableName) -> tuple[str, str]:
    return ((table.db or "").lower(), table.name.lower())


def ivm_models(graph: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(schema, identifier) of every model the project materializes as ivm, lower case."""
    found = set()
    for node in (graph.get("nodes") or {}).values():
        if node.get("resource_type") != "model":
            continue
        if (node.get("config") or {}).get("materialized") != "ivm":
            continue
        found.add(
            (str(node.get("schema")).lower(), str(node.get("alias") or node.get("name")).lower())
        )
    return found


def model_schemas(graph: Mapping[str, Any]) -> set[str]:
    """The schemas the project's models live in: where orphans of its models can be."""
    return {
        str(node.get("schema"))
        for node in (graph.get("nodes") or {}).values()
        if node.get("resource_type") == "model" and node.get("schema")
    }


def owner_of(table: TableName) -> TableName | None:
    """The model relation an auxiliary table belongs to: its name before `__ivm_`."""
    owner, marker, _ = table.name.partition(names.RESERVED_PREFIX)
    if not marker or not owner:
        return None
    return TableName(db=table.db, name=owner)


def find_orphans(
    relations: Iterable[Relation],
    owned_by_ivm_models: set[tuple[str, str]],
    state_read_by: Mapping[TableName, TableName],
) -> list[Orphan]:
    """Auxiliary tables whose owner is no ivm model, and the views that read their state.

    `state_read_by` maps a view to the state table its `spark_ivm.state`
    property names (plugin views only).
    """
    orphans = []
    orphaned_tables = set()
    for relation in relations:
        if relation.kind == "view":
            continue
        owner = owner_of(relation.name)
        if owner is None or _key(owner) in owned_by_ivm_models:
            continue
        orphans.append(Orphan(relation, owner))
        orphaned_tables.add(_key(relation.name))
    for view, state in state_read_by.items():
        if _key(state) in orphaned_tables and _key(view) not in owned_by_ivm_models:
            # A plan node's view (`<model>__ivm_cte_<name>`) belongs to its model.
            orphans.append(Orphan(Relation(view, "view"), owner_of(view) or view))
    return sorted(orphans, key=lambda o: (_key(o.owner), o.relation.kind, _key(o.relation.name)))


def report(orphans: list[Orphan], dropped: bool) -> str:
    if not orphans:
        return "ivm_orphans: no orphaned ivm relations"
    verb = "dropped" if dropped else "found"
    lines = [f"ivm_orphans: {verb} {len(orphans)} relation(s) of models that are not ivm models:"]
    lines += [f"  {o.relation.kind} {o.relation.name} (of {o.owner})" for o in orphans]
    if not dropped:
        lines.append("  drop them with: dbt run-operation ivm_orphans --args '{drop: true}'")
    return "\n".join(lines)
