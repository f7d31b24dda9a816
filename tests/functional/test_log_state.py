"""ivm_state_form='log' (ivm_compiler/log_state.py) through dbt, on real Spark and Delta.

Every single-source model of the property layer whose state adds up
(projections, DISTINCT, UNION ALL, grouped and global aggregates with
HAVING, COUNT/SUM/AVG over integers and decimals, BOOL_OR/SOME/EVERY), and
an aggregate over a join, kept as a log: after random insert/update/delete
sequences with NULLs and duplicates, each equals its query at its recorded
versions, as a bag, and none was rebuilt. Then: the log is
rewritten once it outgrows its last rewrite; a write guarded by a state
version another write already passed is skipped by Delta and reported as a
concurrent refresh, applying nothing; a model whose state cannot be a log
is refused before anything is written; a refresh starts from the record the
view carries, reading the state's history every fifth time, and a write by
hand between that record and its own commit is found and rebuilt.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture, write_file

from dbt.adapters.spark_ivm.refresh import state_history
from ivm_compiler import log_state
from tests.functional import test_random_changes  # not the class: pytest would run it here too
from tests.functional.ivm_checks import (
    assert_models_match_sources,
    latest_version,
    table_properties,
)
from tests.functional.ivm_project import QUERIES, create_join_sources, model_files

# The property layer's single-source models, and an aggregate over a join.
LOGGED = {
    **{name: query for name, query in QUERIES.items() if name != "top_groups"},
    "joined": (
        "select d.name, count(*) as n, sum(s.v) as sv, sum(s.d) as sd "
        "from {src} s join {dim} d on s.k = d.k group by d.name"
    ),
}
CONFIG = "{{ config(ivm_state_form='log') }}\n"


def history(spark, table: str, limit: int = 1) -> list:
    return spark.sql(f"DESCRIBE HISTORY {table} LIMIT {limit}").collect()


class TestLogState(test_random_changes.TestRandomChangeSequences):
    """The property test of test_random_changes.py over log states; then the log's own cases."""

    @pytest.fixture(scope="class")
    def models(self):
        return {
            name: CONFIG + text if name.endswith(".sql") else text
            for name, text in model_files(queries=LOGGED).items()
        }

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = create_join_sources(project)["src"]
        run_dbt(["run"])
        return table

    def _refresh_and_check(self, project, spark, table: str, models: tuple[str, ...] = ()) -> None:
        """Refresh `models` (default: all) and check them against their queries."""
        run_dbt(["run", *(("--select", *models) if models else ())])
        current = latest_version(spark, table)
        queries = {m: q for m, q in LOGGED.items() if not models or m in models}
        checked = assert_models_match_sources(spark, project.test_schema, queries, ["src", "dim"])
        for model, check in checked.items():
            assert check.versions["src"] == current, (
                f"{model} records {check.versions}, the source is at {current}"
            )
            assert check.builds == 1, f"{model} was rebuilt instead of appended to"

    def test_states_are_logs(self, project, spark, source_table):
        for model in LOGGED:
            state = f"{project.test_schema}.{model}__ivm_state"
            properties = table_properties(spark, state)
            assert properties.get(log_state.STATE_FORM_PROPERTY) == log_state.LOG, model

    def test_a_refresh_appends_and_the_log_is_rewritten_when_it_outgrows(
        self, project, spark, source_table, monkeypatch
    ):
        state = f"{project.test_schema}.grouped__ivm_state"
        dim = f"{project.test_schema}.dim"
        spark.sql(f"INSERT INTO {source_table} VALUES (7, 'z', 3, 1.00), (8, NULL, NULL, 2.00)")
        spark.sql(f"INSERT INTO {dim} VALUES (7, 'x', 5), (8, 'n', NULL)")
        self._refresh_and_check(project, spark, source_table, ("grouped", "joined"))
        newest = history(spark, state)[0]
        assert newest["operation"] == "WRITE"
        assert newest["operationParameters"]["mode"] == "Append"
        # The policy is tests/unit/test_state_history.py's; here the rewrite itself.
        monkeypatch.setattr(state_history.StateHistory, "log_compaction_due", lambda self: True)
        spark.sql(f"UPDATE {source_table} SET v = 9 WHERE k = 7")
        spark.sql(f"DELETE FROM {dim} WHERE k = 1 AND name = 'y'")
        self._refresh_and_check(project, spark, source_table, ("grouped", "joined"))
        newest = history(spark, state)[0]
        assert newest["operation"] == "WRITE"
        assert newest["operationParameters"]["mode"] == "Overwrite"
        rows = spark.sql(f"SELECT * FROM {state} WHERE __ivm_guard IS NULL")
        groups = rows.groupBy("__ivm_g0").count().collect()
        assert all(row["count"] == 1 for row in groups), "a rewritten log holds one row per key"

    def test_a_projections_view_sums_only_the_keys_a_row_removes(
        self, project, spark, source_table, monkeypatch
    ):
        """The view passes most rows through and sums those a negated row's hash bucket names.

        Summing the whole log would shuffle every row at every read; the
        plan broadcasts the negated rows' buckets instead, and no row of the
        log is shuffled to be joined.
        """
        view = f"{project.test_schema}.drops_key"
        state = f"{view}__ivm_state"
        # Kept a log with its negated row: no rewrite sums it away.
        monkeypatch.setattr(state_history.StateHistory, "log_compaction_due", lambda self: False)
        spark.sql(f"INSERT INTO {source_table} VALUES (20, 'w', 4, 1.00), (21, 'w', 4, 1.00)")
        self._refresh_and_check(project, spark, source_table, ("drops_key",))
        spark.sql(f"DELETE FROM {source_table} WHERE k = 20")
        self._refresh_and_check(project, spark, source_table, ("drops_key",))
        negated = spark.sql(
            f"SELECT COUNT(*) AS n FROM {state} WHERE __ivm_guard IS NULL AND __ivm_count < 0"
        ).collect()[0]["n"]
        assert negated >= 1, "the delete appended a row with a negative count"
        plan = spark.sql(f"EXPLAIN SELECT * FROM {view}").collect()[0][0]
        assert "BroadcastHashJoin" in plan and "LeftAnti" in plan and "LeftSemi" in plan, plan
        assert "SortMergeJoin" not in plan, plan
        shown = spark.sql(f"SELECT g, v FROM {view} WHERE g = 'w'").collect()
        assert [(r["g"], r["v"]) for r in shown] == [("w", 4)], "one of the two rows is left"

    def test_a_write_guarded_by_a_passed_version_applies_nothing(
        self, project, spark, source_table, monkeypatch
    ):
        state = f"{project.test_schema}.grouped__ivm_state"
        before = latest_version(spark, state)
        # As if this refresh had read the state before another one appended to it.
        newest = state_history.StateHistory.newest_version
        monkeypatch.setattr(
            state_history.StateHistory,
            "newest_version",
            lambda self: (newest(self) or 1) - 1,
        )
        spark.sql(f"INSERT INTO {source_table} VALUES (9, 'a', 4, 4.00)")
        _, log = run_dbt_and_capture(["run", "--select", "grouped"], expect_pass=False)
        assert "another refresh of this model" in log
        assert latest_version(spark, state) == before, "the skipped write committed"
        monkeypatch.undo()
        self._refresh_and_check(project, spark, source_table, ("grouped",))

    def test_explain_shows_the_append(self, project, source_table):
        run_dbt(["run-operation", "ivm_explain", "--args", "{model: grouped}"])
        written = Path(project.project_root) / "target" / "ivm_explain" / "grouped"
        append = (written / "append_changes.sql").read_text()
        assert "INSERT INTO" in append and "TABLE_CHANGES" in append
        assert not (written / "merge_changes.sql").exists()

    def test_a_state_that_cannot_be_a_log_is_refused(self, project, spark, source_table):
        extremes = "select g, max(v) as mv from {{ source('raw', 'src') }} group by g"
        write_file(CONFIG + extremes, project.project_root, "models", "extremes.sql")
        try:
            _, log = run_dbt_and_capture(["run", "--select", "extremes"], expect_pass=False)
        finally:
            os.remove(os.path.join(project.project_root, "models", "extremes.sql"))
        assert "ivm_state_form='log' cannot keep this model's state" in log
        assert "MIN/MAX" in log
        shown = spark.sql(f"SHOW TABLES IN {project.test_schema}").collect()
        assert "extremes__ivm_state" not in {row["tableName"] for row in shown}

    def test_auto_keeps_a_log_where_it_can_and_merges_the_rest(self, project, spark, source_table):
        auto = "{{ config(ivm_state_form='auto') }}\n"
        models = {
            "auto_counts": "select g, count(*) as n, sum(v) as sv from {src} group by g",
            "auto_extremes": "select g, max(v) as mv from {src} group by g",
        }
        source = "{{ source('raw', 'src') }}"
        for name, query in models.items():
            write_file(
                auto + query.format(src=source), project.project_root, "models", f"{name}.sql"
            )
        try:
            run_dbt(["run", "--select", *models])
            spark.sql(f"INSERT INTO {source_table} VALUES (10, 'a', 6, 1.00), (11, NULL, 2, NULL)")
            spark.sql(f"UPDATE {source_table} SET v = v + 1 WHERE k = 10")
            results = {r.node.name: r for r in run_dbt(["run", "--select", *models])}
        finally:
            for name in models:
                os.remove(os.path.join(project.project_root, "models", f"{name}.sql"))
        forms = {}
        for name in models:
            assert results[name].adapter_response["code"] == "INCREMENTAL", name
            state = f"{project.test_schema}.{name}__ivm_state"
            forms[name] = table_properties(spark, state).get(log_state.STATE_FORM_PROPERTY)
            operation = history(spark, state)[0]["operation"]
            assert operation == ("WRITE" if name == "auto_counts" else "MERGE"), (name, operation)
        assert forms == {"auto_counts": log_state.LOG, "auto_extremes": None}
        checked = assert_models_match_sources(spark, project.test_schema, models, ["src"])
        assert set(checked) == set(models)

    def test_refreshes_start_from_the_views_record_and_read_the_history_every_fifth(
        self, project, spark, source_table
    ):
        read_history = re.compile(r"DESCRIBE HISTORY `[^`]*`\.`grouped__ivm_state`")
        reads = []
        for step in range(state_history.LOG_CHECK_EVERY):
            spark.sql(f"INSERT INTO {source_table} VALUES ({20 + step}, 'a', {step}, 1.00)")
            results, log = run_dbt_and_capture(["--debug", "run", "--select", "grouped"])
            assert results[0].adapter_response["code"] == "INCREMENTAL"
            reads.append(bool(read_history.search(log)))
        # The rewrite policy's counts are in the history only (refresh/state_history.py).
        assert reads.count(True) == 1, reads
        checked = assert_models_match_sources(
            spark, project.test_schema, {"grouped": LOGGED["grouped"]}, ["src", "dim"]
        )
        assert checked["grouped"].builds == 1

    # Last: it rebuilds `grouped`, which the tests above check was never rebuilt.
    def test_a_write_by_hand_after_the_views_record_is_found_and_the_model_rebuilt(
        self, project, spark, source_table
    ):
        schema = project.test_schema
        view, state = f"{schema}.grouped", f"{schema}.grouped__ivm_state"
        # Not the history's turn (LOG_CHECK_EVERY): the refresh starts from the view's record.
        record = json.loads(table_properties(spark, view)[state_history.RECORD_PROPERTY])
        record["unchecked"] = 0
        spark.sql(
            f"ALTER VIEW {view} SET TBLPROPERTIES "
            f"('{state_history.RECORD_PROPERTY}' = '{json.dumps(record)}')"
        )
        # A log row written twice by hand: its partial sums count twice.
        spark.sql(f"INSERT INTO {state} SELECT * FROM {state} WHERE __ivm_guard IS NULL LIMIT 1")
        spark.sql(f"INSERT INTO {source_table} VALUES (40, 'b', 1, 1.00)")
        results, log = run_dbt_and_capture(["--debug", "run", "--select", "grouped"])
        # The append came first; the version it made said something came between.
        appended = re.search(r"INSERT INTO `[^`]*`\.`grouped__ivm_state`", log)
        read = re.search(r"DESCRIBE HISTORY `[^`]*`\.`grouped__ivm_state`", log)
        assert appended and read and appended.start() < read.start()
        assert "written outside dbt after its last refresh (WRITE at version" in log
        assert results[0].adapter_response["code"] == "REBUILD"
        assert_models_match_sources(spark, schema, {"grouped": LOGGED["grouped"]}, ["src", "dim"])
