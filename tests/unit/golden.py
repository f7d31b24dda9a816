"""Golden SQL fixtures for the compiler, in the style of sqlglot's tests/fixtures.

A fixture file holds the sources every case may read, then one case per title::

    # source shop.orders: id int, customer string, amount decimal(10,2)

    # title: projection keeping the key
    # class: projection
    # describe: id int, customer string
    SELECT id, customer FROM shop.orders;
    -- create_state
    CREATE OR REPLACE TABLE ...;
    -- merge_changes
    MERGE INTO ...;
    -- create_view
    CREATE OR REPLACE VIEW ...;
    -- model_query
    SELECT ...;

Header lines of a case:
- ``# class:`` the ViewClass the compiler must choose;
- ``# describe:`` what Spark's DESCRIBE QUERY answers for the model's SQL;
- ``# describe probe:`` what it answers for the compiler's type probe, asked
  once for an aggregate model that has group keys, sums, averages, or MIN/MAX/
  COUNT(DISTINCT) arguments: ``key_<key index> <type>`` for each group key, then
  ``sum_<argument index> <type>`` for each summed argument, then
  ``avg_<argument index> <type>`` for each averaged one, then
  ``value_<argument index> <type>`` (MIN of the argument) for each argument of
  MIN, MAX or COUNT(DISTINCT), in the order the probe asks them; the answers are
  what Spark 4.0.1 reports for the probe's DESCRIBE QUERY, not guesses;
- ``# xfail:`` the model is compiled wrongly today; the sections then hold the
  statements it should compile to (written by hand), and the case is an
  xfail(strict=True) so fixing the bug makes the suite ask for the marker's removal.

Expected statements are stored pretty-printed; a case passes only if the emitted
statement, character for character, equals the expected one re-rendered on one
line by sqlglot (and the pretty forms match, which gives readable diffs).

UPDATE_GOLDEN=1 rewrites the expected sections of every case that is not xfail
from what the compiler emits now. Read the diff before committing it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp

from ivm_compiler import TableName, ViewPlan
from ivm_compiler.emit import Guard
from ivm_compiler.reads import VersionRange as Window
from ivm_compiler.sql import DIALECT

STATEMENTS = ("create_state", "merge_changes", "create_view", "model_query")
# A WINDOW model applies a change with a probe for the touched partitions and a
# MERGE recomputing them (fixtures/windows.sql, test_windows_golden.py).
WINDOW_STATEMENTS = (
    "create_state",
    "probe_partitions",
    "merge_partitions",
    "create_view",
    "model_query",
)

# The names and versions every golden case is emitted with: every source table
# is built at BUILD_VERSION and refreshed with its changes FIRST_CHANGE..LAST_CHANGE.
MODEL = "my_model"
STATE = TableName(db="analytics", name="my_model__ivm_state")
TARGET = TableName(db="analytics", name="my_model")
BUILD_VERSION = 7
# The state version create_view publishes (the view reads the state VERSION AS OF it).
PUBLISHED_STATE_VERSION = 3
FIRST_CHANGE, LAST_CHANGE = 8, 10
# The refresh ids a MERGE's guard check expects and leaves (emit.Guard), and a build's.
GUARD = Guard(read="r-read", write="r-this")


def versions(plan: ViewPlan) -> dict[TableName, int]:
    """The pinned version of every source table for create_state and model_query."""
    return {table: BUILD_VERSION for table in plan.tables}


def windows(plan: ViewPlan) -> dict[TableName, Window]:
    """Every source table's change window for merge_changes: FIRST_CHANGE..LAST_CHANGE."""
    return {table: Window(recorded=FIRST_CHANGE - 1, pinned=LAST_CHANGE) for table in plan.tables}


_SOURCE = re.compile(r"^# source (?P<table>\S+):\s*(?P<columns>.*)$")
_HEADER = re.compile(r"^# (?P<key>[a-z][a-z ]*):\s*(?P<value>.*)$")
_SECTION = re.compile(r"^-- (?P<name>[a-z_]+)\s*$")


def split_columns(text: str) -> list[tuple[str, str]]:
    """`a int, b decimal(10,2), c map<string,int>` -> [(name, type), ...].

    >>> split_columns("a int, b decimal(10,2), c struct<x:int,y:string>")
    [('a', 'int'), ('b', 'decimal(10,2)'), ('c', 'struct<x:int,y:string>')]
    """
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "(<":
            depth += 1
        elif char in ")>":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    columns = []
    for part in parts:
        name, _, data_type = part.strip().partition(" ")
        columns.append((name.strip("`"), data_type.strip()))
    return columns


@dataclass
class Case:
    title: str
    headers: dict[str, str]
    sql: str
    expected: dict[str, str]
    # Where the case's expected sections start and end in the file's lines.
    body_start: int = 0
    body_end: int = 0
    header_lines: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "_", self.title.lower()).strip("_")

    @property
    def xfail(self) -> str | None:
        return self.headers.get("xfail")


@dataclass
class FixtureFile:
    path: Path
    sources: dict[str, list[tuple[str, str]]]
    cases: list[Case]
    lines: list[str]


def load(path: Path, statements: tuple[str, ...] = STATEMENTS) -> FixtureFile:
    lines = path.read_text().splitlines()
    sources: dict[str, list[tuple[str, str]]] = {}
    cases: list[Case] = []
    blocks: list[tuple[int, int]] = []
    start = None
    for number, line in enumerate(lines):
        if line.startswith("# title:"):
            if start is not None:
                blocks.append((start, number))
            start = number
        elif start is None:
            match = _SOURCE.match(line)
            if match:
                sources[match["table"]] = split_columns(match["columns"])
    if start is not None:
        blocks.append((start, len(lines)))
    for begin, end in blocks:
        cases.append(_parse_case(lines, begin, end, statements))
    titles = [case.id for case in cases]
    duplicates = {t for t in titles if titles.count(t) > 1}
    assert not duplicates, f"{path}: duplicate titles {duplicates}"
    return FixtureFile(path=path, sources=sources, cases=cases, lines=lines)


def _parse_case(lines: list[str], begin: int, end: int, statements: tuple[str, ...]) -> Case:
    headers: dict[str, str] = {}
    number = begin
    while number < end and lines[number].startswith("#"):
        match = _HEADER.match(lines[number])
        assert match, f"line {number + 1}: not a header: {lines[number]!r}"
        headers[match["key"]] = match["value"].strip()
        number += 1
    header_lines = lines[begin:number]
    sections: dict[str, list[str]] = {"sql": []}
    current = "sql"
    body_start = None
    for index in range(number, end):
        match = _SECTION.match(lines[index])
        if match:
            current = match["name"]
            assert current in statements, f"line {index + 1}: unknown section {current!r}"
            assert current not in sections, f"line {index + 1}: section {current!r} repeated"
            sections[current] = []
            if body_start is None:
                body_start = index
        else:
            sections[current].append(lines[index])
    text = {name: "\n".join(body).strip() for name, body in sections.items()}
    sql = text.pop("sql")
    assert sql.endswith(";"), f"case {headers.get('title')!r}: end the model SQL with ';'"
    expected = {name: body.removesuffix(";").rstrip() for name, body in text.items()}
    return Case(
        title=headers["title"],
        headers=headers,
        sql=sql.removesuffix(";").strip(),
        expected=expected,
        body_start=body_start if body_start is not None else end,
        body_end=end,
        header_lines=header_lines,
    )


def assert_emitted(case: Case, emitted: dict[str, str], statements: tuple[str, ...]) -> None:
    """Every statement of the case as its fixture has it: pretty forms first, for a
    readable diff, then the exact text."""
    assert set(case.expected) == set(statements), "every case lists all statements"
    for name in statements:
        assert pretty(emitted[name]) == case.expected[name], name
        assert emitted[name] == one_line(case.expected[name]), name


def pretty(statement: str) -> str:
    return sqlglot.transpile(statement, read=DIALECT, write=DIALECT, pretty=True)[0]


def one_line(statement: str) -> str:
    return sqlglot.transpile(statement, read=DIALECT, write=DIALECT)[0]


def render(statement: str) -> str:
    """How an emitted statement is stored: pretty, unless sqlglot cannot read it back exactly."""
    formatted = pretty(statement)
    return formatted if one_line(formatted) == statement else statement


def rewrite(
    fixture: FixtureFile,
    emitted: dict[str, dict[str, str]],
    statements: tuple[str, ...] = STATEMENTS,
) -> None:
    """Replace the expected sections of the cases in `emitted` (by case id), keep the rest."""
    out: list[str] = []
    position = 0
    for case in fixture.cases:
        if case.id not in emitted:
            continue
        out.extend(fixture.lines[position : case.body_start])
        while out and not out[-1].strip():
            out.pop()
        for name in statements:
            out.append(f"-- {name}")
            out.append(render(emitted[case.id][name]) + ";")
        out.append("")
        position = case.body_end
    out.extend(fixture.lines[position:])
    while out and not out[-1].strip():
        out.pop()
    fixture.path.write_text("\n".join(out) + "\n")


UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def load_fixture(
    path: Path,
    statements: tuple[str, ...],
    emitted: Callable[[FixtureFile, Case], dict[str, str]],
) -> FixtureFile:
    """The fixture file; with UPDATE_GOLDEN=1, first rewritten from `emitted` (xfail cases kept)."""
    fixture = load(path, statements)
    if UPDATE:
        rewrite(
            fixture,
            {case.id: emitted(fixture, case) for case in fixture.cases if not case.xfail},
            statements,
        )
        fixture = load(path, statements)
    return fixture


def catalog(fixture: FixtureFile, case: Case) -> FakeCatalog:
    """The catalog a case's headers describe (`# describe:` and `# describe probe:`)."""
    probe = case.headers.get("describe probe")
    return FakeCatalog(
        fixture.sources,
        case.sql,
        split_columns(case.headers["describe"]),
        split_columns(probe) if probe else None,
    )


# The compiler's type probe names its columns key_<i>, sum_<i>, avg_<i> and value_<i>.
_PROBE_COLUMN = re.compile(r"^(?P<kind>key|sum|avg|value)_\d+$")


def probe_columns(sql: str) -> list[str] | None:
    """The columns a type probe asks for, or None if `sql` is not a probe.

    >>> probe_columns("SELECT a AS key_0, SUM(b) AS sum_1, AVG(b) AS avg_1 FROM t GROUP BY a")
    ['key_0', 'sum_1', 'avg_1']
    >>> probe_columns("SELECT FIRST(b) AS value_0 FROM t JOIN u ON t.a = u.a")
    ['value_0']
    >>> probe_columns("SELECT MAX(b) AS value_0 FROM t") is None
    True
    >>> probe_columns("SELECT a AS key_0, SUM(b) AS avg_1 FROM t GROUP BY a") is None
    True
    """
    probe = sqlglot.parse_one(sql, read=DIALECT)
    if not isinstance(probe, exp.Select) or probe.args.get("where") or probe.args.get("having"):
        return None
    names = []
    for projection in probe.expressions:
        match = _PROBE_COLUMN.match(projection.alias) if isinstance(projection, exp.Alias) else None
        if match is None:
            return None
        wanted = {"key": None, "sum": exp.Sum, "avg": exp.Avg, "value": exp.First}[match["kind"]]
        if wanted is None and projection.this.find(exp.AggFunc):
            return None
        if wanted is not None and type(projection.this) is not wanted:
            return None
        names.append(projection.alias)
    # Each key is asked for the groups it makes: the probe groups by exactly its keys.
    keys = [p.this for p in probe.expressions if p.alias.startswith("key_")]
    group = probe.args.get("group")
    if (group.expressions if group else []) != keys:
        return None
    return names


class FakeCatalog:
    """The compiler's Catalog, answered from the fixture; records every question asked."""

    def __init__(
        self,
        sources: dict[str, list[tuple[str, str]]],
        model_sql: str,
        describe: list[tuple[str, str]],
        describe_probe: list[tuple[str, str]] | None = None,
    ) -> None:
        self.sources = sources
        self.model_sql = model_sql
        self.describe = describe
        self.describe_probe = describe_probe
        self.asked: list[str] = []
        self.probes: list[str] = []

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        self.asked.append(f"columns {table}")
        if str(table) not in self.sources:
            raise AssertionError(f"the fixture declares no source {table}")
        return list(self.sources[str(table)])

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        if sql == self.model_sql:
            self.asked.append("describe model")
            return list(self.describe)
        asked = probe_columns(sql)
        if asked is None:
            raise AssertionError(f"unexpected DESCRIBE QUERY {sql}")
        self.asked.append("describe probe")
        self.probes.append(sql)
        if self.describe_probe is None:
            raise AssertionError(f"the case needs a '# describe probe:' header for {sql}")
        declared = [name for name, _ in self.describe_probe]
        if asked != declared:
            raise AssertionError(
                f"'# describe probe:' answers {declared}, the probe asks for {asked}: {sql}"
            )
        return list(self.describe_probe)
