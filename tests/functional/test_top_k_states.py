"""A top-k model's state kept to its best rows (ivm_compiler/rules/top_k_buffer.py), on Spark.

The state of a projection or DISTINCT top-k keeps its rows up to an edge,
not every candidate: here k rows (the fixture sets the kept rows to k),
so rows past the edge, refreshes that leave them out and refills from the
query all happen on a few rows. After random changes each model equals
its query at the version it records; a change that may leave fewer than
k rows recomputes the state, and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture
from hypothesis import given

from ivm_compiler.rules import top_k_buffer
from tests.functional import test_random_changes
from tests.functional.ivm_checks import assert_models_match_sources, latest_version
from tests.functional.ivm_project import (
    IvmProject,
    create_source,
    model_files,
    random_change_settings,
)

QUERIES = {
    "top_rows": "select k, g, v from {src} where v is not null order by v desc, k, g limit 3",
    "top_distinct": "select distinct g, v from {src} order by v desc nulls first, g limit 2",
}


@pytest.fixture(scope="class")
def states_of_k_rows():
    """Each top-k state keeps its k best rows (and those tied with the k-th)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(top_k_buffer, "MIN_ROWS", 0)
        patch.setattr(top_k_buffer, "ROWS_PER_K", 1)
        yield


def _state_rows(spark, schema: str, model: str) -> int:
    return spark.sql(
        f"SELECT COUNT(*) FROM {schema}.{model}__ivm_state WHERE __ivm_guard IS NULL"
    ).first()[0]


@pytest.mark.usefixtures("states_of_k_rows")
class TestTopKStatesOfKRows(IvmProject):
    thrift_slice = False

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=QUERIES)

    @pytest.fixture(scope="class")
    def source_table(self, project):
        rows = ", ".join(f"({k}, 'a', {v}, NULL)" for k, v in ((1, 5), (2, 4), (3, 3), (4, 2)))
        table = create_source(project, rows)
        run_dbt(["run"])
        return table

    def _refresh_and_check(self, project, spark, table: str) -> str:
        _, log = run_dbt_and_capture(["run"])
        checked = assert_models_match_sources(spark, project.test_schema, QUERIES, ["src"])
        current = latest_version(spark, table)
        for model, check in checked.items():
            assert check.versions == {"src": current}, (model, check.versions, current)
        return log

    def test_rows_past_the_edge_are_left_out_and_a_short_state_is_refilled(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        assert _state_rows(spark, schema, "top_rows") == 3
        # Past the edge (v 3): the state does not take it.
        spark.sql(f"INSERT INTO {source_table} VALUES (5, 'a', 1, NULL)")
        log = self._refresh_and_check(project, spark, source_table)
        assert _state_rows(spark, schema, "top_rows") == 3
        assert "recomputing instead of applying" not in log
        # Two of the three kept rows go: one left, so the best three come from the query.
        spark.sql(f"DELETE FROM {source_table} WHERE v >= 4")
        log = self._refresh_and_check(project, spark, source_table)
        assert "the change may leave the state fewer rows than its view shows" in log, log
        assert _state_rows(spark, schema, "top_rows") == 3
        assert sorted(
            row[0] for row in spark.sql(f"SELECT k FROM {schema}.top_rows").collect()
        ) == [3, 4, 5]

    def test_explain_shows_what_the_state_keeps(self, project, source_table):
        _, log = run_dbt_and_capture(
            ["run-operation", "ivm_explain", "--args", "{model: top_rows}"]
        )
        assert "top-k: the state keeps the 3 best rows" in log, log
        written = Path(project.project_root, "target", "ivm_explain", "top_rows")
        assert "__ivm_edge" in (written / "merge_changes.sql").read_text()

    @random_change_settings(default_examples=2)
    @given(steps=test_random_changes.steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, source_table, example_budget, steps
    ):
        if not example_budget.admits_next():
            return
        for statements_before_refresh in example_budget.steps(steps):
            for statement in statements_before_refresh:
                spark.sql(statement.format(table=source_table))
            self._refresh_and_check(project, spark, source_table)
