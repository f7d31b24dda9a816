"""Property: SUM/AVG over DOUBLEs, STDDEV/VARIANCE, COVAR and CORR equal their query after any changes.

A refresh adds floating-point values in another order than a recomputation,
so the oracle here is the plugin's own `ivm_matches_query` test, run by
`dbt test` after every refresh, comparing DOUBLE columns within a relative
and an absolute tolerance (operations/comparison.py). Values mix magnitudes
(1e-3 to 1e9 + 0.5), negative zero, NaN and both infinities, which no
subtraction could take out of a plain stored sum (rules/floating.py). Every model is
built once and refreshed incrementally from then on.

`TestFloatingPointEdges` checks, exactly, the cases a plain stored sum or a
sum of squares would get wrong.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import ClassVar

import pytest
from dbt.tests.util import run_dbt
from hypothesis import given
from hypothesis import strategies as st

from tests.functional.ivm_checks import cancelling_recomputes, state_builds
from tests.functional.ivm_project import IvmProject, random_change_settings, sql_literal

SOURCE_DDL = (
    "CREATE TABLE {table} (id INT, k INT, g STRING, x DOUBLE, v INT) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
SOURCES_YML = """
sources:
  - name: raw
    schema: "{{ target.schema }}"
    tables: [{name: src}]
"""

STATISTICS_QUERIES = {
    "by_group": (
        "select g, count(*) as n, sum(x) as sx, avg(x) as ax, stddev(x) as sdx, "
        "var_pop(x) as vpx, stddev_pop(v) as sdv, variance(v) as vv from {src} group by g"
    ),
    "overall": (
        "select sum(x) as sx, avg(x) as ax, stddev_samp(x) as sd, var_samp(v) as vv, "
        "count(x) as nx from {src}"
    ),
    # Beside MAX and COUNT(DISTINCT): the pre-aggregation's change path.
    "with_extremes": (
        "select k, sum(x) as sx, max(x) as mx, stddev(x) as sd, count(distinct g) as ng "
        "from {src} group by k"
    ),
    # NaN passes `> 0` in Spark (it sorts above every number): HAVING over a NaN sum.
    "filtered": (
        "select g, stddev(x) as sd, sum(x) as sx from {src} group by g "
        "having count(x) > 1 and sum(x) > 0"
    ),
    # Co-moments of one pair, a DOUBLE with an INT (tests/rules draws more shapes:
    # integral and decimal pairs, one argument in two pairs, a global one).
    "pairs": (
        "select g, covar_pop(x, v) as cp, covar_samp(x, v) as cs, corr(x, v) as r, "
        "count(*) as n from {src} group by g"
    ),
}
# As YAML 1.1 reads floats: with a dot (PyYAML reads `1e-9` as a string, which the test also takes).
TOLERANCES = {"relative_tolerance": "1.0e-9", "absolute_tolerance": "1.0e-6"}


def _schema_yml(names: list[str]) -> str:
    arguments = "".join(f"            {key}: {value}\n" for key, value in TOLERANCES.items())
    tests = "".join(
        f"  - name: {name}\n    data_tests:\n      - ivm_matches_query:\n"
        f"          arguments:\n{arguments}"
        for name in names
    )
    return f"models:\n{tests}"


def model_files(queries: dict[str, str]) -> dict[str, str]:
    files = {"sources.yml": SOURCES_YML, "schema.yml": _schema_yml(list(queries))}
    for name, query in queries.items():
        files[f"{name}.sql"] = query.format(src="{{ source('raw', 'src') }}")
    return files


def double(value: float | None) -> str:
    """A DOUBLE literal Spark reads back as the same value (NaN and infinities included)."""
    if value is None:
        return "NULL"
    if math.isnan(value) or math.isinf(value):
        return f"CAST('{value!r}' AS DOUBLE)".replace("inf", "Infinity").replace("nan", "NaN")
    return f"{value!r}D"


keys = st.one_of(st.none(), st.integers(min_value=0, max_value=3))
groups = st.sampled_from([None, "a", "b"])
doubles = st.sampled_from(
    [None, 0.1, -2.5, 3.75, 1e3, 1e-3, -0.0, 1e9 + 0.5, math.nan, math.inf, -math.inf]
)
integers = st.one_of(st.none(), st.integers(min_value=-3, max_value=3))
rows = st.tuples(keys, groups, doubles, integers)
ids = st.integers(min_value=1, max_value=14)


def _equals(column: str, value: object) -> str:
    return f"{column} IS NULL" if value is None else f"{column} = {sql_literal(value)}"


inserts = st.lists(rows, min_size=1, max_size=5)
updates = st.one_of(
    st.tuples(doubles, ids).map(
        lambda p: f"UPDATE {{src}} SET x = {double(p[0])} WHERE id = {p[1]}"
    ),
    st.tuples(groups, keys).map(
        lambda p: f"UPDATE {{src}} SET g = {sql_literal(p[0])} WHERE {_equals('k', p[1])}"
    ),
)
deletes = st.one_of(
    ids.map(lambda i: f"DELETE FROM {{src}} WHERE id = {i}"),
    keys.map(lambda k: f"DELETE FROM {{src}} WHERE {_equals('k', k)}"),
)
statements = st.one_of(inserts, inserts, updates, deletes)
steps = st.lists(st.lists(statements, min_size=1, max_size=4), min_size=1, max_size=2)

SEED = [(1, "a", 0.1, 1), (1, "a", 0.1, 1), (2, "b", 1e9 + 0.5, None), (None, None, None, None)]


class TestRandomStatistics(IvmProject):
    _ids = itertools.count(1)
    recomputes: ClassVar[Counter[str]] = Counter()

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(STATISTICS_QUERIES)

    @pytest.fixture(scope="class")
    def source(self, project):
        table = f"{project.test_schema}.src"
        project.run_sql(SOURCE_DDL.format(table=table))
        self._insert(project.run_sql, table, SEED)
        run_dbt(["run"])
        return table

    def _insert(self, run, table: str, new_rows: list[tuple]) -> None:
        rendered = ", ".join(
            f"({next(self._ids)}, {sql_literal(k)}, {sql_literal(g)}, {double(x)}, {sql_literal(v)})"
            for k, g, x, v in new_rows
        )
        run(f"INSERT INTO {table} VALUES {rendered}")

    @random_change_settings(default_examples=2)
    @given(steps=steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, source, example_budget, steps
    ):
        if not example_budget.admits_next():
            return
        for statements_before_refresh in example_budget.steps(steps):
            for statement in statements_before_refresh:
                if isinstance(statement, list):
                    self._insert(spark.sql, source, statement)
                else:
                    spark.sql(statement.format(src=source))
            for model, way in cancelling_recomputes(run_dbt(["run"])).items():
                self.recomputes[model] += way == "model"
            # Each model's ivm_matches_query, within TOLERANCES.
            run_dbt(["test"])
        # Built once, then recomputed whole only where a removal would have
        # cancelled a group's moments beside a pre-aggregation (values from 1e-3
        # to 1e9 + 0.5 make cancelling removals common here).
        for model in STATISTICS_QUERIES:
            builds = state_builds(spark, project.test_schema, model)
            assert builds == 1 + self.recomputes[model], f"{model} was rebuilt"


EDGES = {
    "edges": (
        "select g, sum(x) as sx, avg(x) as ax, stddev_samp(x) as sd, var_pop(x) as vp "
        "from {src} group by g"
    ),
    "edge_pairs": "select g, corr(x, v) as r, covar_samp(x, v) as cs from {src} group by g",
}


# In scripts/test-extended only: the README's command ran 29 minutes (2026-12-03, fresh clone, 52 s here); the rules layer keeps the floating-point sums' and moments' cancellation rules (floating_sums, moments_*).
@pytest.mark.extended
class TestFloatingPointEdges(IvmProject):
    """Exact answers where a plain stored sum, or a sum of squares, would be wrong."""

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(EDGES)

    def _values(self, spark, schema: str) -> dict[str, tuple]:
        rows = spark.sql(f"SELECT * FROM {schema}.edges").collect()
        return {row["g"]: (row["sx"], row["ax"], row["sd"], row["vp"]) for row in rows}

    def _pairs(self, spark, schema: str) -> dict[str, tuple]:
        rows = spark.sql(f"SELECT * FROM {schema}.edge_pairs").collect()
        return {row["g"]: (row["r"], row["cs"]) for row in rows}

    def test_what_rounding_and_non_finite_values_leave_behind(self, project, spark):
        table = f"{project.test_schema}.src"
        project.run_sql(SOURCE_DDL.format(table=table))
        project.run_sql(f"INSERT INTO {table} VALUES (1, 0, 'big', 1e17, 0)")
        run_dbt(["run"])
        # 1e17 + 1.0 rounds to 1e17: only a compensated sum remembers the 1.0.
        nan, inf = double(math.nan), double(math.inf)
        project.run_sql(
            f"INSERT INTO {table} VALUES (2, 0, 'big', 1.0D, 0), "
            f"(3, 0, 'nan', {nan}, 0), (4, 0, 'nan', 2.0D, 0), "
            f"(5, 0, 'inf', {inf}, 0), (6, 0, 'inf', -{inf}, 0), (7, 0, 'inf', 3.0D, 0), "
            "(8, 0, 'mean', 1000000001.0D, 0), (9, 0, 'mean', 1000000002.0D, 0), "
            "(10, 0, 'mean', 1000000003.0D, 0), "
            "(11, 0, 'flat', 0.1D, 1), (12, 0, 'flat', 0.1D, 2), (13, 0, 'flat', 1000000000.5D, 3), "
            "(14, 0, 'line', 1.5D, 1), (15, 0, 'line', 3.5D, 2), (16, 0, 'line', 5.5D, 3)"
        )
        run_dbt(["run"])
        pairs = self._pairs(spark, project.test_schema)
        assert math.isclose(pairs["line"][0], 1.0, rel_tol=1e-9)
        assert math.isclose(pairs["flat"][0], math.sqrt(3) / 2, rel_tol=1e-9)
        assert math.isnan(pairs["nan"][0]) and math.isnan(pairs["nan"][1])
        assert pairs["mean"][0] is None  # v is 0 throughout: Spark divides by a zero variance
        values = self._values(spark, project.test_schema)
        assert values["big"][0] == 1e17
        assert all(math.isnan(v) for v in values["nan"][:2] + values["inf"][:2])
        # Values near 1e9 spread by 1: their squares agree in 18 digits, the moments do not.
        assert math.isclose(values["mean"][3], 2 / 3, rel_tol=1e-9)
        assert math.isclose(values["mean"][2], 1.0, rel_tol=1e-9)
        project.run_sql(f"DELETE FROM {table} WHERE id IN (1, 3, 6, 8, 13)")
        # Taking 1e9 + 0.5 out of 'flat' ({0.1, 0.1, 1e9 + 0.5}) would cancel
        # all but the rounding of the big value: 'edges' recomputes that group,
        # 'edge_pairs' (CORR keeps MIN/MAX pre-aggregation rows) the model.
        assert cancelling_recomputes(run_dbt(["run"])) == {
            "edges": "groups",
            "edge_pairs": "model",
        }
        values = self._values(spark, project.test_schema)
        assert values["big"][:2] == (1.0, 1.0)
        assert values["nan"] == (2.0, 2.0, None, 0.0)  # one value: no sample deviation
        assert values["inf"][:2] == (math.inf, math.inf)
        assert math.isnan(values["inf"][3])  # Spark: the variance of an infinity is NaN
        assert math.isclose(values["mean"][3], 0.25, rel_tol=1e-9)
        # x is 0.1 twice once 1e9 + 0.5 is gone: recomputed, the co-moment is 0
        # exactly, and CORR is NULL (MIN = MAX), as Spark's are.
        pairs = self._pairs(spark, project.test_schema)
        assert pairs["flat"] == (None, 0.0)
        assert pairs["nan"] == (None, None)  # one pair left: no sample covariance
        assert state_builds(spark, project.test_schema, "edges") == 1
        assert state_builds(spark, project.test_schema, "edge_pairs") == 2
        run_dbt(["test"])
