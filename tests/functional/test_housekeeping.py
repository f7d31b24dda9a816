"""ivm_orphans through dbt: a renamed ivm model's old view and state are listed, then dropped."""

from __future__ import annotations

from dbt.tests.util import rm_file, run_dbt, run_dbt_and_capture, write_file

from tests.functional.ivm_checks import assert_model_matches_query
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


NODE_MODEL = (
    "with {cte} as (select g, count(*) as n from {{{{ source('raw', 'src') }}}} group by g) "
    "select {cte}.n, count(*) as groups from {cte} group by {cte}.n"
)


class TestPlanNodeRelations(OneSourceProject):
    """A model's plan nodes live and die with it, and with the CTEs they stand for."""

    def test_nodes_follow_the_model_sql_and_its_materialization(self, project, spark, source_table):
        schema = project.test_schema
        models_dir = f"{project.project_root}/models"

        def relations() -> set[str]:
            rows = spark.sql(f"SHOW TABLES IN {schema} LIKE 'noded*'").collect()
            return {row["tableName"] for row in rows}

        write_file(NODE_MODEL.format(cte="counts"), models_dir, "noded.sql")
        run_dbt(["run"])
        assert relations() == {
            "noded",
            "noded__ivm_state",
            "noded__ivm_cte_counts",
            "noded__ivm_cte_counts__ivm_state",
        }
        query = NODE_MODEL.format(cte="counts").replace("{{ source('raw', 'src') }}", "{src}")
        assert_model_matches_query(spark, schema, "noded", query, "src")
        # A live model's nodes are not orphans.
        _, output = run_dbt_and_capture(["run-operation", "ivm_orphans"])
        assert "no orphaned ivm relations" in output

        # The CTE renamed: the model is rebuilt and the old CTE's node dropped.
        write_file(NODE_MODEL.format(cte="per_group"), models_dir, "noded.sql")
        spark.sql(f"INSERT INTO {source_table} VALUES (9, 'new', 1, 1.00)")
        run_dbt(["run"])
        assert relations() == {
            "noded",
            "noded__ivm_state",
            "noded__ivm_cte_per_group",
            "noded__ivm_cte_per_group__ivm_state",
        }
        query = NODE_MODEL.format(cte="per_group").replace("{{ source('raw', 'src') }}", "{src}")
        assert_model_matches_query(spark, schema, "noded", query, "src")

        # Materialized as a table: the node is an orphan of a model that is no ivm model.
        write_file(
            "{{ config(materialized='table') }}\n" + NODE_MODEL.format(cte="per_group"),
            models_dir,
            "noded.sql",
        )
        run_dbt(["run"])
        _, output = run_dbt_and_capture(["run-operation", "ivm_orphans"])
        assert f"view {schema}.noded__ivm_cte_per_group (of {schema}.noded)" in output
        assert f"table {schema}.noded__ivm_cte_per_group__ivm_state (of {schema}.noded)" in output
