"""Two refreshes of one model at once: the change must be applied once, the loser stop cleanly.

Two dbt invocations that refresh the same model both read the same recorded
state and compute the same change. The test makes that happen
deterministically: just before this run's write to a state, the same write
is committed as if by the other invocation, then this run's goes ahead. It
must apply nothing and say so, in both state forms: a merged state's MERGE
checks the state's guard row still holds the refresh id this run read, and
moves it (emit.Guard); a log state's INSERT carries Delta's transaction id
with the state version this run read, which the first write passed
(log_state.py).

A refresh usually starts from the record its view carries, not the state's
history (refresh/state_history.py): a write refused there (a log's skipped by
Delta, a MERGE failing its guard) may mean another refresh committed long
before (a group member never published), so the refresh goes on from the
history, where the other write is found and nothing is applied twice.
"""

from __future__ import annotations

import contextlib

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture

from dbt.adapters.spark_ivm.delta.confs import forget_last_commit
from dbt.adapters.spark_ivm.impl import _AdapterRunner
from dbt.adapters.spark_ivm.refresh.state_history import RECORD_PROPERTY
from ivm_compiler import log_state
from tests.functional.ivm_checks import (
    assert_model_matches_query,
    latest_version,
    state_builds,
    state_written,
    table_properties,
)
from tests.functional.ivm_project import QUERIES, OneSourceProject, model_files

# The same query twice: as a log (ivm_state_form's default, 'auto') and merged.
FORMS = {"grouped": log_state.LOG, "grouped_merged": "merged"}


class TestConcurrentRefresh(OneSourceProject):
    # In the Thrift slice of the README's test command: the guard's error reaches the plugin wrapped
    # by the Thrift server.
    thrift_slice = True

    @pytest.fixture(scope="class")
    def models(self):
        files = model_files(["grouped"])
        merged = "{{ config(ivm_state_form='merged') }}\n"
        return {**files, "grouped_merged.sql": merged + files["grouped.sql"]}

    def test_the_second_refresh_of_the_same_change_applies_nothing(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        states = {model: f"{schema}.{model}__ivm_state" for model in FORMS}
        run_dbt(["run"])
        for model, form in FORMS.items():
            shown = table_properties(spark, states[model])
            assert shown.get(log_state.STATE_FORM_PROPERTY, "merged") == form, model
        # Without their views' records, the refreshes read the states' histories.
        for model in FORMS:
            spark.sql(f"ALTER VIEW {schema}.{model} UNSET TBLPROPERTIES ('{RECORD_PROPERTY}')")
        spark.sql(f"INSERT INTO {source_table} VALUES (5, 'e', 5, 5.00), (1, 'a', 2, NULL)")
        spark.sql(f"DELETE FROM {source_table} WHERE k IS NULL")
        before = {model: latest_version(spark, state) for model, state in states.items()}

        with racing(set(FORMS)) as raced:
            results, output = run_dbt_and_capture(["run"], expect_pass=False)
        assert set(raced) == set(FORMS), f"the injected writes ran for {set(raced)} only"
        assert output.count("another refresh of this model") >= len(FORMS), output
        assert "applied nothing" in output
        for model, state in states.items():
            # One commit, not two: the change is in the state exactly once.
            assert latest_version(spark, state) == before[model] + 1, model
            assert state_builds(spark, schema, model) == 1, model
        # The views still show the states before (the failed run published
        # nothing); the next run publishes the committed states without
        # applying anything twice.
        results = run_dbt(["run"])
        for result in results:
            assert str(result.adapter_response.get("code")) == "NO_CHANGE", result.node.name
        for model, state in states.items():
            assert latest_version(spark, state) == before[model] + 1, model
            assert_model_matches_query(spark, schema, model, QUERIES["grouped"], "src")

    def test_a_write_refused_on_the_views_record_goes_on_from_the_history(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        states = {model: f"{schema}.{model}__ivm_state" for model in FORMS}
        for model in FORMS:
            assert RECORD_PROPERTY in table_properties(spark, f"{schema}.{model}"), model
        spark.sql(f"UPDATE {source_table} SET v = v + 10 WHERE k = 5")
        before = {model: latest_version(spark, state) for model, state in states.items()}
        with racing(set(FORMS)) as raced:
            results, output = run_dbt_and_capture(["--debug", "run"])
        assert set(raced) == set(FORMS)
        assert output.count("reading the state's history") == len(FORMS), output
        for result in results:
            # The raced write holds the change; this run found it and applied nothing more.
            assert str(result.adapter_response.get("code")) == "NO_CHANGE", result.node.name
        for model, state in states.items():
            assert latest_version(spark, state) == before[model] + 1, model
            shown = table_properties(spark, f"{schema}.{model}")
            assert int(shown["spark_ivm.state_version"]) == before[model] + 1, model
            assert_model_matches_query(spark, schema, model, QUERIES["grouped"], "src")


@contextlib.contextmanager
def racing(models: set[str]):
    """Commit each of `models`' first state write once more just before this run's own.

    As the other invocation would, in a session of its own: this session's
    last commit stays unset. Yields the models raced so far. A write runs
    as a query where its caller reads its answer (a MERGE's counts) and as
    a statement otherwise (a log's INSERT; writes.py): both are raced.
    """
    original_query, original_execute = _AdapterRunner.query, _AdapterRunner.execute
    raced: dict[str, object] = {}

    def race(runner: _AdapterRunner, sql: str, run) -> None:
        model = state_written(sql)
        if model in models and model not in raced:
            raced[model] = run(runner, sql)
            original_execute(runner, forget_last_commit())

    def query(self, sql):
        race(self, sql, original_query)
        return original_query(self, sql)

    def execute(self, sql):
        race(self, sql, original_execute)
        return original_execute(self, sql)

    _AdapterRunner.query, _AdapterRunner.execute = query, execute
    try:
        yield raced
    finally:
        _AdapterRunner.query, _AdapterRunner.execute = original_query, original_execute
