"""Two refreshes of one model at once: the change must be applied once, the loser stop cleanly.

Two dbt invocations that refresh the same model both read the same recorded
state and compute the same change. The test makes that happen
deterministically: just before this run's MERGE, the same MERGE is committed
as if by the other invocation, then this run's MERGE goes ahead. It must
apply nothing and say so: every MERGE checks the state's guard row still
holds the refresh id this run read, and moves it (emit.Guard).
"""

from __future__ import annotations

from dbt.tests.util import run_dbt, run_dbt_and_capture

from dbt.adapters.spark_ivm.impl import _AdapterRunner
from tests.functional.ivm_checks import assert_model_matches_query, latest_version, state_builds
from tests.functional.ivm_project import QUERIES, OneSourceProject


class TestConcurrentRefresh(OneSourceProject):
    # In the Thrift slice of the README's test command: the guard's error reaches the plugin wrapped
    # by the Thrift server.
    thrift_slice = True

    model_names = ("grouped",)

    def test_the_second_refresh_of_the_same_change_applies_nothing(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        state = f"{schema}.grouped__ivm_state"
        run_dbt(["run"])
        spark.sql(f"INSERT INTO {source_table} VALUES (5, 'e', 5, 5.00), (1, 'a', 2, NULL)")
        spark.sql(f"DELETE FROM {source_table} WHERE k IS NULL")
        before = latest_version(spark, state)

        original = _AdapterRunner.query
        raced = []

        def query(self, sql):
            if sql.startswith("MERGE") and not raced:
                raced.append(original(self, sql))  # the other invocation commits first
            return original(self, sql)

        _AdapterRunner.query = query
        try:
            results, output = run_dbt_and_capture(["run"], expect_pass=False)
        finally:
            _AdapterRunner.query = original
        assert raced, "the injected MERGE did not run"
        assert "another refresh of this model" in output
        assert "applied nothing" in output
        # One MERGE commit, not two: the change is in the state exactly once.
        assert latest_version(spark, state) == before + 1
        assert state_builds(spark, schema, "grouped") == 1
        # The view still shows the state before (the failed run published nothing);
        # the next run publishes the committed state without applying anything twice.
        results = run_dbt(["run"])
        assert str(results[0].adapter_response.get("code")) == "NO_CHANGE"
        assert latest_version(spark, state) == before + 1
        assert_model_matches_query(spark, schema, "grouped", QUERIES["grouped"], "src")
