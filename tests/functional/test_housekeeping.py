"""ivm_orphans through dbt: a renamed ivm model's old view and state are listed, then dropped."""

from __future__ import annotations

from dbt.tests.util import rm_file, run_dbt, run_dbt_and_capture, write_file

from tests.functional.ivm_project import QUERIES, OneSourceProject


class TestOrphans(OneSourceProject):
    model_names = ("grouped",)

    def test_a_renamed_model_leaves_orphans_that_can_be_dropped(self, project, spark, source_table):
        schema = project.test_schema
        run_dbt(["run"])
        _, output = run_dbt_and_capture(["run-operation", "ivm_orphans"])
        assert "no orphaned ivm relations" in output

        # Rename the model: dbt builds the new one and leaves the old relations.
        models_dir = f"{project.project_root}/models"
        rm_file(models_dir, "grouped.sql")
        write_file(
            QUERIES["grouped"].format(src="{{ source('raw', 'src') }}"), models_dir, "renamed.sql"
        )
        run_dbt(["run"])
        tables = {r["tableName"] for r in spark.sql(f"SHOW TABLES IN {schema}").collect()}
        assert {"grouped", "grouped__ivm_state", "renamed", "renamed__ivm_state"} <= tables

        _, output = run_dbt_and_capture(["run-operation", "ivm_orphans"])
        assert "found 2 relation(s)" in output
        assert f"table {schema}.grouped__ivm_state" in output
        assert f"view {schema}.grouped (of {schema}.grouped)" in output
        assert "renamed" not in output

        run_dbt(["run-operation", "ivm_orphans", "--args", "{drop: true}"])
        tables = {r["tableName"] for r in spark.sql(f"SHOW TABLES IN {schema}").collect()}
        assert "grouped" not in tables and "grouped__ivm_state" not in tables
        assert {"renamed", "renamed__ivm_state", "src"} <= tables
        _, output = run_dbt_and_capture(["run-operation", "ivm_orphans"])
        assert "no orphaned ivm relations" in output
