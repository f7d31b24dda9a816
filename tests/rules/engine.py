"""An embedded stand-in for Spark and Delta Lake: DuckDB, a Delta simulator, and the rewrites between.

The compiler emits Spark SQL for Delta tables. This module runs that SQL in
DuckDB (from PyPI, in-process, no JVM) so the delta rules can be checked in
milliseconds instead of a Spark and dbt run:

- DeltaTable keeps a table's versions as lists of rows and, per commit, the
  change-data-feed rows Delta would write for it (an UPDATE writes an
  `update_preimage` and an `update_postimage` row per updated row);
- Engine turns a Spark statement into DuckDB SQL by rewriting the sqlglot tree
  (never the text): `src VERSION AS OF n` reads a DuckDB table holding src at
  version n, `table_changes('src', a, b)` one holding the change rows of
  versions a..b, and the places where Spark and DuckDB compute different
  answers are rewritten to Spark's (see SPARK_SEMANTICS);
- Catalog answers the compiler's two questions from the sources' schemas and
  DuckDB's types for a query (planned, not run), in Spark's type names.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import sqlglot
from sqlglot import exp

from ivm_compiler import TableName
from ivm_compiler.rules import booleans

SPARK = "spark"
DUCKDB = "duckdb"

SPARK_SEMANTICS = """
Where DuckDB's answer differs from Spark's, and what this module does about it:

- SUM(integral) is BIGINT in Spark and HUGEINT in DuckDB; SUM(DECIMAL(p, s)) is
  DECIMAL(min(38, p + 10), s) in Spark and DECIMAL(38, s) in DuckDB. Every
  SUM, in the model's query and in the compiler's statements, is cast to
  Spark's type (the argument's type found by a DESCRIBE of it over its FROM,
  Engine.argument_type), so states have Spark's column types and DESCRIBE
  answers Spark's.
- AVG(DECIMAL(p, s)) is DECIMAL(p + 4, s + 4) in Spark, computed as
  CAST(SUM(x) / CAST(COUNT(x) AS DECIMAL(20, 0)) AS DECIMAL(p + 4, s + 4)),
  and DOUBLE in DuckDB: the oracle's AVG is rewritten to Spark's expression.
  AVG of an integral argument is DOUBLE in both (a sum of small integers is
  exact in a double either way) and is left alone.
- Decimal division: Spark divides decimals exactly and rounds half up; DuckDB
  converts them to DOUBLE. Every `CAST(a / b AS DECIMAL(p, s))` whose divisor
  or dividend is a CAST to DECIMAL (the shape of Spark's AVG and of the
  compiler's finalize_avg) becomes spark_divide(a, b, s), a Python function
  dividing exactly and rounding half up to s places. Spark rounds twice (to
  the division's own scale, at least 6 and here 20, then to s); the two differ
  only for a quotient within 10^-20 of a rounding midpoint, which a sum of a
  few two-place decimals divided by a count below 10^12 cannot be. Any other
  decimal division is refused (NotImplementedError) rather than evaluated in
  DuckDB's double.
- CORR is NULL in Spark over fewer than two pairs and when either argument
  takes one value only (a division by a zero variance); DuckDB answers NaN.
  The oracle's CORR is rewritten to answer NULL there, the test of a zero
  variance being DuckDB's own VAR_POP (exactly 0 for equal values). (DuckDB
  also refuses a NaN or an infinity in CORR; the models here have none.)
- NULL ordering: Spark sorts NULLs first ascending and last descending;
  sqlglot writes each ORDER BY against DuckDB's default (last, either way),
  so the session keeps that default.
- `<=>` becomes IS NOT DISTINCT FROM, LEFT SEMI/ANTI JOIN become SEMI/ANTI
  JOIN, LATERAL VIEW explode(sequence(1, n)) becomes CROSS JOIN
  UNNEST(generate_series(1, n)) (both inclusive; the view only repeats rows
  with n >= 1), IF becomes CASE: sqlglot's transpiler does these.
- `/` of integers is a double division in both, `%` keeps the dividend's sign
  in both, EXCEPT ALL and INTERSECT ALL are bag operations in both, and
  strings compare by bytes in both (the tests' strings are ASCII).
- MERGE: DuckDB (1.4 and later) runs Spark's MERGE, WHEN NOT MATCHED BY SOURCE
  included, but refuses a qualified column on the left of UPDATE SET (the
  target alias is dropped there) and spells Spark's RAISE_ERROR as error().
  Delta fails a MERGE whose source has two rows for one target row; DuckDB
  is not relied on for that: the harness checks the source's keys itself
  (oracle.py), on the source rows computed once into a table the MERGE
  then reads (Engine.merge).
- CREATE TABLE ... USING DELTA TBLPROPERTIES (...): the properties are
  dropped; they change no row.
- XXHASH64 (a projection log's view splits its rows by a hash of their key,
  log_state.view_rows) is not a DuckDB function: it becomes DuckDB's hash().
  Only which rows share a hash matters to the view's rows, and both hash a
  key's rows alike.
- EVERY, SOME and ANY (Spark's names of BOOL_AND and BOOL_OR) are not DuckDB
  functions: they become BOOL_AND/BOOL_OR (the compiler's own
  rules.booleans.as_named).
"""

# Spark's names of the DuckDB types these tests' queries produce.
_SPARK_TYPES = {
    "TINYINT": "tinyint",
    "SMALLINT": "smallint",
    "INTEGER": "int",
    "BIGINT": "bigint",
    "VARCHAR": "string",
    "BOOLEAN": "boolean",
    "DOUBLE": "double",
    "FLOAT": "float",
    "DATE": "date",
}
_INTEGRAL = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
# Spark's Average divides a decimal sum by the count cast to this (DecimalType.LongDecimal).
_LONG_DECIMAL = exp.DataType.build("DECIMAL(20, 0)")
MAX_PRECISION = 38

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_COLUMNS = (
    (CHANGE_TYPE, "string"),
    (COMMIT_VERSION, "bigint"),
    (COMMIT_TIMESTAMP, "timestamp"),
)
# The table a MERGE's source rows are written to before it runs (Engine.merge).
MERGE_SOURCE = "__merge_source"
# Where an INSERT OVERWRITE's rows are kept while its table is emptied.
OVERWRITE_ROWS = "__overwrite_rows"

Row = tuple[object, ...]


def spark_type(duckdb_type: str) -> str:
    """A DuckDB type as Spark names it.

    >>> spark_type("DECIMAL(20,2)"), spark_type("VARCHAR"), spark_type("INTEGER")
    ('decimal(20,2)', 'string', 'int')
    """
    text = duckdb_type.upper()
    if text.startswith("DECIMAL"):
        return text.lower().replace(" ", "")
    if text.endswith("[]"):
        # A bounded MIN/MAX's kept values: an array of (value, count) structs.
        return f"array<{spark_type(duckdb_type[:-2])}>"
    if text.startswith("STRUCT(") and text.endswith(")"):
        fields = _top_level_split(duckdb_type[len("STRUCT(") : -1])
        named = (f.strip().split(" ", 1) for f in fields)
        return "struct<" + ",".join(f"{n.strip(chr(34))}:{spark_type(t)}" for n, t in named) + ">"
    if text not in _SPARK_TYPES:
        # HUGEINT included: Spark has no such type, so it means a SUM this
        # module forgot to cast to Spark's BIGINT.
        raise NotImplementedError(f"no Spark type for DuckDB's {duckdb_type}")
    return _SPARK_TYPES[text]


def _top_level_split(text: str) -> list[str]:
    """`text` split at its commas outside parentheses.

    >>> _top_level_split("v DECIMAL(10,2), n BIGINT")
    ['v DECIMAL(10,2)', ' n BIGINT']
    """
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def duckdb_type(spark_type_name: str) -> str:
    """A Spark column type as DuckDB spells it.

    >>> duckdb_type("string"), duckdb_type("decimal(10,2)"), duckdb_type("int")
    ('TEXT', 'DECIMAL(10, 2)', 'INT')
    """
    return exp.DataType.build(spark_type_name, dialect=SPARK).sql(dialect=DUCKDB)


def _decimal_of(type_text: str) -> tuple[int, int] | None:
    data_type = exp.DataType.build(type_text, dialect=DUCKDB)
    if data_type.this != exp.DataType.Type.DECIMAL:
        return None
    precision, scale = (int(e.this.name) for e in data_type.expressions)
    return precision, scale


# -- the Delta table simulator ----------------------------------------------------


@dataclass(frozen=True)
class Insert:
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Update:
    """UPDATE t SET set_column = value WHERE where_column <=> where_value."""

    where_column: str
    where_value: object
    set_column: str
    value: object


@dataclass(frozen=True)
class Delete:
    """DELETE FROM t WHERE where_column <=> where_value."""

    where_column: str
    where_value: object


@dataclass(frozen=True)
class Supersede:
    """UPDATE as `update` says, then INSERT `rows`, in one commit.

    What an SCD2 dimension's MERGE does when a row's attributes change: it
    closes the current row (sets its valid_to) and opens its successor in the
    same Delta version, so no version shows the key without a current row.
    """

    update: Update
    rows: tuple[Row, ...]


Change = Insert | Update | Delete | Supersede


@dataclass(frozen=True)
class ChangeRow:
    row: Row
    change_type: str
    version: int


# Every commit's timestamp: a fixed start plus a second per version, as the
# compiler never reads it (it only has to exist and have Delta's type).
_EPOCH = datetime.datetime(2024, 1, 1)


@dataclass
class DeltaTable:
    """A Delta table with its change data feed on: every version's rows and every commit's changes.

    Version 0 is the empty table CREATE TABLE leaves; each statement commits
    one version. Like Delta, an UPDATE writes a pre- and a postimage for
    every row it matches, even one whose values stay the same. A statement
    that matches no row commits a version without change rows here (Delta
    may skip such a commit; a window without change rows must be handled
    either way, as OPTIMIZE leaves one too).
    """

    name: TableName
    columns: tuple[tuple[str, str], ...]
    versions: list[list[Row]] = field(default_factory=lambda: [[]])
    changes: list[list[ChangeRow]] = field(default_factory=lambda: [[]])

    @property
    def version(self) -> int:
        return len(self.versions) - 1

    def rows_at(self, version: int) -> list[Row]:
        return list(self.versions[version])

    def column_index(self, name: str) -> int:
        return [c for c, _ in self.columns].index(name)

    def commit(self, change: Change) -> int:
        """Apply one statement as one commit; returns the new version."""
        if isinstance(change, Supersede):
            self.commit(change.update)
            self.commit(Insert(change.rows))
            # The two commits as one: the update's rows and change rows, then the insert's.
            after, inserted = self.versions.pop(), self.changes.pop()
            self.versions[-1] = after
            version = len(self.versions) - 1
            self.changes[-1] += [ChangeRow(c.row, c.change_type, version) for c in inserted]
            return version
        rows = self.versions[-1]
        version = len(self.versions)
        if isinstance(change, Insert):
            for row in change.rows:
                if len(row) != len(self.columns):
                    raise ValueError(
                        f"{row} does not have the {len(self.columns)} columns of {self.name}"
                    )
            after = rows + list(change.rows)
            feed = [ChangeRow(row, "insert", version) for row in change.rows]
        else:
            where = self.column_index(change.where_column)
            hit = [
                row[where] == change.where_value
                if change.where_value is not None
                else row[where] is None
                for row in rows
            ]
            if isinstance(change, Delete):
                after = [row for row, matched in zip(rows, hit) if not matched]
                feed = [
                    ChangeRow(row, "delete", version) for row, matched in zip(rows, hit) if matched
                ]
            else:
                target = self.column_index(change.set_column)
                after, feed = [], []
                for row, matched in zip(rows, hit):
                    if not matched:
                        after.append(row)
                        continue
                    updated = row[:target] + (change.value,) + row[target + 1 :]
                    after.append(updated)
                    feed.append(ChangeRow(row, "update_preimage", version))
                    feed.append(ChangeRow(updated, "update_postimage", version))
        self.versions.append(after)
        self.changes.append(feed)
        return version

    def commit_rows(self, rows: Sequence[Row]) -> int:
        """Commit a table's whole new content (a MERGE's result); returns the new version.

        The change rows are the difference of the two bags: a row gone is
        deleted, a row new inserted. Delta writes an updated row as a pre-
        and a postimage instead, and an unchanged matched row as both; every
        reader sums the signs, to which those are the same.
        """
        before, after = collections.Counter(self.versions[-1]), collections.Counter(rows)
        version = len(self.versions)
        feed = [ChangeRow(row, "delete", version) for row in (before - after).elements()]
        feed += [ChangeRow(row, "insert", version) for row in (after - before).elements()]
        self.versions.append(list(rows))
        self.changes.append(feed)
        return version

    def changes_between(self, first: int, last: int) -> list[ChangeRow]:
        """The change-feed rows of versions first..last, both inclusive (table_changes)."""
        if not 0 <= first <= last <= self.version:
            raise ValueError(f"table_changes of {self.name} for versions {first}..{last}")
        return [row for version in range(first, last + 1) for row in self.changes[version]]


# -- the engine ---------------------------------------------------------------------


_CATALOGS = itertools.count()


@functools.lru_cache(maxsize=1)
def _database() -> duckdb.DuckDBPyConnection:
    """The process's DuckDB instance, with spark_divide, for every engine.

    DuckDB keeps its own NULL order (last, either way): sqlglot writes Spark's
    order against it, NULLS FIRST where Spark's ascending default differs and
    nothing where they agree, so an explicit ascending NULLS LAST (a top-k
    state's edge, rules/top_k_buffer.py) comes out as a plain ASC.
    """
    database = duckdb.connect(":memory:")
    database.create_function(
        "spark_divide",
        spark_divide,
        [duckdb.sqltype("VARCHAR"), duckdb.sqltype("VARCHAR"), duckdb.sqltype("INTEGER")],
        duckdb.sqltype("VARCHAR"),
        null_handling="special",
    )
    return database


def spark_divide(dividend: str | None, divisor: str | None, scale: int) -> str | None:
    """dividend / divisor, exact, rounded half up (away from zero) to `scale` places.

    Spark's decimal division (its Divide with DECIMAL operands, java's
    RoundingMode.HALF_UP); NULL for a NULL operand or a zero divisor, as Spark
    answers with ANSI mode off.

    >>> spark_divide("1.50", "4", 6), spark_divide("-0.01", "8", 2), spark_divide("1", "0", 2)
    ('0.375000', '-0.00', None)
    >>> spark_divide("0.05", "2", 2), spark_divide("-0.05", "2", 2)
    ('0.03', '-0.03')
    """
    if dividend is None or divisor is None:
        return None
    context = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP)
    denominator = decimal.Decimal(divisor)
    if denominator == 0:
        return None
    quotient = context.divide(decimal.Decimal(dividend), denominator)
    return str(quotient.quantize(decimal.Decimal(1).scaleb(-scale), context=context))


ChangeFeedHook = Callable[[TableName, list[ChangeRow]], list[ChangeRow]]

# A source read a translated statement makes: ("version", table, n) or ("changes", table, a, b).
Read = tuple[object, ...]


@dataclass(frozen=True)
class Translation:
    """A Spark statement in DuckDB SQL, and the source reads it needs materialized.

    For a MERGE, `using` writes its source rows to the table MERGE_SOURCE,
    and `sql` reads them from there (Engine.merge).
    """

    sql: str
    reads: tuple[Read, ...]
    using: str | None = None


@dataclass
class Memo:
    """What engines over the same sources (and state) can share: it depends on no row.

    `types`: aggregate arguments' DuckDB types (Engine.argument_type);
    `translations`: statements already translated, by their text, the
    versions that plain source names read, and whether a change feed hook
    is on (its tables have other names).
    """

    types: dict[str, str] = field(default_factory=dict)
    translations: dict[tuple[str, tuple[tuple[TableName, int], ...], bool], Translation] = field(
        default_factory=dict
    )


class Engine:
    """One DuckDB database holding the sources' versions and change feeds on demand, and states.

    `change_feed_hook` may rewrite the change rows a table_changes reads (the
    tests that prove the layer can fail tamper with them there).
    """

    def __init__(
        self,
        tables: Sequence[DeltaTable],
        change_feed_hook: ChangeFeedHook | None = None,
        memo: Memo | None = None,
    ) -> None:
        self.tables = {table.name: table for table in tables}
        self.memo = Memo() if memo is None else memo
        self.change_feed_hook = change_feed_hook
        # Its own connection and in-memory catalog in the process's one DuckDB
        # (a new database per engine costs five times as much; _database).
        self.catalog = f"engine_{next(_CATALOGS)}"
        self.connection = _database().cursor()
        catalog = exp.to_identifier(self.catalog)
        self._run(exp.Attach(this=exp.alias_(exp.Literal.string(":memory:"), catalog)))
        self._run(exp.Use(this=exp.Table(this=catalog)))
        self._materialized: set[str] = set()
        self._schemas: set[str] = set()

    # -- DuckDB tables for versions and change windows ------------------------------

    def _run(self, statement: exp.Expression) -> None:
        self.connection.execute(statement.sql(dialect=DUCKDB))

    def _create(self, name: str, columns: Sequence[tuple[str, str]], rows: Sequence[Row]) -> str:
        """A DuckDB table of Spark-typed columns holding `rows` (once per name)."""
        if name in self._materialized:
            return name
        table = exp.Table(this=exp.to_identifier(name, quoted=True))
        definitions = [
            exp.ColumnDef(
                this=exp.to_identifier(column, quoted=True),
                kind=exp.DataType.build(data_type, dialect=SPARK),
            )
            for column, data_type in columns
        ]
        self._run(exp.Create(this=exp.Schema(this=table, expressions=definitions), kind="TABLE"))
        if rows:
            # One statement with every row's values as literals (three times
            # faster than parameters, and executemany runs one per row).
            types = [exp.DataType.build(t, dialect=SPARK) for _, t in columns]
            values = exp.values([tuple(map(_literal, row, types)) for row in rows])
            self._run(exp.insert(values, table.copy()))
        self._materialized.add(name)
        return name

    def version_table(self, table: TableName, version: int) -> str:
        """The DuckDB table holding `table VERSION AS OF version`."""
        source = self._source(table)
        if not 0 <= version <= source.version:
            raise ValueError(f"{table} has no version {version} (latest {source.version})")
        return self._create(version_name(table, version), source.columns, source.rows_at(version))

    def changes_table(self, table: TableName, first: int, last: int) -> str:
        """The DuckDB table holding `table_changes(table, first, last)`."""
        source = self._source(table)
        feed = source.changes_between(first, last)
        name = changes_name(table, first, last, self.change_feed_hook is not None)
        if name in self._materialized:
            return name
        if self.change_feed_hook is not None:
            feed = self.change_feed_hook(table, feed)
        rows = [
            (
                *change.row,
                change.change_type,
                change.version,
                _EPOCH + datetime.timedelta(seconds=change.version),
            )
            for change in feed
        ]
        return self._create(name, (*source.columns, *CHANGE_COLUMNS), rows)

    def _source(self, table: TableName) -> DeltaTable:
        if table not in self.tables:
            raise KeyError(
                f"no source {table} (the sources are {', '.join(map(str, self.tables))})"
            )
        return self.tables[table]

    # -- Spark SQL -> DuckDB SQL --------------------------------------------------------

    def translate(
        self, statement: str | exp.Expression, pinned: Mapping[TableName, int] | None = None
    ) -> Translation:
        """A Spark statement as DuckDB SQL that answers as Spark would (SPARK_SEMANTICS).

        A source read without VERSION AS OF reads the version in `pinned` (the
        newest without it): the model's own query is written that way. A
        statement's text is translated once (Memo); a tree (one the compiler
        just built, e.g. state_rows.build_query's) is rewritten in place and
        not remembered. The tables it reads are made here.
        """
        plain = {
            table: (pinned or {}).get(table, source.version)
            for table, source in self.tables.items()
        }
        hooked = self.change_feed_hook is not None
        if isinstance(statement, exp.Expression):
            found = self._translate(statement, plain, hooked)
        else:
            key = (statement, tuple(sorted(plain.items(), key=str)), hooked)
            found = self.memo.translations.get(key) or self._translate(
                sqlglot.parse_one(statement, read=SPARK), plain, hooked
            )
            self.memo.translations[key] = found
        self._materialize(found.reads)
        return found

    def _translate(
        self, tree: exp.Expression, plain: Mapping[TableName, int], hooked: bool
    ) -> Translation:
        # Each rewrite works on the tree in place.
        reads: list[Read] = []
        tree = tree.transform(_duckdb_hash, copy=False)  # first: the type probes plan the joins
        tree = self._spark_aggregates(_spark_correlation(booleans.as_named(tree)))
        tree = _read_versions(tree, set(self.tables), plain, reads, hooked)
        tree = _duckdb_statement(tree.transform(_spark_decimal_division, copy=False))
        using = None
        if isinstance(tree, exp.Merge):
            source = tree.args["using"]
            rows = exp.Select(expressions=[exp.Star()])
            rows.set("from_", exp.From(this=source))
            kept = exp.Create(this=_merge_source(), kind="TABLE", replace=True, expression=rows)
            using = kept.sql(dialect=DUCKDB, copy=False)
            tree.set("using", _merge_source().as_(source.alias, quoted=True))
        if isinstance(tree, exp.Insert) and tree.args.get("overwrite"):
            # DuckDB has no INSERT OVERWRITE, and its rows read the table they
            # replace (log_state.compact): kept aside, then written back, so
            # the table keeps its column types.
            rows = exp.Table(this=exp.to_identifier(OVERWRITE_ROWS, quoted=True))
            written = tree.expression
            if tree.args.get("with_"):
                written.set("with_", tree.args["with_"])  # the INSERT's CTEs, for its rows
            steps = [
                exp.Create(this=rows, kind="TABLE", replace=True, expression=written),
                exp.Delete(this=tree.this),
                exp.Insert(this=tree.this.copy(), expression=exp.select("*").from_(rows.copy())),
            ]
            sql = "; ".join(step.sql(dialect=DUCKDB) for step in steps)
            return Translation(sql, tuple(dict.fromkeys(reads)), using)
        # copy=False: the generator's own copy of a tree this large costs about
        # as much as the rewrites, and the tree is not used again.
        sql = tree.sql(dialect=DUCKDB, copy=False)
        return Translation(sql, tuple(dict.fromkeys(reads)), using)

    def _materialize(self, reads: Sequence[Read]) -> None:
        for read in reads:
            if read[0] == "version":
                self.version_table(*read[1:])  # type: ignore[arg-type]
            else:
                self.changes_table(*read[1:])  # type: ignore[arg-type]

    def _spark_aggregates(self, tree: exp.Expression) -> exp.Expression:
        """SUM cast to Spark's result type, and AVG of decimals as Spark's Average computes it."""

        def replace(node: exp.Expression) -> exp.Expression:
            window = node if isinstance(node, exp.Window) else None
            call = node.this if window is not None else node
            if window is None and isinstance(node.parent, exp.Window):
                return node  # rewritten with its window
            if not isinstance(call, (exp.Sum, exp.Avg)):
                return node
            argument = self.argument_type(call)
            decimal_type = _decimal_of(argument)
            if isinstance(call, exp.Avg):
                if decimal_type is None:
                    return node
                precision, scale = decimal_type
                total = _over(exp.Sum(this=call.this.copy()), window)
                rows = _over(exp.Count(this=call.this.copy()), window)
                result = _decimal(precision + 4, scale + 4)
                return exp.cast(
                    exp.Div(this=total, expression=exp.cast(rows, _LONG_DECIMAL)), result
                )
            if decimal_type is not None:
                precision, scale = decimal_type
                to = _decimal(precision + 10, scale)
            elif argument.upper() in _INTEGRAL:
                to = exp.DataType.build("BIGINT")
            else:
                return node
            return exp.cast(node, to)

        return tree.transform(replace, copy=False)

    def argument_type(self, call: exp.Expression) -> str:
        """DuckDB's type of an aggregate's argument: it alone, planned over its FROM and JOINs.

        Asked once per argument and FROM clause (_argument_key): the compiler
        names an argument's flattened column alike in every statement, and a
        type does not depend on versions. The probe reads every source and
        change feed at version 0, with the CTEs of the enclosing queries.
        """
        select = call.find_ancestor(exp.Select)
        if select is None:
            raise NotImplementedError(f"an aggregate outside a SELECT: {call.sql(SPARK)}")
        key = _argument_key(call.this, select)
        if key in self.memo.types:
            return self.memo.types[key]
        probe = exp.Select(expressions=[exp.alias_(call.this.copy(), "t", quoted=True)])
        for clause in ("from_", "joins", "laterals"):
            value = select.args.get(clause)
            if value:
                probe.set(
                    clause, [v.copy() for v in value] if isinstance(value, list) else value.copy()
                )
        scopes: list[exp.Expression] = []
        node: exp.Expression | None = select
        while node is not None:
            scopes.insert(0, node)  # outermost first: an inner CTE may read an outer one
            node = node.parent
        ctes = _ctes_read(
            probe,
            [
                cte
                for scope in scopes
                # An INSERT's CTEs come before it (log_state.append_changes).
                if isinstance(scope, exp.Query | exp.Insert) and scope.args.get("with_")
                for cte in scope.args["with_"].expressions
            ],
        )
        if ctes:
            probe.set("with_", exp.With(expressions=ctes))
        plain = {table: 0 for table in self.tables}
        reads: list[Read] = []
        hooked = self.change_feed_hook is not None
        probe = _read_versions(
            probe.transform(_at_version_zero, copy=False), set(self.tables), plain, reads, hooked
        )
        self._materialize(list(dict.fromkeys(reads)))
        # Planned, not run. copy=False: the probe is this call's own tree (its
        # parts are copies), so the generator need not copy it again
        # (co_moments_global alone: 31.2 s with that copy, 27.2 s without).
        (found_type,) = self.connection.sql(probe.sql(dialect=DUCKDB, copy=False)).types
        found = str(found_type)
        self.memo.types[key] = found
        return found

    # -- running ----------------------------------------------------------------------

    def close(self) -> None:
        """Drop everything this engine made (its catalog) and its connection."""
        self._run(exp.Use(this=exp.Table(this=exp.to_identifier("memory"))))
        self._run(exp.Detach(this=exp.var(self.catalog)))
        self.connection.close()

    def create_empty(self, table: TableName, columns: Sequence[tuple[str, str]]) -> None:
        """An empty DuckDB table of Spark-typed columns under a relation's own name.

        What a plan node's view is to the compiler's questions about the
        query reading it (Catalog.describe_query plans, and runs nothing).
        """
        self.ensure_schema(table)
        definitions = [
            exp.ColumnDef(
                this=exp.to_identifier(column, quoted=True),
                kind=exp.DataType.build(data_type, dialect=SPARK),
            )
            for column, data_type in columns
        ]
        self._run(
            exp.Create(
                this=exp.Schema(this=table.to_table(), expressions=definitions), kind="TABLE"
            )
        )

    def ensure_schema(self, table: TableName) -> None:
        if table.db and table.db not in self._schemas:
            schema = exp.Table(db=exp.to_identifier(table.db, quoted=True))
            self._run(exp.Create(this=schema, kind="SCHEMA", exists=True))
            self._schemas.add(table.db)

    def execute(self, statement: str) -> None:
        self.connection.execute(self.translate(statement).sql)

    def query(
        self, statement: str | exp.Expression, pinned: Mapping[TableName, int] | None = None
    ) -> tuple[list[str], list[Row]]:
        """(column names, rows) of a Spark query."""
        return self.fetch(self.translate(statement, pinned).sql)

    def merge(self, statement: str) -> tuple[list[str], list[Row]]:
        """Run a MERGE; return its source rows (column names, rows).

        The source is computed once into a table the MERGE then reads, so
        the rows returned are exactly the rows it applied.
        """
        translated = self.translate(statement)
        if translated.using is None:
            raise ValueError(f"not a MERGE: {statement[:60]}")
        self.connection.execute(translated.using)
        self.connection.execute(translated.sql)
        return self.fetch(exp.select("*").from_(_merge_source()).sql(dialect=DUCKDB))

    def fetch(self, sql: str) -> tuple[list[str], list[Row]]:
        """(column names, rows) of a DuckDB query."""
        cursor = self.connection.execute(sql)
        columns = [d[0] for d in cursor.description or []]
        return columns, [tuple(_hashable(v) for v in r) for r in cursor.fetchall()]

    def describe(self, statement: str) -> list[tuple[str, str]]:
        """(name, Spark type) of a Spark query's output columns, as Spark's DESCRIBE QUERY answers."""
        relation = self.connection.sql(self.translate(statement).sql)  # planned, not run
        return [(name, spark_type(str(t))) for name, t in zip(relation.columns, relation.types)]


def version_name(table: TableName, version: int) -> str:
    return f"{'__'.join(table.parts())}@v{version}"


def changes_name(table: TableName, first: int, last: int, hooked: bool) -> str:
    return f"{'__'.join(table.parts())}@c{first}_{last}{'_hooked' if hooked else ''}"


def _read_versions(
    tree: exp.Expression,
    sources: set[TableName],
    plain: Mapping[TableName, int],
    reads: list[Read],
    hooked: bool,
) -> exp.Expression:
    """Every source read (a version, a change window, a plain name) as its DuckDB table.

    Appends each read to `reads`; a plain name reads the version in `plain`.
    """
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table):
            return node
        window = _change_window(node)
        if window is not None:
            reads.append(("changes", *window))
            return _renamed(node, changes_name(*window, hooked), alias=None)
        if not node.db and node.name.lower() in ctes:
            return node
        table = TableName.of(node)
        if table not in sources:
            return node  # a state table: it lives in DuckDB under its own name
        version = _time_travel(node)
        number = plain[table] if version is None else version
        reads.append(("version", table, number))
        return _renamed(node, version_name(table, number), alias=node.alias or table.name)

    return tree.transform(replace, copy=False)


def _ctes_read(query: exp.Expression, ctes: Sequence[exp.CTE]) -> list[exp.CTE]:
    """Copies of the CTEs (of `ctes`, in scope order) that `query` reads, directly or through others.

    A type probe takes only these: copying and generating every CTE of a
    change query for each probe was most of the layer's time.
    """
    by_name = {cte.alias_or_name: cte for cte in ctes}  # an inner CTE shadows an outer one

    def read_by(tree: exp.Expression) -> set[str]:
        return {t.name for t in tree.find_all(exp.Table) if not t.db and t.name in by_name}

    wanted, pending = set(), read_by(query)
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            pending |= read_by(by_name[name].this)
    return [
        cte.copy()
        for cte in ctes
        if cte.alias_or_name in wanted and by_name[cte.alias_or_name] is cte
    ]


def _argument_key(argument: exp.Expression, select: exp.Select) -> str:
    """An aggregate argument with the relations its SELECT reads (names, not versions).

    A FROM item is named by its alias and the tables and CTEs it reads, so
    one text over different relations is asked about separately.
    """
    read = []
    clauses = [select.args.get("from_"), *(select.args.get("joins") or [])]
    for item in [*clauses, *(select.args.get("laterals") or [])]:
        if item is None:
            continue
        tables = set()
        for table in item.find_all(exp.Table):
            window = _change_window(table)
            tables.add(f"changes of {window[0]}" if window else str(TableName.of(table)))
        read.append(f"{item.this.alias_or_name}={sorted(tables)}")
    return f"{argument.sql(dialect=SPARK)} over {'; '.join(read)}"


def _renamed(node: exp.Table, name: str, alias: str | None) -> exp.Table:
    table = exp.Table(this=exp.to_identifier(name, quoted=True))
    found = node.args.get("alias")
    if found is not None:
        table.set("alias", found.copy())
    elif alias is not None:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    return table


def _spark_correlation(tree: exp.Expression) -> exp.Expression:
    """CORR(x, y) answering NULL where Spark does and DuckDB says NaN (SPARK_SEMANTICS)."""

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Corr) or isinstance(node.parent, exp.Window):
            return node
        x, y = node.this, node.expression
        known = exp.and_(
            *(exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())) for v in (x, y))
        )

        def paired(value: exp.Expression) -> exp.Expression:
            return exp.Case(ifs=[exp.If(this=known.copy(), true=value.copy())])

        constant = exp.or_(
            *(
                exp.EQ(this=exp.VariancePop(this=paired(v)), expression=exp.Literal.number(0))
                for v in (x, y)
            )
        )
        pairs = exp.Count(this=paired(exp.Literal.number(1)))
        too_few = exp.LT(this=pairs, expression=exp.Literal.number(2))
        return exp.Case(
            ifs=[exp.If(this=too_few, true=exp.null()), exp.If(this=constant, true=exp.null())],
            # Anonymous: the rewrite must not visit its own CORR again.
            default=exp.Anonymous(this="corr", expressions=[x.copy(), y.copy()]),
        )

    return tree.transform(replace, copy=False)


def _over(call: exp.Expression, window: exp.Window | None) -> exp.Expression:
    if window is None:
        return call
    over = window.copy()
    over.set("this", call)
    return over


def _is_decimal_cast(node: exp.Expression) -> bool:
    return isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DECIMAL


def _spark_decimal_division(node: exp.Expression) -> exp.Expression:
    """CAST(a / b AS DECIMAL(p, s)) over decimals -> CAST(spark_divide(a, b, s) AS DECIMAL(p, s)).

    >>> tree = sqlglot.parse_one("SELECT CAST(x / CAST(n AS DECIMAL(20, 0)) AS DECIMAL(14, 6))")
    >>> tree.transform(_spark_decimal_division).sql(dialect="duckdb")
    'SELECT CAST(SPARK_DIVIDE(CAST(x AS TEXT), CAST(CAST(n AS DECIMAL(20, 0)) AS TEXT), 6) AS DECIMAL(14, 6))'
    """
    if isinstance(node, exp.Div) and (
        _is_decimal_cast(node.this) or _is_decimal_cast(node.expression)
    ):
        cast = node.parent
        if not (isinstance(cast, exp.Cast) and cast.to.this == exp.DataType.Type.DECIMAL):
            raise NotImplementedError(
                f"a decimal division whose scale Spark derives from its operands: {node.sql(SPARK)}"
            )
        scale = int(cast.to.expressions[1].this.name)
        text = exp.DataType.build("TEXT")
        return exp.Anonymous(
            this="spark_divide",
            expressions=[
                exp.Cast(this=node.this.copy(), to=text.copy()),
                exp.Cast(this=node.expression.copy(), to=text.copy()),
                exp.Literal.number(scale),
            ],
        )
    return node


def _duckdb_statement(tree: exp.Expression) -> exp.Expression:
    """What DuckDB spells differently: RAISE_ERROR, UPDATE SET targets, Delta's table properties.

    A MERGE's `SET t.c = ...` loses its target alias (DuckDB refuses a
    qualified column there); CREATE TABLE loses USING DELTA and
    TBLPROPERTIES, which change no row. Spark's CACHE TABLE x AS q (a cached
    temporary view, emit.stage_changes) is a temporary table, its UNCACHE
    nothing, and the DROP VIEW of it a DROP TABLE.
    """
    if isinstance(tree, exp.Cache):
        return exp.Create(this=tree.this, kind="TABLE", replace=True, expression=tree.expression)
    if isinstance(tree, exp.Uncache):
        return exp.select(exp.Literal.number(1))
    if isinstance(tree, exp.Drop) and tree.args.get("kind") == "VIEW":
        tree.set("kind", "TABLE")
        return tree

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.EQ) and isinstance(node.parent, exp.Update):
            target = node.this
            if isinstance(target, exp.Column) and target.table:
                target.set("table", None)
        if isinstance(node, exp.When) and isinstance(
            node.args.get("then"), exp.Insert | exp.Update
        ):
            raised = node.args["then"].find(exp.Anonymous)
            if raised is not None and raised.name.upper() == "RAISE_ERROR":
                # The guard check's insert clause (emit._refuse_stale_guard), and
                # the clauses refusing a cancelling removal (emit._refuse_cancelled).
                # DuckDB evaluates a clause's values for rows it does not
                # apply to (and folds a constant error() while planning), so
                # the clause becomes its own way to fail a MERGE.
                (message,) = raised.expressions
                node.set("then", exp.var(f"ERROR {message.sql(dialect=DUCKDB)}"))
                return node
        if isinstance(node, exp.Anonymous) and node.name.upper() == "RAISE_ERROR":
            return exp.Anonymous(this="error", expressions=node.expressions)
        if isinstance(node, exp.Create) and node.args.get("properties") is not None:
            node.set("properties", None)
        return node

    return tree.transform(replace, copy=False)


def _duckdb_hash(node: exp.Expression) -> exp.Expression:
    """Spark's XXHASH64 as DuckDB's hash (SPARK_SEMANTICS)."""
    if isinstance(node, exp.Anonymous) and node.name.upper() == "XXHASH64":
        return exp.Anonymous(this="hash", expressions=node.expressions)
    return node


def _merge_source() -> exp.Table:
    return exp.Table(this=exp.to_identifier(MERGE_SOURCE, quoted=True))


def _change_window(node: exp.Table) -> tuple[TableName, int, int] | None:
    """(table, first, last) of `table_changes('table', first, last)`; None for another table."""
    if not (isinstance(node.this, exp.Anonymous) and node.this.name.lower() == "table_changes"):
        return None
    name, first, last = node.this.expressions
    return TableName.of(exp.to_table(name.name, dialect=SPARK)), int(first.name), int(last.name)


def _time_travel(node: exp.Table) -> int | None:
    version = node.args.get("version")
    if version is None:
        return None
    if version.name.upper() != "VERSION" or version.args.get("kind") != "AS OF":
        raise NotImplementedError(f"time travel other than VERSION AS OF: {node.sql(SPARK)}")
    return int(version.expression.name)


def _at_version_zero(node: exp.Expression) -> exp.Expression:
    """A source's version or change window moved to version 0 (same columns, no rows)."""
    if isinstance(node, exp.Table):
        if _change_window(node) is not None:
            node.this.set("expressions", [node.this.expressions[0], *(exp.Literal.number(0),) * 2])
        elif _time_travel(node) is not None:
            node.args["version"].set("expression", exp.Literal.number(0))
    return node


def _decimal(precision: int, scale: int) -> exp.DataType:
    """DECIMAL(p, s) bounded as Spark's DecimalType.bounded bounds it."""
    return exp.DataType.build(
        f"DECIMAL({min(MAX_PRECISION, precision)}, {min(MAX_PRECISION, scale)})"
    )


# -- the compiler's catalog -------------------------------------------------------------


class Catalog:
    """compile_model's Catalog over an Engine: sources' schemas, and query types in Spark's names.

    A query is planned over the sources' newest versions (types do not change).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        return list(self.engine.tables[table].columns)

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        return self.engine.describe(sql)


def _hashable(value: object) -> object:
    """A fetched value rows can be counted by: an array (a bounded MIN/MAX's kept
    (value, count) pairs) as a tuple, each struct as the tuple of its fields."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(_hashable(v) for v in value.values())
    return value


def _literal(value: object, data_type: exp.DataType) -> exp.Expr:
    """A fetched value as a literal of its column's type (_hashable's tuples as arrays
    of structs again)."""
    if isinstance(value, tuple) and data_type.is_type(exp.DataType.Type.ARRAY):
        (element,) = data_type.expressions
        return exp.Array(expressions=[_literal(v, element) for v in value])
    if isinstance(value, tuple) and data_type.is_type(exp.DataType.Type.STRUCT):
        return exp.Struct(
            expressions=[
                exp.PropertyEQ(this=field.this.copy(), expression=_literal(v, field.args["kind"]))
                for v, field in zip(value, data_type.expressions)
            ]
        )
    return exp.convert(value)
