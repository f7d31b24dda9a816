"""Source schema changes between refreshes: the matrix of issue 6, item 2.

Every cell is its own Delta source (column mapping on, so columns can be
renamed and dropped; type widening on, so they can be retyped in place) and
its own model. Between two `dbt run`s each source gets rows inserted, then its
schema change, then rows updated and deleted. After the run:

| change  | a column the model does not read | a column it reads                    |
|---------|----------------------------------|--------------------------------------|
| add     | incremental                      | (`SELECT *`) rebuilt with the new column; with on_schema_change='fail': stopped |
| rename  | rebuilt (no change feed across it) | stopped, naming the column and its new name |
| drop    | rebuilt (no change feed across it) | stopped, naming the column           |
| retype  | rebuilt (no change feed across it) | rebuilt (the stored sums came from the old values) |
| swap    |                                  | rebuilt (the name now means another column) |

A model that ran equals its query at the versions it records; a stopped one
still shows what it showed before, has no new state commit, and builds once
its SQL is changed to the new columns. The README's test command runs one
cell per path (TestSourceSchemaChanges); the drops, whose paths the renames
take, run in scripts/test-extended (TestMoreSourceSchemaChanges).
"""

from __future__ import annotations

from collections import Counter

import pytest
from dbt.tests.util import run_dbt, write_file

from tests.conftest import THRIFT
from tests.functional.ivm_checks import assert_model_matches_query, recorded_version
from tests.functional.ivm_project import IvmProject

SCHEMA_CHANGE_DDL = (
    "CREATE TABLE {table} (k INT, v {narrow}, u {narrow}, w STRING) USING DELTA TBLPROPERTIES ("
    "delta.enableChangeDataFeed = true, delta.columnMapping.mode = 'name', "
    "delta.enableTypeWidening = true)"
)

# Reads k and v (not u or w); v's type does not reach the output (SUM of an
# INT or a BIGINT is a BIGINT), so only the recorded column types can tell
# that v was retyped.
GROUPED = "select k, sum(v) as sv, count(*) as n from {src} group by k"
EVERYTHING = "select * from {src}"

# cell -> (the model's query, its config, the schema change's statements)
CELLS = {
    "add_unused": (GROUPED, "", ["ALTER TABLE {t} ADD COLUMNS (z INT)"]),
    "add_used": (EVERYTHING, "", ["ALTER TABLE {t} ADD COLUMNS (z INT)"]),
    "add_used_fail": (
        EVERYTHING,
        "{{ config(on_schema_change='fail') }}",
        ["ALTER TABLE {t} ADD COLUMNS (z INT)"],
    ),
    "rename_unused": (GROUPED, "", ["ALTER TABLE {t} RENAME COLUMN w TO w2"]),
    "rename_used": (GROUPED, "", ["ALTER TABLE {t} RENAME COLUMN v TO v2"]),
    "drop_unused": (GROUPED, "", ["ALTER TABLE {t} DROP COLUMN w"]),
    "drop_used": (GROUPED, "", ["ALTER TABLE {t} DROP COLUMN v"]),
    "retype_unused": (GROUPED, "", ["ALTER TABLE {t} ALTER COLUMN u TYPE {wide}"]),
    "retype_used": (GROUPED, "", ["ALTER TABLE {t} ALTER COLUMN v TYPE {wide}"]),
    "swap_used": (
        GROUPED,
        "",
        ["ALTER TABLE {t} RENAME COLUMN v TO v_old", "ALTER TABLE {t} RENAME COLUMN u TO v"],
    ),
}


def widening(spark) -> dict[str, str]:
    """The column types a retype cell widens between, on the suite's Delta.

    Delta 4.0 widens INT to BIGINT; Delta 3.3's type widening (a preview,
    scripts/test-matrix's oldest end) only BYTE to SHORT and INT, and SHORT
    to INT, so there v and u start as SMALLINT. SUM of either is a BIGINT.
    """
    from dbt.adapters.spark_ivm.engine import from_answer, probe

    delta = from_answer(list(spark.sql(probe()).collect()[0])).delta
    if delta is not None and delta < (4, 0):
        return {"narrow": "smallint", "wide": "int"}
    return {"narrow": "int", "wide": "bigint"}


INCREMENTAL = {"add_unused"}
# cell -> what the rebuild's reason must say. Delta does not read a change
# feed across a rename, drop or type change of a column mapping table, even
# of a column the model does not read, so those cells are rebuilt too.
REBUILT = {
    "rename_unused": "change feed cannot be read across a column rename or drop "
    "({schema}.src_rename_unused: RENAME COLUMN w to w2 at version 3)",
    "drop_unused": "change feed cannot be read across a column rename or drop "
    "({schema}.src_drop_unused: DROP COLUMNS w at version 3)",
    "retype_unused": "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
    "add_used": "the model's columns change (added z int)",
    "retype_used": "column 'v' of {schema}.src_retype_used changed type from {narrow} to {wide}",
    "swap_used": "column 'v' of {schema}.src_swap_used is now the column renamed from 'u'",
}
# cell -> what the error must say
STOPPED = {
    "add_used_fail": ["its columns changed (added z int)", "on_schema_change is 'fail'"],
    "rename_used": [
        "source {schema}.src_rename_used changed a column the model reads",
        "column 'v' of {schema}.src_rename_used was renamed to 'v2'",
        "nothing was written",
        "Fix: change the model's SQL",
    ],
    "drop_used": [
        "column 'v' of {schema}.src_drop_used was dropped",
        "nothing was written",
        "Fix: change the model's SQL",
    ],
}
# cell -> (query, config) once the user has followed the error's fix
FIXED = {
    "add_used_fail": (EVERYTHING, "{{ config(on_schema_change='sync_all_columns') }}"),
    "rename_used": ("select k, sum(v2) as sv, count(*) as n from {src} group by k", ""),
    "drop_used": ("select k, count(*) as n from {src} group by k", ""),
}


# Cells whose path another cell of the README's command already takes (a
# drop is read from Delta's history as a rename is, and stops or rebuilds the
# same way; tests/unit/test_schema_changes.py parses both): in
# TestMoreSourceSchemaChanges, run by scripts/test-extended.
REPEATED_PATHS = ("drop_unused", "drop_used")


def _model(query: str, config: str, cell: str) -> str:
    return config + "\n" + query.format(src=f"{{{{ source('raw', 'src_{cell}') }}}}")


def _sources_yml(cells) -> str:
    tables = "\n".join(f"      - name: src_{cell}" for cell in cells)
    return (
        'version: 2\nsources:\n  - name: raw\n    schema: "{{ target.schema }}"\n'
        f"    tables:\n{tables}\n"
    )


def _action(result) -> str:
    return str((result.adapter_response or {}).get("code", "")).lower()


def _message(result) -> str:
    return str((result.adapter_response or {}).get("_message") or result.message)


class SourceSchemaChanges(IvmProject):
    """The matrix over the cells named by `cells`."""

    cells: tuple[str, ...] = ()
    # In the Thrift slice of the README's test command, over Thrift only: Delta's history maps
    # come as Hive-rendered text over Thrift (delta.schema_history.parse_map_text), the harder reading;
    # the session run (in scripts/test-extended) reads them as maps, as every other session class
    # that refreshes does.
    thrift_slice = THRIFT

    @pytest.fixture(scope="class")
    def models(self):
        files = {"sources.yml": _sources_yml(self.cells)}
        for cell in self.cells:
            query, config, _ = CELLS[cell]
            files[f"{cell}.sql"] = _model(query, config, cell)
        return files

    @pytest.fixture(scope="class")
    def sources(self, project, spark):
        types = widening(spark)
        for cell in self.cells:
            table = f"{project.test_schema}.src_{cell}"
            project.run_sql(SCHEMA_CHANGE_DDL.format(table=table, **types))
            # Duplicates and NULLs in every column the models read or not.
            project.run_sql(
                f"INSERT INTO {table} VALUES (1, 10, 1, 'a'), (1, 10, 1, 'a'), "
                "(2, NULL, 2, NULL), (NULL, 5, NULL, 'b')"
            )
        return {cell: f"{project.test_schema}.src_{cell}" for cell in self.cells}

    def test_each_change_is_refreshed_rebuilt_or_stopped(self, project, spark, sources):
        schema = project.test_schema
        cells = self.cells
        run_dbt(["run"])
        shown = {
            cell: Counter(spark.sql(f"SELECT * FROM {schema}.{cell}").collect()) for cell in cells
        }
        versions = {cell: recorded_version(spark, schema, cell, f"src_{cell}") for cell in cells}

        for cell in cells:
            table = sources[cell]
            statements = CELLS[cell][2]
            # A change before the schema change and one after it: the refresh
            # window spans the schema change.
            spark.sql(f"INSERT INTO {table} VALUES (3, 7, 3, 'c'), (NULL, NULL, NULL, NULL)")
            for statement in statements:
                spark.sql(statement.format(t=table, **widening(spark)))
            spark.sql(f"UPDATE {table} SET k = 4 WHERE k = 1")
            spark.sql(f"DELETE FROM {table} WHERE k = 2")

        results = {r.node.name: r for r in run_dbt(["run"], expect_pass=False)}

        incremental = INCREMENTAL.intersection(cells)
        rebuilt = {cell: reason for cell, reason in REBUILT.items() if cell in cells}
        stopped = {cell: phrases for cell, phrases in STOPPED.items() if cell in cells}
        fixes = {cell: fix for cell, fix in FIXED.items() if cell in cells}
        for cell in incremental:
            assert _action(results[cell]) == "incremental", (cell, _message(results[cell]))
        for cell, reason in rebuilt.items():
            assert _action(results[cell]) == "rebuild", (cell, _message(results[cell]))
            assert reason.format(schema=schema, **widening(spark)) in _message(results[cell]), cell
        for cell in incremental | set(rebuilt):
            query = CELLS[cell][0]
            assert_model_matches_query(spark, schema, cell, query, f"src_{cell}")

        for cell, phrases in stopped.items():
            assert str(results[cell].status) == "error", (cell, results[cell].status)
            message = _message(results[cell])
            assert f"Model 'model.test.{cell}'" in message, message
            for phrase in phrases:
                assert phrase.format(schema=schema) in message, (phrase, message)
            # Nothing lost: the model shows what it showed, its state has no new commit.
            assert Counter(spark.sql(f"SELECT * FROM {schema}.{cell}").collect()) == shown[cell]
            assert recorded_version(spark, schema, cell, f"src_{cell}") == versions[cell]

        # The fix each error names: the stopped models build at the new version.
        for cell, (query, config) in fixes.items():
            write_file(_model(query, config, cell), project.project_root, "models", f"{cell}.sql")
        fixed = {r.node.name: r for r in run_dbt(["run", "--select", *fixes])}
        for cell, (query, _) in fixes.items():
            assert _action(fixed[cell]) == "rebuild", (cell, _message(fixed[cell]))
            assert_model_matches_query(spark, schema, cell, query, f"src_{cell}")

        # And the refresh after a schema change is incremental again.
        for cell in cells:
            spark.sql(f"INSERT INTO {sources[cell]} (k) VALUES (5)")
        again = {r.node.name: r for r in run_dbt(["run"])}
        for cell in cells:
            assert _action(again[cell]) == "incremental", (cell, _message(again[cell]))
            query = fixes.get(cell, CELLS[cell])[0]
            assert_model_matches_query(spark, schema, cell, query, f"src_{cell}")


class TestSourceSchemaChanges(SourceSchemaChanges):
    """One cell per path a schema change takes."""

    cells = tuple(cell for cell in CELLS if cell not in REPEATED_PATHS)


@pytest.mark.extended
class TestMoreSourceSchemaChanges(SourceSchemaChanges):
    """The drops, whose paths the renames take in TestSourceSchemaChanges."""

    cells = REPEATED_PATHS
