"""Source schema changes between two refreshes: find them, name them, decide.

The DyDa paper's point (../shared/papers/dyda-schema-changes-compensation.txt)
is that data changes and schema changes race, and maintenance must never
apply a change against the wrong schema. Here a refresh records, beside each
source's version, the columns the model reads and their types
(ivm_compiler/lineage.py). The next refresh compares them with the source
now:

- a column the model does not read was added, renamed, dropped or retyped:
  nothing to do, the change feed is read column by column;
- a column it reads was retyped, or its name now means another column (a
  rename onto it, a drop and an add): rebuild at the new version, as the
  stored rows were computed from the old values;
- a column it reads was renamed or dropped, so the SQL no longer compiles:
  stop before any write, naming the source, the column and the change.

Delta's history names the change (RENAME COLUMN old -> new, DROP COLUMNS;
delta/schema_history.py reads it); the recorded types catch what the history
does not say (an overwrite with a new schema).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dbt.adapters.spark_ivm.delta.records import RecordedState
from dbt.adapters.spark_ivm.delta.schema_history import SchemaCommit
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot
from ivm_compiler import InvalidSource, IvmError, TableName, ViewPlan

# dbt's on_schema_change values (for the model's own columns).
ON_SCHEMA_CHANGE_VALUES = ("ignore", "fail", "append_new_columns", "sync_all_columns")


@dataclass(frozen=True)
class ColumnChange:
    """A change to a source column the model reads."""

    source: str
    column: str
    # renamed | dropped | retyped | replaced (the name now means another column)
    kind: str
    detail: str

    def describe(self) -> str:
        return f"column {self.column!r} of {self.source} {self.detail}"


def read_column_changes(
    source: str,
    recorded: Mapping[str, str],
    current: Sequence[tuple[str, str]],
    commits: Sequence[SchemaCommit],
) -> list[ColumnChange]:
    """What happened to each column the model read (`recorded`: name -> type) since then.

    `current` is the source's columns now, `commits` its column-changing
    commits after the recorded version.
    """
    now = {name.lower(): data_type for name, data_type in current}
    renames = [r for r in (c.renamed() for c in commits) if r is not None]
    changes = []
    for name, old_type in recorded.items():
        key = name.lower()
        if key not in now:
            onto = next((new for old, new in renames if old.lower() == key), None)
            if onto is not None:
                changes.append(ColumnChange(source, name, "renamed", f"was renamed to {onto!r}"))
            elif any(key in c.dropped() for c in commits):
                changes.append(ColumnChange(source, name, "dropped", "was dropped"))
            else:
                changes.append(
                    ColumnChange(source, name, "dropped", "is gone (dropped or renamed)")
                )
        elif normal_type(now[key]) != normal_type(old_type):
            changes.append(
                ColumnChange(source, name, "retyped", f"changed type from {old_type} to {now[key]}")
            )
        else:
            origin = next((old for old, new in renames if new.lower() == key), None)
            if origin is not None:
                detail = f"is now the column renamed from {origin!r}"
                changes.append(ColumnChange(source, name, "replaced", detail))
            elif any(key in c.added() for c in commits):
                detail = "was dropped and added again (the rows' earlier values are gone)"
                changes.append(ColumnChange(source, name, "replaced", detail))
    return changes


def read_columns_changed(
    plan: ViewPlan,
    pinned: Mapping[TableName, SourceSnapshot],
    recorded: RecordedState,
    window: Mapping[TableName, Sequence[SchemaCommit]],
) -> list[ColumnChange]:
    """Columns the state was computed from that are retyped, or another column now.

    `window`: each source's column-changing commits after its recorded
    version. (A column renamed or dropped while still named by the SQL cannot
    compile; under `SELECT *` it changes the model's own columns, which the
    fingerprint and on_schema_change handle.)
    """
    changes: list[ColumnChange] = []
    for table, snapshot in pinned.items():
        entry = recorded.sources.get(str(table)) or {}
        read = entry.get("columns")
        if not read or snapshot.same_table(entry) is not True:
            continue
        now = plan.source_columns.get(table, {})
        changes.extend(
            c
            for c in read_column_changes(str(table), read, list(now.items()), window.get(table, ()))
            if c.kind in ("retyped", "replaced") and c.column.lower() in {n.lower() for n in now}
        )
    return changes


def sources_to_check(
    plan: ViewPlan, pinned: Mapping[TableName, SourceSnapshot], recorded: RecordedState
) -> dict[TableName, int]:
    """Each source whose column-changing commits a refresh reads: source -> its recorded version.

    Left out: sources that were re-created (a rebuild names that), sources
    with no commit since, and upstream ivm models, whose state never changes
    its columns in place (a rebuild gives it a new table id). Commits past the
    pin count too: the plan compiled against the catalog's columns, which may
    already show them.
    """
    found = {}
    for table, snapshot in pinned.items():
        entry = recorded.sources.get(str(table)) or {}
        if table in plan.upstreams or not entry or snapshot.same_table(entry) is not True:
            continue
        after = int(entry.get("version", snapshot.version))
        if snapshot.version > after:
            found[table] = after
    return found


def model_columns_reason(
    model: str,
    reason: str,
    before: Sequence[tuple[str, str]],
    after: Sequence[tuple[str, str]],
    on_schema_change: str,
) -> str:
    """A rebuild's reason, with the model's own column changes (raises when on_schema_change='fail').

    >>> model_columns_reason("m", "r", [("a", "int")], [("a", "int")], "fail")
    'r'
    >>> model_columns_reason("m", "r", [("a", "int")], [("a", "bigint")], "ignore")
    "r; the model's columns change (retyped a: int -> bigint)"
    """
    if not before or not columns_differ(before, after):
        return reason
    if on_schema_change == "fail":
        raise ModelColumnsChanged(model, before, after)
    return f"{reason}; the model's columns change ({describe_column_diff(before, after)})"


class SourceSchemaChanged(InvalidSource):
    """A column the model reads was renamed or dropped: its SQL no longer compiles."""

    def __init__(
        self, model: str, changes: Sequence[ColumnChange], recorded: Mapping[str, int], cause: str
    ) -> None:
        sources = sorted({c.source for c in changes})
        shown = ", ".join(f"{s} at version {recorded[s]}" for s in sources if s in recorded)
        super().__init__(
            model,
            ", ".join(sources),
            "changed a column the model reads since its last refresh: "
            + "; ".join(c.describe() for c in changes)
            + f". The model's SQL no longer compiles ({cause}), so nothing was written: "
            + f"the model still shows {shown}",
            "change the model's SQL to the source's new columns (or undo the source "
            "change), then build; the model is rebuilt at the new version",
        )


class ModelColumnsChanged(IvmError):
    """The model's own columns changed and its on_schema_change is 'fail'."""

    def __init__(
        self, model: str, before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]
    ):
        self.model = model
        super().__init__(
            f"Model '{model}': its columns changed ({describe_column_diff(before, after)}) "
            "and on_schema_change is 'fail', so nothing was written: the model still shows "
            "its last refresh. Fix: run `dbt build --full-refresh -s <model>`, or set "
            "on_schema_change to 'sync_all_columns' (an ivm model then rebuilds with its "
            "query's new columns)."
        )


def describe_column_diff(
    before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]
) -> str:
    """'added x int; removed y; y2: int -> bigint', comparing names case-insensitively."""
    old = {n.lower(): (n, t) for n, t in before}
    new = {n.lower(): (n, t) for n, t in after}
    parts = []
    added = [f"{new[k][0]} {new[k][1]}" for k in new if k not in old]
    removed = [old[k][0] for k in old if k not in new]
    retyped = [
        f"{new[k][0]}: {old[k][1]} -> {new[k][1]}"
        for k in new
        if k in old and normal_type(old[k][1]) != normal_type(new[k][1])
    ]
    if added:
        parts.append("added " + ", ".join(added))
    if removed:
        parts.append("removed " + ", ".join(removed))
    if retyped:
        parts.append("retyped " + ", ".join(retyped))
    if not parts and [k for k in old] != [k for k in new]:
        parts.append("reordered")
    return "; ".join(parts) or "no difference"


def columns_differ(before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]) -> bool:
    return [(n.lower(), normal_type(t)) for n, t in before] != [
        (n.lower(), normal_type(t)) for n, t in after
    ]


def normal_type(data_type: str) -> str:
    # dbt's column listing and DESCRIBE QUERY spell some types differently
    # (`integer`/`int`, `long`/`bigint`, spacing inside decimal(p, s)).
    text = data_type.lower().replace(" ", "")
    return {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}.get(
        text, text
    )
