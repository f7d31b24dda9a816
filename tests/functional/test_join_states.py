"""Join states (reverse-join tables, `ivm_join_state`): exact under random changes, kept current.

The models of test_random_joins that join plain sources, plus a three-way
join on ON conditions, all keeping a join state for every input that can
(`ivm_join_state: all`). After every refresh each model equals its query at
the versions it records (the join states stand in for the partner reads of
its MERGE), and each join state holds its source's rows (projected to the
columns the model reads, filtered by the model's conditions on that input
alone, rows with a NULL join key left out) at the model's recorded version.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture

from dbt.adapters.spark_ivm.refresh.writes import StateWrites
from tests.functional.ivm_checks import bag_differences, recorded_state
from tests.functional.ivm_project import JOIN_QUERIES
from tests.functional.test_random_joins import RandomJoinChanges

JOIN_STATE_QUERIES = {
    name: JOIN_QUERIES[name] for name in ("joined_rows", "joined_groups", "self_joined")
} | {
    # Three inputs joined in ON, a filter on one of them (kept in its join state).
    "three_way_on": (
        "select s.g, d.name, t.label, count(*) as n, sum(s.v) as sv from {src} s "
        "join {dim} d on s.k = d.k join {tag} t on d.name = t.name "
        "where t.label is not null group by s.g, d.name, t.label"
    ),
}

# (model, alias) -> (source, the columns the model reads of it, its conditions on it
# alone and its join keys being non-NULL)
EXPECTED_JOIN_STATES = {
    ("joined_rows", "s"): ("src", "k, v", "k is not null"),
    # The subquery in FROM is merged into the model's rows, under its table's name.
    ("joined_rows", "dim"): ("dim", "k, name, w", "(w is null or w > 0) and k is not null"),
    ("joined_groups", "s"): ("src", "k, g, v, d", "k is not null"),
    ("joined_groups", "d"): ("dim", "k, name, w", "k is not null"),
    ("self_joined", "a"): ("src", "k, g, v", "k is not null"),
    ("self_joined", "b"): ("src", "k, g, v", "k is not null"),
    ("three_way_on", "s"): ("src", "k, g, v", "k is not null"),
    ("three_way_on", "d"): ("dim", "k, name", "k is not null and name is not null"),
    ("three_way_on", "t"): ("tag", "name, label", "label is not null and name is not null"),
}


def assert_join_states_hold_their_sources(project, spark) -> None:
    """Every join state equals its source's projection at its model's recorded version."""
    schema = project.test_schema
    pairs = {}
    for (model, alias), (source, columns, condition) in EXPECTED_JOIN_STATES.items():
        table = f"{schema}.{source}"
        version = int(recorded_state(spark, schema, model).sources[table]["version"])
        kept = (
            f"SELECT {columns} FROM {schema}.{model}__ivm_join_{alias} "
            "LATERAL VIEW explode(sequence(1, __ivm_count)) c AS copy "
            "WHERE __ivm_guard IS NULL"
        )
        where = f" WHERE {condition}"
        pairs[f"{model}.{alias}"] = (
            kept,
            f"SELECT {columns} FROM {table} VERSION AS OF {version}{where}",
        )
    differing = [
        f"{name}: {difference}"
        for name, difference in bag_differences(spark, pairs).items()
        if not difference.equal
    ]
    assert not differing, "\n".join(differing)


class TestRandomJoinStateChanges(RandomJoinChanges):
    queries = JOIN_STATE_QUERIES

    @pytest.fixture(scope="class")
    def project_config_update(self):
        # A var, so one test can switch the setting for one run. Merged
        # states: under 'auto' a model without join states keeps a log
        # (log_state.refusal), so switching to none and back would change the
        # state's form, which rebuilds it, and the test is of join states.
        return {
            "models": {
                "+materialized": "ivm",
                "+ivm_join_state": "{{ var('join_state', 'all') }}",
                "+ivm_state_form": "merged",
            }
        }

    def _refresh_and_check(self, project, spark, sources, models=()):
        super()._refresh_and_check(project, spark, sources, models)
        assert_join_states_hold_their_sources(project, spark)

    # The random sequences in the extended command only (CONTRIBUTING.md, "Suite time"):
    # the tests below refresh through the join states in the README's command.
    @pytest.mark.extended
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, sources, example_budget
    ):
        super().test_models_equal_their_query_after_every_refresh(
            project, spark, sources, example_budget
        )

    def test_a_refresh_that_fails_after_bringing_its_join_states_forward_loses_nothing(
        self, project, spark, sources, monkeypatch
    ):
        # The join states commit before the model's MERGE: a failure in between
        # leaves them ahead of the model, and the next refresh must read them
        # at the model's recorded version from their history.
        spark.sql(f"INSERT INTO {sources['src']} VALUES (1, 'b', 2, 0.00), (NULL, 'a', 1, NULL)")
        spark.sql(f"UPDATE {sources['dim']} SET w = 3 WHERE k = 1")

        def fail(*args, **kwargs):
            raise RuntimeError("injected: the model's MERGE did not run")

        monkeypatch.setattr(StateWrites, "_merge", fail)
        run_dbt(["run", "--select", "joined_rows"], expect_pass=False)
        monkeypatch.undo()
        ahead = spark.sql(
            f"DESCRIBE HISTORY {project.test_schema}.joined_rows__ivm_join_s LIMIT 1"
        ).collect()[0]
        assert ahead["operation"] == "MERGE", "the join state was not brought forward"
        self._refresh_and_check(project, spark, sources, ("joined_rows",))

    # In scripts/test-extended: explain's join-state lines and dropping and
    # building them again (79 s of the README command's, 2026-11-29); the test
    # above refreshes through the join states there.
    @pytest.mark.extended
    def test_explain_shows_the_join_states_and_their_upkeep(self, project, spark, sources):
        spark.sql(f"INSERT INTO {sources['dim']} VALUES (3, 'x', 1)")
        _, out = run_dbt_and_capture(
            ["run-operation", "ivm_explain", "--args", "{model: joined_rows}"]
        )
        schema = project.test_schema
        assert (
            f"join state s: (k, v) of {schema}.src where NOT `s`.`k` IS NULL, by (k), "
            f"kept in {schema}.joined_rows__ivm_join_s ("
        ) in out
        assert f"join state dim: (k, name, w) of {schema}.dim where" in out
        written = Path(project.project_root) / "target" / "ivm_explain" / "joined_rows"
        upkeep = (written / "merge_join_state_dim.sql").read_text()
        assert f"MERGE INTO `{schema}`.`joined_rows__ivm_join_dim`" in upkeep
        # Only dim changed: orders' join state needs no upkeep, and the
        # model's MERGE reads src's partners from its join state.
        assert not (written / "merge_join_state_s.sql").exists()
        assert (
            "joined_rows__ivm_join_s` VERSION AS OF" in (written / "merge_changes.sql").read_text()
        )
        self._refresh_and_check(project, spark, sources, ("joined_rows",))

    @pytest.mark.extended
    def test_setting_none_drops_the_join_states_and_all_builds_them_again(
        self, project, spark, sources
    ):
        spark.sql(f"DELETE FROM {sources['src']} WHERE k = 1")
        run_dbt(["run", "--select", "joined_rows", "--vars", "{join_state: none}"])
        tables = {
            row["tableName"]
            for row in spark.sql(
                f"SHOW TABLES IN {project.test_schema} LIKE 'joined_rows*'"
            ).collect()
        }
        assert tables == {"joined_rows", "joined_rows__ivm_state"}  # the view and its state
        spark.sql(f"INSERT INTO {sources['src']} VALUES (1, 'a', 1, 1.50)")
        # Back to 'all': each join state is built at the model's recorded
        # version, then brought forward over the window like any other.
        self._refresh_and_check(project, spark, sources, ("joined_rows",))
