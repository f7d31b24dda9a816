"""Hostile and broken input through dbt and real Spark (issue 6, item 4).

The unit layer checks identifier quoting and the refusals one SQL string at a
time; here every piece runs for real: dbt renders the names, Spark and Delta
store them, the refresh's MERGEs read and write them, and the oracle
recomputes each model at the versions it records.

- TestHostileIdentifiers: a source named by a reserved word in mixed case, columns
  named by reserved words, with a space, a backtick and mixed case; an
  upper-case model name; aggregate, DISTINCT and self-join models refreshed
  incrementally; ivm_explain of the upper-case model.
- TestHostileTypes: DECIMAL(38,10) at its extremes, DATE/TIMESTAMP at the
  epoch and year 9999, BOOLEAN, ARRAY, STRUCT and BINARY values and keys,
  COUNT(DISTINCT array); a MAP group key and a SUM over the DECIMAL(38,10)
  (found here: Spark's `+` would round it) refused through dbt, creating
  nothing.
- TestWideRows: 151 columns (the state's `__ivm_guard` past Delta's 32
  columns with file statistics) and ~200 KB strings.
- TestConfigInjection: SQL fragments in ivm configs and a model alias:
  refused before the model's first statement, naming the model and the
  config; a custom schema: refused before dbt lists or creates it (naming
  the schema config); the source and the other models survive.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from dbt.tests.util import rm_file, run_dbt, run_dbt_and_capture, write_file
from dbt_common.exceptions import CompilationError

from tests.functional.ivm_checks import bag_difference, recorded_state, state_builds
from tests.functional.ivm_project import SOURCES_YML, IvmProject


def _results_by_model(results) -> dict[str, object]:
    return {result.node.name: result for result in results}


def assert_matches_at_recorded_versions(
    spark, schema: str, model: str, query_template: str, sources: dict[str, str]
) -> dict[str, int]:
    """The oracle for sources whose names need quoting.

    `sources` maps a placeholder of `query_template` to the source's table name
    as the model reads it (unquoted); the recorded versions are looked up by
    that name, case-insensitively (Spark's names are).
    """
    recorded = {
        key.lower(): value for key, value in recorded_state(spark, schema, model).sources.items()
    }
    versions = {
        placeholder: int(recorded[f"{schema}.{table}".lower()]["version"])
        for placeholder, table in sources.items()
    }
    query = query_template.format(
        **{
            placeholder: f"{schema}.`{table.replace('`', '``')}` VERSION AS OF {versions[placeholder]}"
            for placeholder, table in sources.items()
        }
    )
    model_sql = f"SELECT * FROM {schema}.`{model}`"
    difference = bag_difference(spark, model_sql, query)
    assert difference.equal, f"{model} differs from its query at versions {versions}: {difference}"
    assert spark.sql(model_sql).count() > 0, f"{model} is empty: the check proves little"
    return versions


# --- 1. hostile identifiers ----------------------------------------------------

# Spark's session catalog refuses table names with anything but letters,
# digits and _ (INVALID_SCHEMA_OR_RELATION_NAME, even quoted), so the table's
# hostility is a reserved word in mixed case: unquoted, no statement parses.
HOSTILE_TABLE = "Select"
# Column names Delta only takes with column mapping (a space); reserved words,
# a backtick inside a name and mixed case need quoting or case care everywhere.
HOSTILE_DDL = (
    "CREATE TABLE {table} (`select` INT, `group` STRING, `from` INT, `unit price` DECIMAL(10,2), "
    "`we``ird` STRING, CustomerId INT) USING DELTA TBLPROPERTIES ("
    "delta.enableChangeDataFeed = true, delta.columnMapping.mode = 'name')"
)
HOSTILE_SOURCES_YML = f"""
version: 2
sources:
  - name: odd
    schema: "{{{{ target.schema }}}}"
    quoting:
      identifier: true
    tables:
      - name: hostile
        identifier: "{HOSTILE_TABLE}"
"""
HOSTILE_QUERIES = {
    "Hostile_Totals": (
        "select `group`, CustomerId, sum(`unit price`) as `total price`, count(*) as `count`, "
        "count(`we``ird`) as `n we``ird`, min(`select`) as `select`, sum(`from`) as `from` "
        "from {src} group by `group`, CustomerId"
    ),
    "hostile_distinct": "select distinct `we``ird`, `unit price`, CustomerId from {src}",
    "hostile_self_join": (
        "select a.CustomerId, a.`group`, b.`group` as `Other Group`, "
        "a.`unit price` * b.`from` as `select` "
        "from {src} a join {src} b on a.CustomerId = b.CustomerId and a.`select` <> b.`select`"
    ),
}
HOSTILE_SEED = (
    "(1, 'a', 10, 1.50, 'x', 7), (2, 'a', 20, 2.50, 'y', 7), (3, 'b', NULL, NULL, NULL, 8), "
    "(NULL, NULL, NULL, NULL, NULL, NULL)"
)
HOSTILE_BATCH = [
    # duplicates (of a seed row and of each other) and an all-NULL row
    (
        "INSERT INTO {t} VALUES (1, 'a', 10, 1.50, 'x', 7), (4, 'B', 5, 0.01, 'x', 8), "
        "(4, 'B', 5, 0.01, 'x', 8), (NULL, NULL, NULL, NULL, NULL, NULL), "
        "(5, NULL, 1, 9.99, 'z', NULL)"
    ),
    # An update as a delete and an insert: Delta 4.0.1 cannot UPDATE or MERGE
    # a change-feed table with a backtick in a column name (the rows it packs
    # get INVALID_ATTRIBUTE_NAME_SYNTAX, `packedData.`we`ird``); DELETE and
    # INSERT work. The refresh itself never writes such a name: state columns
    # are the compiler's own (__ivm_g0, __ivm_arg0, ...).
    "DELETE FROM {t} WHERE `select` = 2",
    "INSERT INTO {t} VALUES (2, 'a', 20, 3.50, NULL, 8), (2, 'a', 20, 3.50, NULL, 8)",
    "DELETE FROM {t} WHERE `select` = 3 OR (`select` IS NULL AND CustomerId IS NULL)",
]


class TestHostileIdentifiers(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        files = {"sources.yml": HOSTILE_SOURCES_YML}
        for name, query in HOSTILE_QUERIES.items():
            files[f"{name}.sql"] = query.format(src="{{ source('odd', 'hostile') }}")
        return files

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = f"{project.test_schema}.`{HOSTILE_TABLE}`"
        project.run_sql(HOSTILE_DDL.format(table=table))
        project.run_sql(f"INSERT INTO {table} VALUES {HOSTILE_SEED}")
        return table

    def test_build_then_refresh_incrementally(self, project, spark, source_table):
        schema = project.test_schema
        run_dbt(["run"])
        compiled = Path(project.project_root, "target", "compiled", "test", "models")
        assert f"{schema}.`{HOSTILE_TABLE}`" in (compiled / "Hostile_Totals.sql").read_text()

        for statement in HOSTILE_BATCH:
            spark.sql(statement.format(t=source_table))
        results = run_dbt(["run"])
        for name, result in _results_by_model(results).items():
            assert str(result.adapter_response.get("code")) == "INCREMENTAL", (name, result.message)
        for name, query in HOSTILE_QUERIES.items():
            assert_matches_at_recorded_versions(spark, schema, name, query, {"src": HOSTILE_TABLE})
            assert state_builds(spark, schema, name) == 1, f"{name} was rebuilt"

    def test_explain_of_the_upper_case_model(self, project):
        _, log = run_dbt_and_capture(
            ["run-operation", "ivm_explain", "--args", "{model: Hostile_Totals}"]
        )
        assert "view class:   grouped_aggregate" in log
        assert HOSTILE_TABLE in log
        written = Path(project.project_root, "target", "ivm_explain", "Hostile_Totals")
        assert (written / "merge_changes.sql").read_text().startswith("MERGE INTO")


# --- 2. types --------------------------------------------------------------------

TYPED_DDL = (
    "CREATE TABLE {table} (id INT, amount DECIMAL(38,10), day DATE, at TIMESTAMP, "
    "flag BOOLEAN, nums ARRAY<INT>, pair STRUCT<a:INT,b:STRING>, blob BINARY) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
MAP_DDL = (
    "CREATE TABLE {table} (id INT, attrs MAP<STRING,INT>) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
TYPED_SOURCES_YML = """
version: 2
sources:
  - name: raw
    schema: "{{ target.schema }}"
    tables:
      - name: typed
      - name: mapped
"""
DECIMAL_MAX = "9999999999999999999999999999.9999999999"
# The extremes sit in groups of their own: DECIMAL(38,10) has no room for
# their sum with anything of the same sign (Spark's ANSI mode raises on overflow).
TYPED_SEED = (
    f"(1, {DECIMAL_MAX}, DATE'1970-01-01', TIMESTAMP'1970-01-01 00:00:00', true, "
    "array(1, 2), named_struct('a', 1, 'b', 'x'), X'00FF'), "
    f"(2, -{DECIMAL_MAX}, DATE'9999-12-31', TIMESTAMP'9999-12-31 23:59:59.999999', false, "
    "array(), named_struct('a', CAST(NULL AS INT), 'b', CAST(NULL AS STRING)), X''), "
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
    "(4, 0.0000000001, DATE'2024-02-29', TIMESTAMP'2024-02-29 12:00:00.000001', true, "
    "array(CAST(NULL AS INT), 3), named_struct('a', 1, 'b', 'x'), NULL), "
    "(4, 0.0000000001, DATE'2024-02-29', TIMESTAMP'2024-02-29 12:00:00.000001', true, "
    "array(CAST(NULL AS INT), 3), named_struct('a', 1, 'b', 'x'), NULL)"
)
TYPED_QUERIES = {
    "typed_rows": "select * from {src}",
    # SUM over the DECIMAL(38,10) itself is refused (a DECIMAL(38,10) sum
    # cannot be added exactly by Spark's `+`; see typed_fine_sums), so the sum
    # is taken at 6 places, as the refusal suggests.
    "typed_groups": (
        "select day, flag, pair, sum(cast(amount as decimal(38, 6))) as total, "
        "min(at) as first_at, "
        "max(day) as last_day, count(distinct nums) as n_nums, count(*) as n "
        "from {src} group by day, flag, pair"
    ),
    "typed_days": "select distinct day, flag from {src}",
}
# Refused through dbt, creating nothing: model -> what the message must say.
REFUSED_TYPED_MODELS = {
    "typed_map_groups": (
        "select attrs, count(*) as n from {{ source('raw', 'mapped') }} group by attrs",
        ["MAP GROUP BY key", "attrs", "map<string,int>", "map_entries()"],
    ),
    "typed_fine_sums": (
        "select flag, sum(amount) as total from {{ source('raw', 'typed') }} group by flag",
        ["amount", "DECIMAL(38, 10)", "DECIMAL(38, 6)"],
    ),
}


def _typed_batch(seed: int = 6) -> list[str]:
    """Random-ish rows from pools of awkward values, then an update and a delete."""
    rng = random.Random(seed)
    pools = {
        "amount": ["NULL", "1.5", "-2.25", "0.0000000001", "123456789012345678.0123456789"],
        # not the extremes' days, so no group sums past DECIMAL(38,10)
        "day": ["NULL", "DATE'2024-02-29'", "DATE'2000-01-01'"],
        "at": ["NULL", "TIMESTAMP'1970-01-01 00:00:00'", "TIMESTAMP'2038-01-19 03:14:08'"],
        "flag": ["NULL", "true", "false"],
        "nums": ["NULL", "array()", "array(1, 2)", "array(CAST(NULL AS INT), 3)"],
        "pair": [
            "NULL",
            "named_struct('a', 1, 'b', 'x')",
            "named_struct('a', CAST(NULL AS INT), 'b', CAST(NULL AS STRING))",
        ],
        "blob": ["NULL", "X''", "X'00FF'", "X'DEADBEEF'"],
    }
    rows = []
    for i in range(12):
        values = [str(10 + i % 9)] + [rng.choice(pool) for pool in pools.values()]
        rows.append(f"({', '.join(values)})")
    rows.append(rows[0])  # a duplicate
    return [
        "INSERT INTO {t} VALUES " + ", ".join(rows),
        "UPDATE {t} SET amount = amount + 0.5, nums = array_append(nums, 9) WHERE id % 2 = 0",
        "UPDATE {t} SET pair = named_struct('a', 2, 'b', 'y'), flag = NOT flag WHERE id = 4",
        "DELETE FROM {t} WHERE flag IS NULL AND id > 3",
    ]


class TestHostileTypes(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        files = {"sources.yml": TYPED_SOURCES_YML}
        for name, (sql, _) in REFUSED_TYPED_MODELS.items():
            files[f"{name}.sql"] = sql
        for name, query in TYPED_QUERIES.items():
            files[f"{name}.sql"] = query.format(src="{{ source('raw', 'typed') }}")
        return files

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = f"{project.test_schema}.typed"
        project.run_sql(TYPED_DDL.format(table=table))
        project.run_sql(f"INSERT INTO {table} VALUES {TYPED_SEED}")
        mapped = f"{project.test_schema}.mapped"
        project.run_sql(MAP_DDL.format(table=mapped))
        project.run_sql(f"INSERT INTO {mapped} VALUES (1, map('a', 1)), (2, NULL)")
        return table

    def test_types_refresh_incrementally(self, project, spark, source_table):
        schema = project.test_schema
        run_dbt(["run", "--exclude", *REFUSED_TYPED_MODELS])
        for statement in _typed_batch():
            spark.sql(statement.format(t=source_table))
        results = run_dbt(["run", "--exclude", *REFUSED_TYPED_MODELS])
        for name, result in _results_by_model(results).items():
            assert str(result.adapter_response.get("code")) == "INCREMENTAL", (name, result.message)
        for name, query in TYPED_QUERIES.items():
            assert_matches_at_recorded_versions(spark, schema, name, query, {"src": "typed"})
            assert state_builds(spark, schema, name) == 1, f"{name} was rebuilt"
        # The extremes survived the round trip through the state exactly.
        amounts = {
            str(row["amount"])
            for row in spark.sql(f"SELECT amount FROM {schema}.typed_rows").collect()
        }
        # (id 2 held -DECIMAL_MAX; the batch's `amount + 0.5` changed it, rounded
        # to 9 places by Spark's own decimal `+`)
        assert DECIMAL_MAX in amounts

    def test_refused_types_fail_through_dbt_and_create_nothing(self, project, spark, source_table):
        schema = project.test_schema
        results = run_dbt(["run", "--select", *REFUSED_TYPED_MODELS], expect_pass=False)
        for name, result in _results_by_model(results).items():
            message = str(result.message)
            assert str(result.status) == "error" and name in message, message
            assert "cannot be maintained incrementally" in message, message
            for part in REFUSED_TYPED_MODELS[name][1]:
                assert part in message, (part, message)
        tables = {row["tableName"] for row in spark.sql(f"SHOW TABLES IN {schema}").collect()}
        assert not {t for t in tables for name in REFUSED_TYPED_MODELS if t.startswith(name)}


# --- 3. wide rows ----------------------------------------------------------------

WIDE_COLUMNS = 150
WIDE_PAYLOAD = 200_000
WIDE_DDL = (
    "CREATE TABLE {table} ("
    + ", ".join(f"c{i} INT" for i in range(WIDE_COLUMNS))
    + ", payload STRING) USING DELTA TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
WIDE_QUERIES = {
    "wide_rows": "select * from {src}",
    "wide_groups": (
        "select c1 % 2 as parity, count(*) as n, sum(c2) as s2, max(c149) as m149, "
        "sum(length(payload)) as payload_chars from {src} group by c1 % 2"
    ),
}


def _wide_insert(table: str, ids: str) -> str:
    """Rows c_i = id + i, payload ~200 KB of one letter per id, for ids from an inline table."""
    columns = ", ".join(f"id + {i}" for i in range(WIDE_COLUMNS))
    payload = f"repeat(char(65 + id % 26), {WIDE_PAYLOAD})"
    return f"INSERT INTO {table} SELECT {columns}, {payload} FROM VALUES {ids} AS ids(id)"


class TestWideRows(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        sources = """
version: 2
sources:
  - name: raw
    schema: "{{ target.schema }}"
    tables:
      - name: wide
"""
        files = {"sources.yml": sources}
        for name, query in WIDE_QUERIES.items():
            files[f"{name}.sql"] = query.format(src="{{ source('raw', 'wide') }}")
        return files

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = f"{project.test_schema}.wide"
        project.run_sql(WIDE_DDL.format(table=table))
        project.run_sql(_wide_insert(table, "(0), (1), (2), (3)"))
        return table

    def test_wide_rows_refresh_incrementally(self, project, spark, source_table):
        schema = project.test_schema
        run_dbt(["run"])
        spark.sql(_wide_insert(source_table, "(1), (4), (5)"))
        spark.sql(f"UPDATE {source_table} SET c5 = c5 + 1, payload = upper(payload) WHERE c0 = 1")
        spark.sql(f"UPDATE {source_table} SET c149 = NULL, payload = NULL WHERE c0 = 4")
        spark.sql(f"DELETE FROM {source_table} WHERE c0 = 2")
        results = run_dbt(["run"])
        for name, result in _results_by_model(results).items():
            assert str(result.adapter_response.get("code")) == "INCREMENTAL", (name, result.message)
        for name, query in WIDE_QUERIES.items():
            assert_matches_at_recorded_versions(spark, schema, name, query, {"src": "wide"})
            assert state_builds(spark, schema, name) == 1, f"{name} was rebuilt"
        state_columns = spark.table(f"{schema}.wide_rows__ivm_state").columns
        assert len(state_columns) > 32 and "__ivm_guard" in state_columns


# --- 4. SQL in config values -------------------------------------------------------

PLAIN_MODEL = "select k, v from {{ source('raw', 'src') }}"
# model -> (its config call, the config the error must name). Every value
# is refused by the adapter before the model's first statement.
INJECTIONS = {
    "inj_group": ("""{{ config(ivm_group="x'; DROP TABLE src; --") }}""", "ivm_group"),
    "inj_strategy": ("""{{ config(ivm_strategy="auto; drop table src") }}""", "ivm_strategy"),
    "inj_fallback": ("""{{ config(ivm_fallback="full_refresh' --") }}""", "ivm_fallback"),
    # dbt-spark renders relation names unquoted (and its quote() does not
    # escape a backtick), so the alias would reach SQL as written.
    "inj_alias": ("""{{ config(alias="bad`; drop table src; --") }}""", "alias"),
}
# dbt creates a model's schema before any model runs, with dbt-spark's
# `create schema if not exists <name>`: the adapter refuses the name there.
SCHEMA_INJECTION = """{{ config(schema="x`; drop table src; --") }}"""


class TestConfigInjection(IvmProject):
    # In the Thrift slice of the README's test command: SQL in configs must be refused before it
    # reaches a server.
    thrift_slice = True

    @pytest.fixture(scope="class")
    def models(self):
        files = {"sources.yml": SOURCES_YML, "plain_rows.sql": PLAIN_MODEL}
        for name, (config, _) in INJECTIONS.items():
            files[f"{name}.sql"] = f"{config}\n{PLAIN_MODEL}"
        return files

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = f"{project.test_schema}.src"
        project.run_sql(
            f"CREATE TABLE {table} (k INT, v INT) USING DELTA "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
        project.run_sql(f"INSERT INTO {table} VALUES (1, 1), (2, NULL)")
        return table

    def _tables(self, spark, schema: str) -> set[str]:
        return {row["tableName"] for row in spark.sql(f"SHOW TABLES IN {schema}").collect()}

    def test_sql_in_configs_is_refused_before_any_sql(self, project, spark, source_table):
        schema = project.test_schema
        before = self._tables(spark, schema)
        results = _results_by_model(run_dbt(["run", "--exclude", "inj_schema"], expect_pass=False))
        assert str(results["plain_rows"].status) == "success"
        for name, (_, config) in INJECTIONS.items():
            message = str(results[name].message)
            assert str(results[name].status) == "error", (name, message)
            assert f"model.test.{name}" in message and config in message, (name, message)
        assert spark.sql(f"SELECT * FROM {source_table}").count() == 2
        after = self._tables(spark, schema)
        assert after - before == {"plain_rows", "plain_rows__ivm_state"}, after - before

    def test_sql_in_a_schema_config_is_refused_before_create_schema(
        self, project, spark, source_table
    ):
        # Its own project state: dbt lists every model's schema before any
        # model runs, so the bad schema stops the whole invocation.
        models = Path(project.project_root, "models")
        schemas = {row[0] for row in spark.sql("SHOW SCHEMAS").collect()}
        write_file(f"{SCHEMA_INJECTION}\n{PLAIN_MODEL}", models, "inj_schema.sql")
        try:
            # Refused while dbt fills its relation cache, which knows the
            # schema but not which model asked for it.
            with pytest.raises(CompilationError) as refused:
                run_dbt(["run", "--select", "inj_schema"], expect_pass=False)
        finally:
            rm_file(models, "inj_schema.sql")
        message = str(refused.value)
        assert "drop table src; --' is not a valid name for Spark" in message, message
        assert "schema config" in message, message
        assert {row[0] for row in spark.sql("SHOW SCHEMAS").collect()} == schemas
        assert spark.sql(f"SELECT * FROM {source_table}").count() == 2
        assert "plain_rows" in self._tables(spark, project.test_schema)
