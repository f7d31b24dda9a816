"""Property: after any sequence of inserts, updates and deletes, every ivm model
equals its query recomputed at the source version it records (as a bag).

Hypothesis draws change batches with NULL keys and values and duplicate rows;
several batches may land between refreshes, and some refreshes see no change.
Each example starts by deleting every source row and refreshing, so it also
covers groups disappearing and the global aggregate over an empty source.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from dbt.tests.util import run_dbt
from hypothesis import given
from hypothesis import strategies as st

from tests.functional.ivm_checks import assert_models_match_sources, latest_version
from tests.functional.ivm_project import (
    QUERIES,
    IvmProject,
    create_source,
    model_files,
    random_change_settings,
    sql_literal,
)

keys = st.one_of(st.none(), st.integers(min_value=0, max_value=5))
groups = st.sampled_from([None, "a", "b", "c"])
values = st.one_of(st.none(), st.integers(min_value=-3, max_value=3))
decimals = st.sampled_from([None, Decimal("0.00"), Decimal("1.50"), Decimal("-2.25")])
rows = st.tuples(keys, groups, values, decimals)


def _key_predicate(key: int | None) -> str:
    return "k IS NULL" if key is None else f"k = {key}"


inserts = st.lists(rows, min_size=1, max_size=6).map(
    lambda batch: (
        "INSERT INTO {table} VALUES "
        + ", ".join("(" + ", ".join(sql_literal(v) for v in row) + ")" for row in batch)
    )
)
updates = st.tuples(keys, st.sampled_from(["v", "g", "d"]), values, groups, decimals).map(
    lambda u: (
        "UPDATE {table} SET "
        + {
            "v": f"v = {sql_literal(u[2])}",
            "g": f"g = {sql_literal(u[3])}",
            "d": f"d = {sql_literal(u[4])}",
        }[u[1]]
        + f" WHERE {_key_predicate(u[0])}"
    )
)
deletes = st.one_of(
    keys.map(lambda k: "DELETE FROM {table} WHERE " + _key_predicate(k)),
    groups.map(
        lambda g: "DELETE FROM {table} WHERE " + ("g IS NULL" if g is None else f"g = '{g}'")
    ),
)
statements = st.one_of(inserts, inserts, updates, deletes)
# A step is the statements written before one refresh (possibly none).
steps = st.lists(st.lists(statements, min_size=0, max_size=3), min_size=1, max_size=3)


class TestRandomChangeSequences(IvmProject):
    # Session mode only in the README's test command (both in the extended one):
    # its SQL does not depend on the connection, and the schema-change matrix,
    # the crash-injection and the concurrent-refresh classes refresh models
    # over Thrift there.
    thrift_slice = False

    @pytest.fixture(scope="class")
    def models(self):
        return model_files()

    @pytest.fixture(scope="class")
    def source_table(self, project):
        table = create_source(project)
        run_dbt(["run"])
        return table

    def _refresh_and_check(self, project, spark, table: str) -> None:
        run_dbt(["run"])
        current = latest_version(spark, table)
        checked = assert_models_match_sources(spark, project.test_schema, QUERIES, ["src"])
        for model, check in checked.items():
            assert check.versions == {"src": current}, (
                f"{model} records {check.versions}, the source is at {current}"
            )

    @random_change_settings(default_examples=2)
    @given(steps=steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, source_table, example_budget, steps
    ):
        if not example_budget.admits_next():
            return
        if example_budget.admitted > 1:
            # Later examples start from an empty source, so none depends on the
            # one before; the first starts from the seed rows the models were
            # built over (duplicates, an all-NULL row), which saves a dbt run.
            spark.sql(f"DELETE FROM {source_table}")
            self._refresh_and_check(project, spark, source_table)
        for statements_before_refresh in example_budget.steps(steps):
            for statement in statements_before_refresh:
                spark.sql(statement.format(table=source_table))
            self._refresh_and_check(project, spark, source_table)
