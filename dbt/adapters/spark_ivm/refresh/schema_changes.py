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

Delta's history names the change (RENAME COLUMN old -> new, DROP COLUMNS);
the recorded types catch what the history does not say (an overwrite with a
new schema).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ivm_compiler import InvalidSource, IvmError, TableName, ViewPlan

if TYPE_CHECKING:  # delta/tables.py reads SchemaCommit from here
    from dbt.adapters.spark_ivm.delta.records import RecordedState
    from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot

# Delta operations that change a table's columns without replacing the table
# (CREATE OR REPLACE gives it a new id, which recipe.py treats as recreated).
SCHEMA_OPERATIONS = frozenset(
    {"ADD COLUMNS", "RENAME COLUMN", "DROP COLUMNS", "CHANGE COLUMN", "REPLACE COLUMNS"}
)

# dbt's on_schema_change values (for the model's own columns).
ON_SCHEMA_CHANGE_VALUES = ("ignore", "fail", "append_new_columns", "sync_all_columns")


@dataclass(frozen=True)
class SchemaCommit:
    """A commit of a source that changed its columns (from DESCRIBE HISTORY)."""

    version: int
    operation: str
    parameters: Mapping[str, Any]

    @property
    def blocks_change_feed(self) -> bool:
        """Whether Delta refuses to read a change feed across this commit.

        A rename or drop (column mapping) makes the older data files'
        schema incompatible with the newer one, and a batch change-feed read
        spanning it fails (DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA,
        measured on Delta 4.0.1; a type change fails the same way, but a
        CHANGE COLUMN may also just set a comment, so that one is left to
        the read's error).
        """
        return self.operation in ("RENAME COLUMN", "DROP COLUMNS")

    def describe(self) -> str:
        renamed = self.renamed()
        if renamed is not None:
            what = f"{renamed[0]} to {renamed[1]}"
        elif self.operation == "DROP COLUMNS":
            what = ", ".join(sorted(self.dropped()))
        elif self.operation == "ADD COLUMNS":
            what = ", ".join(sorted(self.added()))
        else:
            what = ""
        return f"{self.operation} {what}".strip() + f" at version {self.version}"

    def renamed(self) -> tuple[str, str] | None:
        """(old, new) top-level column names of a RENAME COLUMN."""
        if self.operation != "RENAME COLUMN":
            return None
        old = str(self.parameters.get("oldColumnPath") or "")
        new = str(self.parameters.get("newColumnPath") or "")
        return (_top(old), _top(new)) if old and new else None

    def dropped(self) -> set[str]:
        if self.operation != "DROP COLUMNS":
            return set()
        return {_top(str(c)).lower() for c in _json_list(self.parameters.get("columns"))}

    def added(self) -> set[str]:
        if self.operation != "ADD COLUMNS":
            return set()
        found = set()
        for entry in _json_list(self.parameters.get("columns")):
            column = entry.get("column", {}) if isinstance(entry, dict) else {}
            if column.get("name"):
                found.add(str(column["name"]).lower())
        return found


def schema_commits(columns: list[str], rows: Sequence[Sequence[Any]]) -> tuple[SchemaCommit, ...]:
    """The column-changing commits among DESCRIBE HISTORY rows, oldest first."""
    version_at = columns.index("version")
    operation_at = columns.index("operation")
    parameters_at = columns.index("operationParameters")
    found = []
    for row in rows:
        operation = str(row[operation_at])
        if operation not in SCHEMA_OPERATIONS:
            continue
        parameters = row[parameters_at] or {}
        if isinstance(parameters, str):
            parameters = parse_map_text(parameters)
        found.append(SchemaCommit(int(row[version_at]), operation, dict(parameters)))
    return tuple(sorted(found, key=lambda c: c.version))


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
        elif _normal_type(now[key]) != _normal_type(old_type):
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
        if k in old and _normal_type(old[k][1]) != _normal_type(new[k][1])
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
    return [(n.lower(), _normal_type(t)) for n, t in before] != [
        (n.lower(), _normal_type(t)) for n, t in after
    ]


def _normal_type(data_type: str) -> str:
    # dbt's column listing and DESCRIBE QUERY spell some types differently
    # (`integer`/`int`, `long`/`bigint`, spacing inside decimal(p, s)).
    text = data_type.lower().replace(" ", "")
    return {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}.get(
        text, text
    )


def parse_map_text(text: str) -> dict[str, str]:
    r"""A map<string, string> received as text: JSON (the session method), or Hive's rendering.

    Spark's Thrift server renders a map as `{"key":"value",...}` with each
    string quoted but not escaped, so a value that is JSON text of its own
    (ADD COLUMNS' `columns`) breaks JSON parsing. Such values are read by
    their brackets instead.

    >>> parse_map_text('{"columns":"[{"column":{"name":"u"}}]","x":"a,b"}')
    {'columns': '[{"column":{"name":"u"}}]', 'x': 'a,b'}
    >>> parse_map_text('{"columns": "[\\"v\\"]"}')
    {'columns': '["v"]'}
    """
    try:
        parsed = json.loads(text)
    except ValueError:
        return _hive_map(text)
    return {str(k): v for k, v in parsed.items()} if isinstance(parsed, dict) else {}


def _hive_map(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    at = 1 if text.startswith("{") else 0
    while at < len(text) and text[at] == '"':
        key_end = text.index('":"', at + 1)
        key, start = text[at + 1 : key_end], key_end + 3
        if start < len(text) and text[start] in "[{":
            end = _json_end(text, start)
        else:  # a plain value: up to the next entry or the end of the map
            ends = [i for i in (text.find('","', start), len(text) - 2) if i >= start]
            end = min(ends)
        found[key] = text[start:end]
        at = end + 2  # past the closing quote and the comma (or brace)
    return found


def _json_end(text: str, start: int) -> int:
    """The index just past the JSON array or object that starts at `start`."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            escaped = char == "\\" and not escaped
            if char == '"' and not escaped:
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return index + 1
    return len(text)


def _top(path: str) -> str:
    """The top-level column of a nested column path (`a.b` -> `a`)."""
    return path.split(".")[0].strip("`")


def _json_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return list(value) if isinstance(value, (list, tuple)) else []
