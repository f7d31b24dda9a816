"""ivm_strategy through dbt: auto applies small changes and recomputes large ones.

The choice is made from the source's commit metrics and the model's refresh
history (kept on its view); whichever way a refresh goes, the model must
equal its query at the pinned version.
"""

from __future__ import annotations

import json

import pytest
from dbt.tests.util import run_dbt

from dbt.adapters.spark_ivm.strategy import HISTORY_PROPERTY, MIN_RECOMPUTE_ROWS
from tests.conftest import THRIFT
from tests.functional.ivm_checks import assert_model_matches_query, state_builds, table_properties
from tests.functional.ivm_project import QUERIES, OneSourceProject, model_files


def _actions(results) -> dict[str, str]:
    return {r.node.name: str((r.adapter_response or {}).get("code")) for r in results}


def _history(spark, schema: str, model: str) -> list[dict]:
    return json.loads(table_properties(spark, f"{schema}.{model}")[HISTORY_PROPERTY])


class TestStrategy(OneSourceProject):
    # Over Thrift only in the README's test command (both in the extended one):
    # the refresh history is a view property, rendered differently over
    # Thrift, and the strategy's decisions are the same in both.
    thrift_slice = THRIFT

    @pytest.fixture(scope="class")
    def models(self):
        files = model_files(["grouped"])
        files["always_recomputed.sql"] = "{{ config(ivm_strategy='recompute') }}\n" + QUERIES[
            "grouped"
        ].format(src="{{ source('raw', 'src') }}")
        return files

    def test_auto_applies_small_changes_and_recomputes_a_large_one(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        run_dbt(["run"])
        assert [r["way"] for r in _history(spark, schema, "grouped")] == ["recompute"]

        spark.sql(f"INSERT INTO {source_table} VALUES (2, 'b', 5, NULL), (1, 'a', 1, 1.50)")
        spark.sql(f"UPDATE {source_table} SET v = 7 WHERE k = 2")
        actions = _actions(run_dbt(["run"]))
        assert actions == {"grouped": "INCREMENTAL", "always_recomputed": "RECOMPUTE"}
        history = _history(spark, schema, "grouped")
        assert [r["way"] for r in history] == ["recompute", "incremental"]
        # Two inserted rows and one update (a pre- and a post-image).
        assert history[-1]["changed_rows"] == 4
        assert all(r["seconds"] > 0 and r["source_bytes"] > 0 for r in history)
        for model in ("grouped", "always_recomputed"):
            assert_model_matches_query(spark, schema, model, QUERIES["grouped"], "src")
        assert state_builds(spark, schema, "grouped") == 1

        # Many times the source's rows at once: recomputing is estimated cheaper.
        rows = 3 * MIN_RECOMPUTE_ROWS
        spark.sql(
            f"INSERT INTO {source_table} "
            f"SELECT id % 50, concat('g', id % 7), id, CAST(id % 100 AS DECIMAL(10,2)) "
            f"FROM range({rows})"
        )
        actions = _actions(run_dbt(["run"]))
        assert actions["grouped"] == "RECOMPUTE", actions
        assert [r["way"] for r in _history(spark, schema, "grouped")][-1] == "recompute"
        assert state_builds(spark, schema, "grouped") == 2
        for model in ("grouped", "always_recomputed"):
            assert_model_matches_query(spark, schema, model, QUERIES["grouped"], "src")

        # And a small change after it is applied again.
        spark.sql(f"DELETE FROM {source_table} WHERE k = 2")
        actions = _actions(run_dbt(["run"]))
        assert actions["grouped"] == "INCREMENTAL", actions
        assert_model_matches_query(spark, schema, "grouped", QUERIES["grouped"], "src")
