"""Property: WINDOW models equal their query after any change sequence, and a
refresh reads only the touched partitions.

The source has a unique id (never updated), and every ORDER BY that picks
one row among others ends with it, so the query's answer is one bag and a
partition's recomputation must give exactly what a full recomputation gives.
Changes move rows between partitions (updates of k and g), across a model's
WHERE, into and out of the NULL partition, and tie on ts and v. A second
source, `dim` (k repeats, names may be NULL), is joined or tested by EXISTS
in the models whose windows read a join, groups or filtered rows, or sit
under DISTINCT: those inputs are plan nodes (window_inputs.py).
"""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture
from hypothesis import given
from hypothesis import strategies as st

from ivm_compiler.layout import DELETION_VECTORS_PROPERTY
from ivm_compiler.view_classes import window as windows
from tests.functional.ivm_checks import (
    ScanLog,
    assert_built_once,
    assert_model_matches_sources,
    assert_models_match_sources,
    node_models,
    state_builds,
    table_properties,
)
from tests.functional.ivm_project import (
    DIM_DDL,
    IvmProject,
    model_files,
    random_change_settings,
    sql_literal,
)
from tests.functional.test_state_layout import large_sorted_states  # noqa: F401  (a fixture)

SOURCE_DDL = (
    "CREATE TABLE {table} (id INT, k INT, g STRING, ts INT, v DECIMAL(10,2)) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)

WINDOW_QUERIES = {
    # Latest row per key: the filter folded into the ranking (window_filters.py).
    "latest_per_key": (
        "select * from (select *, row_number() over (partition by k order by ts desc, id desc) "
        "as rn from {src}) where rn = 1"
    ),
    # Ranks within a group (ties share a rank), over a WHERE that updates cross.
    "ranked": (
        "select id, g, v, rank() over (partition by g order by v desc) as r, "
        "dense_rank() over (partition by g order by v desc) as dr from {src} "
        "where v is null or v >= 0"
    ),
    # SCD2-style validity ranges and running totals with ROWS frames.
    "in_time": (
        "select id, k, ts as valid_from, lead(ts) over (partition by k order by ts, id) "
        "as valid_to, lag(v, 1) over (partition by k order by ts, id) as prev_v, "
        "sum(v) over (partition by k order by ts, id rows between unbounded preceding and "
        "current row) as running, count(v) over (partition by k order by ts, id rows between "
        "1 preceding and current row) as recent from {src}"
    ),
    # Aggregates over whole partitions that differ: k is common to all of them,
    # and is no output, so the state keeps it as a key column of its own.
    "partition_totals": (
        "select id, g, count(*) over (partition by g, k) as n, sum(v) over (partition by k, g) "
        "as total, avg(v) over (partition by k) as mean, max(ts) over (partition by k) "
        "as last_ts from {src}"
    ),
    # Distributions over each whole partition (g is common to all): NTILE splits
    # tied rows between buckets by position (id breaks ties), PERCENT_RANK and
    # CUME_DIST give ties one value, NTH_VALUE reads a running frame.
    "distribution": (
        "select id, g, ntile(3) over (partition by g order by v, id) as tercile, "
        "percent_rank() over (partition by g order by v) as pr, cume_dist() over "
        "(partition by g, k order by ts) as cd, nth_value(v, 2) over (partition by g "
        "order by ts, id) as second_v from {src}"
    ),
    # Windows over inputs that are not one relation: each input is a plan node
    # (window_inputs.py). The SCD2 dimension built from a join (dim repeats k,
    # so one src row has several joined rows; d.name orders them).
    "history_from_join": (
        "select s.id, s.k, d.name, s.ts as valid_from, lead(s.ts) over (partition by s.k "
        "order by s.ts, s.id, d.name) as valid_to from {src} s join {dim} d on s.k = d.k"
    ),
    # Ranks of a join's groups; HAVING filters groups before the windows.
    "ranked_groups": (
        "select s.g, d.name, sum(s.v) as total, count(*) as n, rank() over (partition by s.g "
        "order by sum(s.v) desc) as r from {src} s join {dim} d on s.k = d.k "
        "group by s.g, d.name having count(*) > 1"
    ),
    # DISTINCT over windows (a node of the windows), through a named WINDOW.
    "distinct_ranks": (
        "select distinct k, dense_rank() over w as gr from {src} window w as (partition by k "
        "order by g)"
    ),
    # A running sum over the rows an EXISTS keeps.
    "running_where_known": (
        "select s.id, s.k, sum(s.v) over (partition by s.k order by s.ts, s.id rows between "
        "unbounded preceding and current row) as running from {src} s "
        "where exists (select 1 from {dim} d where d.k = s.k)"
    ),
}
# The plan nodes of the models over window inputs, by model.
INPUT_NODES = {
    "history_from_join": ["history_from_join__ivm_cte_window_input"],
    "ranked_groups": ["ranked_groups__ivm_cte_window_input"],
    "distinct_ranks": ["distinct_ranks__ivm_cte_window_rows"],
    "running_where_known": ["running_where_known__ivm_cte_window_input"],
}

keys = st.one_of(st.none(), st.integers(min_value=0, max_value=3))
groups = st.sampled_from([None, "a", "b"])
times = st.one_of(st.none(), st.integers(min_value=0, max_value=4))
values = st.sampled_from([None, Decimal("0.00"), Decimal("1.50"), Decimal("-2.25")])
rows = st.tuples(keys, groups, times, values)
ids = st.integers(min_value=1, max_value=12)


def _equals(column: str, value: object) -> str:
    return f"{column} IS NULL" if value is None else f"{column} = {sql_literal(value)}"


# Inserts are rows without ids (each gets a fresh one when it is written);
# updates and deletes are SQL with `{src}` for the source.
inserts = st.lists(rows, min_size=1, max_size=4)
updates = st.sampled_from(["k", "g", "ts", "v"]).flatmap(
    lambda column: st.tuples(
        {"k": keys, "g": groups, "ts": times, "v": values}[column],
        st.one_of(ids.map(lambda i: _equals("id", i)), keys.map(lambda k: _equals("k", k))),
    ).map(lambda p: f"UPDATE {{src}} SET {column} = {sql_literal(p[0])} WHERE {p[1]}")
)
deletes = st.one_of(
    ids.map(lambda i: f"DELETE FROM {{src}} WHERE {_equals('id', i)}"),
    keys.map(lambda k: f"DELETE FROM {{src}} WHERE {_equals('k', k)}"),
    groups.map(lambda g: f"DELETE FROM {{src}} WHERE {_equals('g', g)}"),
)
names = st.sampled_from([None, "x", "y"])
dim_changes = st.one_of(
    st.lists(st.tuples(keys, names), min_size=1, max_size=3).map(
        lambda new: (
            "INSERT INTO {dim} VALUES "
            + ", ".join(f"({sql_literal(k)}, {sql_literal(n)}, 0)" for k, n in new)
        )
    ),
    st.tuples(names, keys).map(
        lambda p: f"UPDATE {{dim}} SET name = {sql_literal(p[0])} WHERE {_equals('k', p[1])}"
    ),
    st.tuples(keys, names).map(
        lambda p: f"UPDATE {{dim}} SET k = {sql_literal(p[0])} WHERE {_equals('name', p[1])}"
    ),
    keys.map(lambda k: f"DELETE FROM {{dim}} WHERE {_equals('k', k)}"),
)
statements = st.one_of(inserts, inserts, updates, deletes, dim_changes)
# One refresh per example (13 refreshes: eight models and five nodes); the
# examples continue on each other's rows, so a run is still a sequence of
# refreshes over a growing history, at a cost the suite can carry.
steps = st.lists(st.lists(statements, min_size=1, max_size=5), min_size=1, max_size=1)

SEED = [(1, "a", 1, Decimal("1.50")), (1, "a", 1, Decimal("1.50")), (None, None, None, None)]


class TestRandomWindowChanges(IvmProject):
    # Fresh ids for inserted rows, across examples (ids are never reused).
    _ids = itertools.count(1)

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=WINDOW_QUERIES)

    @pytest.fixture(scope="class")
    def source(self, project):
        table = f"{project.test_schema}.src"
        project.run_sql(SOURCE_DDL.format(table=table))
        self._insert(project.run_sql, table, SEED)
        dim = f"{project.test_schema}.dim"
        project.run_sql(DIM_DDL.format(table=dim))
        project.run_sql(f"INSERT INTO {dim} VALUES (1, 'x', 0), (1, 'y', 0), (NULL, 'x', 0)")
        run_dbt(["run"])
        return table

    def _insert(self, run, table: str, new_rows: list[tuple]) -> None:
        rendered = ", ".join(
            "(" + ", ".join(sql_literal(v) for v in (next(self._ids), *row)) + ")"
            for row in new_rows
        )
        run(f"INSERT INTO {table} VALUES {rendered}")

    def _refresh_and_check(self, project, spark) -> None:
        run_dbt(["run"])
        checked = assert_models_match_sources(
            spark, project.test_schema, WINDOW_QUERIES, ["src", "dim"]
        )
        # Built once by the `source` fixture, then refreshed partition by partition.
        assert_built_once(spark, project.test_schema, checked)

    @random_change_settings(default_examples=2)
    @given(steps=steps)
    def test_models_equal_their_query_after_every_refresh(
        self, project, spark, source, example_budget, steps
    ):
        if not example_budget.admits_next():
            return
        # Examples continue on the previous one's rows: a reset would cost a refresh.
        for statements_before_refresh in example_budget.steps(steps):
            for statement in statements_before_refresh:
                if isinstance(statement, list):
                    self._insert(spark.sql, source, statement)
                else:
                    spark.sql(statement.format(src=source, dim=f"{project.test_schema}.dim"))
            self._refresh_and_check(project, spark)

    def test_the_dedupe_is_one_window_model_keeping_one_row_per_key(self, project, spark, source):
        # The filter is folded into the ranking (window_filters.py): no plan node, and
        # the state holds each key's latest row, not every source row ranked.
        assert node_models(spark, project.test_schema, "latest_per_key") == []
        # Two versions of one key, so the source has more rows than keys.
        self._insert(spark.sql, source, [(7, "a", 1, None), (7, "b", 2, None)])
        run_dbt(["run", "--select", "latest_per_key"])
        queries = {"latest_per_key": WINDOW_QUERIES["latest_per_key"]}
        assert_models_match_sources(spark, project.test_schema, queries, ["src", "dim"])
        kept = spark.sql(
            f"SELECT COUNT(*) AS n FROM {project.test_schema}.latest_per_key__ivm_state "
            "WHERE __ivm_guard IS NULL"
        ).first()["n"]
        keys, total = spark.sql(
            f"SELECT COUNT(DISTINCT k) + MAX(IF(k IS NULL, 1, 0)), COUNT(*) FROM {source}"
        ).first()
        assert kept == keys < total

    def test_windows_over_other_inputs_read_them_as_nodes(self, project, spark, source):
        for model, nodes in INPUT_NODES.items():
            assert node_models(spark, project.test_schema, model) == nodes


@pytest.mark.usefixtures("large_sorted_states")
class TestRandomWindowChangesOverLargeStates(TestRandomWindowChanges):
    """The same, with every source taken for large and every state given deletion
    vectors: the touched partitions' rows are staged before the MERGE, whose
    source reads the state's rows of those partitions for the ones that are
    gone (emit._with_gone_rows), as on a warehouse."""

    def test_the_states_have_deletion_vectors(self, project, spark, source):
        # What the MERGE's source reads the state through (Delta refuses some
        # such reads: docs/performance.md, the 2026-12-05 failure).
        for model in WINDOW_QUERIES:
            state = f"{project.test_schema}.{model}__ivm_state"
            assert table_properties(spark, state).get(DELETION_VECTORS_PROPERTY) == "true"


# One INSERT per key: each partition of k lives in files of its own.
PARTS = {
    "sources.yml": model_files(queries={})["sources.yml"],
    "per_part.sql": (
        "select id, k, row_number() over (partition by k order by id) as rn, "
        "sum(v) over (partition by k) as total from {{ source('raw', 'src') }}"
    ),
    # No PARTITION BY: recomputed whole on every refresh with changes.
    "whole.sql": (
        "select id, k, row_number() over (order by id) as rn from {{ source('raw', 'src') }}"
    ),
}


class TestWindowRefreshReadsTouchedPartitions(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        return PARTS

    @pytest.fixture(scope="class")
    def source(self, project):
        table = f"{project.test_schema}.src"
        project.run_sql(SOURCE_DDL.format(table=table))
        for k in range(1, 5):
            project.run_sql(
                f"INSERT INTO {table} VALUES ({k * 10}, {k}, 'a', 1, 1.00), "
                f"({k * 10 + 1}, {k}, 'b', 2, 2.00)"
            )
        run_dbt(["run"])
        return table

    def _files(self, spark, table: str, where: str = "true") -> int:
        """Data files of the table's current version holding rows that pass `where`."""
        return spark.sql(
            f"SELECT COUNT(DISTINCT _metadata.file_path) AS n FROM {table} WHERE {where}"
        ).collect()[0]["n"]

    def test_the_merge_reads_only_the_touched_partitions_files(self, project, spark, source):
        spark.sql(f"UPDATE {source} SET v = v + 1 WHERE k = 2")
        touched, total = self._files(spark, source, "k = 2"), self._files(spark, source)
        assert 0 < touched < total
        scans = ScanLog(spark)
        mark = scans.mark()
        run_dbt(["run", "--select", "per_part"])
        merge_scans = [s for s in scans.scans_since(mark, source) if "MERGE" in s.execution]
        # The MERGE's source is the window query at the pinned version, filtered
        # by the touched partition before the windows: Delta skips the files of
        # the other partitions (their min/max statistics exclude k = 2).
        assert merge_scans, "no scan of the source in the MERGE"
        assert all(s.files_read == touched for s in merge_scans), (merge_scans, touched, total)
        assert_model_matches_sources(
            spark,
            project.test_schema,
            "per_part",
            PARTS["per_part.sql"].replace("{{ source('raw', 'src') }}", "{src}"),
            ["src"],
        )
        assert state_builds(spark, project.test_schema, "per_part") == 1

        # The same metric for a model without PARTITION BY: its recomputation
        # reads every file, which is what the partition filter saves.
        mark = scans.mark()
        run_dbt(["run", "--select", "whole"])
        assert max(s.files_read for s in scans.scans_since(mark, source)) == total
        assert_model_matches_sources(
            spark,
            project.test_schema,
            "whole",
            PARTS["whole.sql"].replace("{{ source('raw', 'src') }}", "{src}"),
            ["src"],
        )
        assert state_builds(spark, project.test_schema, "whole") == 2

    def test_more_touched_partitions_than_the_bound_recompute(
        self, project, spark, source, monkeypatch
    ):
        # dbt runs in this process: a bound of 1 makes a change of two partitions too many.
        monkeypatch.setattr(windows, "MAX_TOUCHED_PARTITIONS", 1)
        builds = state_builds(spark, project.test_schema, "per_part")
        spark.sql(f"UPDATE {source} SET v = v + 1 WHERE k IN (1, 3)")
        _, log = run_dbt_and_capture(["run", "--select", "per_part"])
        assert "the change touches more than 1 window partitions" in log
        assert state_builds(spark, project.test_schema, "per_part") == builds + 1
        assert_model_matches_sources(
            spark,
            project.test_schema,
            "per_part",
            PARTS["per_part.sql"].replace("{{ source('raw', 'src') }}", "{src}"),
            ["src"],
        )
