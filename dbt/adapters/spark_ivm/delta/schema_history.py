"""The column-changing commits in a table's history: which column each renamed, dropped or added.

A refresh records, beside each source's version, the columns the model reads
(refresh/schema_changes.py compares them); Delta's history names what
changed them since (RENAME COLUMN old -> new, DROP COLUMNS, ADD COLUMNS). Over
Thrift the commit's parameters come as Hive-rendered map text, which
parse_map_text reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Delta operations that change a table's columns without replacing the table
# (CREATE OR REPLACE gives it a new id, which refresh/recipe.py treats as recreated).
SCHEMA_OPERATIONS = frozenset(
    {"ADD COLUMNS", "RENAME COLUMN", "DROP COLUMNS", "CHANGE COLUMN", "REPLACE COLUMNS"}
)


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
