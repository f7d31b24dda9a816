"""Property: models over several sources (inner joins, a self-join, a three-way join)
and with MIN/MAX/COUNT(DISTINCT) equal their query after any change sequence.

Every refresh may see changes on every source at once (both sides of a join
changed in one window), updates that move rows across a join's residual filter
or into another group, NULL join keys, duplicate rows and partners that
repeat. After each `dbt run` every model is compared, as a bag, with its query
evaluated with each source at the version the model records for it.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture
from hypothesis import given
from hypothesis import strategies as st

from tests.functional.ivm_checks import (
    assert_built_once,
    assert_models_match_sources,
    latest_version,
    node_models,
)
from tests.functional.ivm_project import (
    JOIN_QUERIES,
    NODE_QUERIES,
    SOURCE_NAMES,
    IvmProject,
    create_join_sources,
    model_files,
    random_change_settings,
    sql_literal,
)

keys = st.one_of(st.none(), st.integers(min_value=0, max_value=3))
groups = st.sampled_from([None, "a", "b"])
names = st.sampled_from([None, "x", "y", "z"])
small = st.one_of(st.none(), st.integers(min_value=-2, max_value=3))
decimals = st.sampled_from([None, Decimal("0.00"), Decimal("1.50"), Decimal("-2.25")])


def _equals(column: str, value: object) -> str:
    return f"{column} IS NULL" if value is None else f"{column} = {sql_literal(value)}"


def _insert(table: str, rows: list[tuple]) -> str:
    values = ", ".join("(" + ", ".join(sql_literal(v) for v in row) + ")" for row in rows)
    return f"INSERT INTO {{{table}}} VALUES {values}"


def _table_changes(table: str, row, columns: dict, where: dict):
    """Insert, update (one column, rows chosen by one column) and delete statements of a table."""
    inserts = st.lists(row, min_size=1, max_size=4).map(lambda rows: _insert(table, rows))
    update_statements = st.sampled_from(sorted(columns)).flatmap(
        lambda column: st.tuples(columns[column], st.sampled_from(sorted(where))).flatmap(
            lambda pair: where[pair[1]].map(
                lambda chosen: (
                    f"UPDATE {{{table}}} SET {column} = {sql_literal(pair[0])} "
                    f"WHERE {_equals(pair[1], chosen)}"
                )
            )
        )
    )
    deletes = st.sampled_from(sorted(where)).flatmap(
        lambda column: where[column].map(
            lambda chosen: f"DELETE FROM {{{table}}} WHERE {_equals(column, chosen)}"
        )
    )
    return st.one_of(inserts, inserts, update_statements, deletes)


src_changes = _table_changes(
    "src",
    st.tuples(keys, groups, small, decimals),
    columns={"k": keys, "g": groups, "v": small, "d": decimals},
    where={"k": keys, "g": groups},
)
dim_changes = _table_changes(
    "dim",
    st.tuples(keys, names, small),
    columns={"k": keys, "name": names, "w": small},
    where={"k": keys, "name": names},
)
tag_changes = _table_changes(
    "tag",
    st.tuples(names, st.sampled_from([None, "X", "Y"])),
    columns={"label": st.sampled_from([None, "X", "Y"]), "name": names},
    where={"name": names},
)
statements = st.one_of(src_changes, src_changes, dim_changes, tag_changes)
# A step is the statements written before one refresh (possibly none).
steps = st.lists(st.lists(statements, min_size=0, max_size=4), min_size=1, max_size=3)


class RandomJoinChanges(IvmProject):
    """Random change sequences over src, dim and tag against the models of `queries`."""

    queries: dict[str, str] = JOIN_QUERIES
    # The sources the oracle reads each model's recorded versions of.
    source_names: tuple[str, ...] = SOURCE_NAMES

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=self.queries)

    @pytest.fixture(scope="class")
    def sources(self, project):
        tables = create_join_sources(project)
        run_dbt(["run"])
        return tables

    def _refresh_and_check(
        self, project, spark, sources: dict[str, str], models: tuple[str, ...] = ()
    ) -> str:
        """One `dbt run` (of `models`, or all), every model checked; its log."""
        _, log = run_dbt_and_capture(["run", "--select", *models] if models else ["run"])
        current = {name: latest_version(spark, table) for name, table in sources.items()}
        queries = {m: q for m, q in self.queries.items() if not models or m in models}
        checked = assert_models_match_sources(
            spark, project.test_schema, queries, list(self.source_names)
        )
        # Built once by the `sources` fixture, then maintained incrementally,
        # and so are the plan nodes of its CTEs and subqueries.
        assert_built_once(spark, project.test_schema, checked)
        for model, check in checked.items():
            assert check.versions, f"{model} reads none of the sources"
            for name, version in check.versions.items():
                assert version == current[name], (
                    f"{model} records {name}@{version}, the source is at {current[name]}"
                )
        return log

    @random_change_settings(default_examples=2)
    @given(steps=steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, sources, example_budget, steps
    ):
        self.check_steps(project, spark, sources, example_budget, steps)

    def check_steps(self, project, spark, sources, example_budget, steps) -> None:
        """Write each step's statements, refresh, check (an example's body, for subclasses too)."""
        if not example_budget.admits_next():
            return
        if example_budget.admitted > 1:
            # Later examples start from empty sources, so none depends on the
            # one before; the first starts from the rows the models were built
            # over (NULL keys, repeated keys), which saves a dbt run.
            for table in sources.values():
                spark.sql(f"DELETE FROM {table}")
            self._refresh_and_check(project, spark, sources)
        for statements_before_refresh in example_budget.steps(steps):
            for statement in statements_before_refresh:
                spark.sql(statement.format(**sources))
            self._refresh_and_check(project, spark, sources)


class TestRandomJoinChanges(RandomJoinChanges):
    # One kept value per group for each MIN and MAX (16 by default): the
    # random sequences then often delete a group's only kept value, whose
    # refresh reads the next ones from the sources, and often add values
    # past 2, which it cuts back (rules/extremes.py).
    @pytest.fixture(scope="class")
    def project_config_update(self):
        return {"models": {"+materialized": "ivm", "+ivm_extreme_values": 1}}

    # In scripts/test-extended only: the README's command ran 29 minutes (2026-12-03, fresh clone, 80 s here); the rules layer keeps bounded extremes cut back and refilled (oracle.RULES_EXTREMES_KEPT).
    @pytest.mark.extended
    def test_extremes_keep_their_value_when_a_refresh_does_not_touch_them(
        self, project, spark, sources
    ):
        # A change that moves the group counts but no MIN/MAX/COUNT(DISTINCT)
        # argument: every recomputed value must stay as it was.
        for table in sources.values():
            spark.sql(f"DELETE FROM {table}")
        extremes = ("extremes", "global_extremes")
        spark.sql(
            f"INSERT INTO {sources['src']} VALUES "
            "(1, 'a', 2, 1.50), (2, 'b', 3, 0.00), (4, 'b', 4, -2.25)"
        )
        self._refresh_and_check(project, spark, sources, extremes)
        spark.sql(f"INSERT INTO {sources['src']} VALUES (3, NULL, NULL, NULL)")
        self._refresh_and_check(project, spark, sources, extremes)
        row = spark.sql(f"SELECT * FROM {project.test_schema}.global_extremes").collect()[0]
        assert (row["mn"], str(row["mx"]), row["ng"], row["n"]) == (2, "1.50", 2, 4)
        # Three values each, more than twice the one kept: global_extremes
        # keeps MIN(v) {2} and MAX(d) {1.50}. Deleting their row leaves both
        # with none, and the refresh reads the next ones from the sources.
        spark.sql(f"DELETE FROM {sources['src']} WHERE v = 2")
        log = self._refresh_and_check(project, spark, sources, extremes)
        assert "took their next values from the sources" in log, log
        row = spark.sql(f"SELECT * FROM {project.test_schema}.global_extremes").collect()[0]
        assert (row["mn"], str(row["mx"]), row["ng"], row["n"]) == (3, "0.00", 1, 3)
        # Each keeps its one next value, as an array on the group row.
        (kept,) = spark.sql(
            "SELECT size(__ivm_kv_a0_min) AS lo, size(__ivm_kv_a1_max) AS hi "
            f"FROM {project.test_schema}.global_extremes__ivm_state "
            "WHERE __ivm_guard IS NULL AND __ivm_slot = 0"
        ).collect()
        assert (kept["lo"], kept["hi"]) == (1, 1), kept
        # The next refresh refills at once, without a MERGE that fails first
        # (strategy.refilled_last), and its models stay equal to their queries.
        spark.sql(f"DELETE FROM {sources['src']} WHERE v = 3")
        log = self._refresh_and_check(project, spark, sources, extremes)
        assert "refilling at once" in log, log
        row = spark.sql(f"SELECT * FROM {project.test_schema}.global_extremes").collect()[0]
        assert (row["mn"], str(row["mx"]), row["n"]) == (4, "-2.25", 2), row


class TestRandomNodeChanges(RandomJoinChanges):
    """CTEs and subqueries that aggregate, dedupe or combine, kept as plan nodes."""

    queries = NODE_QUERIES

    # The random sequences in the extended command only (CONTRIBUTING.md, "Suite time"):
    # tests/rules checks the same rules without plan nodes, and the windows' random
    # class refreshes plan nodes in the README's command.
    @pytest.mark.extended
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, sources, example_budget
    ):
        super().test_models_equal_their_query_after_every_refresh(
            project, spark, sources, example_budget
        )

    def test_every_unmergeable_relation_is_a_plan_node(self, project, spark, sources):
        found = {model: node_models(spark, project.test_schema, model) for model in self.queries}
        assert found == {
            "cte_totals": ["cte_totals__ivm_cte_totals"],
            "group_max_rows": ["group_max_rows__ivm_cte_m"],
            "union_names": [
                "union_names__ivm_cte_names",
                "union_names__ivm_cte_names__ivm_cte_operand_1",
            ],
            "chained": ["chained__ivm_cte_a", "chained__ivm_cte_b"],
        }
