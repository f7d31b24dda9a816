"""A join's refresh reads its partner only within the key range of the change (key_bounds.py).

The dimension is written one key per INSERT, so none of its files holds two
keys and Delta's min/max statistics can skip the others. A change of the fact
table at one key must make the refresh read only that key's files of the
dimension, and the model must still equal its query.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture

from dbt.adapters.spark_ivm.delta import confs
from ivm_compiler import key_bounds
from tests.functional.ivm_checks import (
    ScanLog,
    assert_model_matches_sources,
    bag_difference,
    state_builds,
)
from tests.functional.ivm_project import DIM_DDL, IvmProject, create_source, model_files

QUERY = (
    "select s.g, d.name, count(*) as n, sum(s.v) as sv "
    "from {src} as s join {dim} as d on s.k = d.k group by s.g, d.name"
)
KEYS = (1, 2, 3, 4)


def files_holding(spark, table: str, where: str = "true") -> int:
    """Data files of the table's current version holding rows that pass `where`."""
    return spark.sql(
        f"SELECT COUNT(DISTINCT _metadata.file_path) FROM {table} WHERE {where}"
    ).collect()[0][0]


def semi_joins_on_read(plan: str, table: str) -> int:
    """The broadcast semi joins of a plan (as the SQL tab formats it) whose streamed side reads `table`.

    Reads directly: down the streamed side only row-wise nodes (no
    aggregate, no exchange) to the table's scan, so the semi join keeps rows
    out of whatever groups or shuffles them above it.
    """
    tree = plan.split("== Physical Plan ==")[-1].split("\n\n")[0]
    nodes = []  # (depth, name) of each node line; a long node's continuation lines are skipped
    for line in tree.splitlines():
        found = re.match(r"^([\s:|+*-]*)([A-Za-z].*?) \(\d+\)$", line)
        if found and (not nodes or found.group(1)):
            nodes.append((len(found.group(1)), found.group(2)))
    row_wise = ("Project", "Filter", "ColumnarToRow")
    count = 0
    for index, (depth, name) in enumerate(nodes):
        if not (name.startswith("BroadcastHashJoin") and "LeftSemi" in name):
            continue
        below = depth
        for child_depth, child in nodes[index + 1 :]:
            if child_depth <= below:
                break  # past the streamed side's first chain: no scan of the table
            if child.startswith("Scan parquet") and child.lower().endswith(
                f"spark_catalog.{table}"
            ):
                count += 1
                break
            if not child.startswith(row_wise):
                break
            below = child_depth
    return count


def refresh_scans(spark, change: str, *tables: str) -> dict[str, list]:
    """Run `change` and a `dbt run`: each table's scans by that refresh (ScanLog)."""
    scans = ScanLog(spark)
    mark = scans.mark()
    spark.sql(change)
    run_dbt(["run"])
    return {table: scans.scans_since(mark, table) for table in tables}


@pytest.fixture(scope="class")
def every_source_large():
    """Every source counted large: Delta's data skipping kept on for these tiny
    sources, and the probes of large sources run (delta.confs.staging)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(confs, "SMALL_SOURCE_BYTES", 0)
        patch.setattr(confs, "UNSKIPPED_SOURCE_BYTES", 0)
        yield


@pytest.mark.usefixtures("every_source_large")
class TestJoinReadsPartnersWithinTheChangesKeys(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        # Merged: the bounds narrow the change query both state forms run.
        files = model_files(queries={"fact_by_name": QUERY})
        merged = "{{ config(ivm_state_form='merged') }}\n"
        return {**files, "fact_by_name.sql": merged + files["fact_by_name.sql"]}

    @pytest.fixture(scope="class")
    def sources(self, project):
        src = create_source(project)
        dim = f"{project.test_schema}.dim"
        project.run_sql(DIM_DDL.format(table=dim))
        for k in KEYS:
            project.run_sql(f"INSERT INTO {dim} VALUES ({k}, 'n{k}', {k}), ({k}, 'm{k}', NULL)")
        run_dbt(["run"])
        return {"src": src, "dim": dim}

    def _refresh_scans(self, scans: ScanLog, mark: int, dim: str) -> list:
        """The dimension's scans by the refresh, which must each read within the change's keys.

        Every scan counts, not only the MERGE's: a sorted state's change rows
        (every state here, with the size threshold at 0) are computed by a
        CACHE TABLE before it (writes.py), and the MERGE then reads the cache.
        """
        return scans.scans_since(mark, dim)

    def _check(self, project, spark) -> None:
        assert_model_matches_sources(
            spark, project.test_schema, "fact_by_name", QUERY, ["src", "dim"]
        )
        assert state_builds(spark, project.test_schema, "fact_by_name") == 1

    def test_a_change_at_one_key_reads_one_file_of_the_partner(self, project, spark, sources):
        # Each INSERT writes its own files (one per task), so no file holds two keys.
        touched, total = (
            files_holding(spark, sources["dim"], "k = 2"),
            files_holding(spark, sources["dim"]),
        )
        assert 0 < touched < total
        scans = ScanLog(spark)
        mark = scans.mark()
        spark.sql(f"INSERT INTO {sources['src']} VALUES (2, 'a', 5, 1.00), (2, 'b', 6, 2.00)")
        run_dbt(["run"])
        refresh_scans = self._refresh_scans(scans, mark, sources["dim"])
        assert refresh_scans, "the refresh never read the dimension"
        assert max(s.files_read for s in refresh_scans) == touched, (refresh_scans, touched, total)
        self._check(project, spark)

    def test_keys_at_both_ends_read_only_their_files_and_null_keys_read_nothing(
        self, project, spark, sources
    ):
        # Keys 1 and 4 span the dimension, but the bounds split at the gap
        # between them (key_bounds.py): the files of keys 2 and 3 are skipped.
        ends = files_holding(spark, sources["dim"], "k IN (1, 4)")
        assert 0 < ends < files_holding(spark, sources["dim"])
        scans = ScanLog(spark)
        mark = scans.mark()
        spark.sql(f"INSERT INTO {sources['src']} VALUES (1, 'a', 1, 1.00), (4, 'c', 2, 1.00)")
        run_dbt(["run"])
        refresh_scans = self._refresh_scans(scans, mark, sources["dim"])
        assert refresh_scans, "the refresh never read the dimension"
        assert max(s.files_read for s in refresh_scans) == ends, (refresh_scans, ends)
        self._check(project, spark)

        # A change whose keys are all NULL meets no dimension row: nothing is read.
        mark = scans.mark()
        spark.sql(f"INSERT INTO {sources['src']} VALUES (NULL, 'a', 1, 1.00)")
        run_dbt(["run"])
        refresh_scans = self._refresh_scans(scans, mark, sources["dim"])
        assert all(s.files_read == 0 for s in refresh_scans), refresh_scans
        self._check(project, spark)

    def test_both_sides_changing_in_one_refresh_stay_exact(self, project, spark, sources):
        spark.sql(f"UPDATE {sources['dim']} SET name = 'renamed' WHERE k = 3")
        spark.sql(f"DELETE FROM {sources['src']} WHERE k = 2 AND g = 'a'")
        spark.sql(f"INSERT INTO {sources['src']} VALUES (3, 'b', 7, 0.50), (NULL, NULL, 1, NULL)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        # Each feed is read by the probe and by two terms: staged once, read
        # from there (writes.StateWrites.staged_feeds).
        staged = next(line for line in log.splitlines() if "change feeds staged once" in line)
        assert sources["src"] in staged and sources["dim"] in staged, staged
        self._check(project, spark)

    def test_a_large_sources_change_keys_are_listed_for_the_partners_rows(
        self, project, spark, sources, monkeypatch
    ):
        # One range: keys 1 and 4 then span the whole dimension, and only the
        # list (every source counts as large here) keeps its rows to theirs.
        monkeypatch.setattr(key_bounds, "MAX_RANGES", 1)
        spark.sql(f"INSERT INTO {sources['src']} VALUES (1, 'a', 3, 1.00), (4, 'c', 4, 1.00)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        probed = next(line for line in log.splitlines() if "join partners read within" in line)
        assert f"{sources['src']}.k in [1, 4], 2 keys listed" in probed, probed
        merge = next(line for line in log.splitlines() if "`d`.`k` IN (1, 4)" in line)
        assert "BETWEEN CAST('1' AS INT) AND CAST('4' AS INT)" in merge, merge
        self._check(project, spark)


# A semi and an anti join: each reads the distinct keys of `dim` (a key relation).
SEMI_QUERIES = {
    "with_dim": "select s.k, s.g, s.v from {src} as s "
    "where exists (select 1 from {dim} as d where d.k = s.k)",
    "without_dim": "select s.k, s.g, s.v from {src} as s "
    "where not exists (select 1 from {dim} as d where d.k = s.k and d.w > 0)",
}


def sources_by_key(project, dim_row: Callable[[int], str | None]) -> dict[str, str]:
    """`src` and `dim` written one key of KEYS per INSERT, so no file holds two keys; then built.

    `dim_row`: dim's row for a key (its VALUES tuple), None for none.
    """
    src = create_source(project, rows="(NULL, NULL, NULL, NULL)")
    dim = f"{project.test_schema}.dim"
    project.run_sql(DIM_DDL.format(table=dim))
    for k in KEYS:
        project.run_sql(f"INSERT INTO {src} VALUES ({k}, 'g{k}', {k}, 1.00)")
        row = dim_row(k)
        if row is not None:
            project.run_sql(f"INSERT INTO {dim} VALUES {row}")
    run_dbt(["run"])
    return {"src": src, "dim": dim}


class TestSemiJoinReadsKeysWithinTheChangesKeys(IvmProject):
    """Both sides of a semi join bounded: the subquery's keys by the outer change, and back.

    Both sources are written one key per INSERT, so no file holds two keys.
    """

    @pytest.fixture(scope="class", autouse=True)
    def data_skipping(self):
        """Every source large: data skipping on, keys listed, key relations read within them."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(confs, "SMALL_SOURCE_BYTES", 0)
            patch.setattr(confs, "UNSKIPPED_SOURCE_BYTES", 0)
            patch.setattr(confs, "KEY_RELATION_LIST_BYTES", 0)
            yield

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=SEMI_QUERIES)

    @pytest.fixture(scope="class")
    def sources(self, project):
        return sources_by_key(project, lambda k: f"({k}, 'n{k}', {k % 2})")

    def _check(self, spark, schema: str) -> None:
        for name, query in SEMI_QUERIES.items():
            assert_model_matches_sources(spark, schema, name, query, ["src", "dim"])
            assert state_builds(spark, schema, name) == 1

    def test_an_outer_change_reads_the_subquerys_keys_within_its_keys(
        self, project, spark, sources
    ):
        touched = files_holding(spark, sources["dim"], "k = 2")
        assert 0 < touched < files_holding(spark, sources["dim"])
        change = f"INSERT INTO {sources['src']} VALUES (2, 'x', 5, 1.00)"
        dim_scans = refresh_scans(spark, change, sources["dim"])[sources["dim"]]
        assert dim_scans, "the refresh never read the subquery's table"
        assert max(s.files_read for s in dim_scans) == touched, (dim_scans, touched)
        self._check(spark, project.test_schema)

    def test_a_subquery_change_reads_both_sides_within_its_keys(self, project, spark, sources):
        # Key 3 gains its first partner of the anti join (w > 0) and another of
        # the semi join: the outer rows are read at key 3's files only, and so
        # are the subquery's own rows counted for the key.
        src_touched = files_holding(spark, sources["src"], "k = 3")
        assert 0 < src_touched < files_holding(spark, sources["src"])
        dim_touched = files_holding(spark, sources["dim"], "k = 3") + 1  # and the new row's
        change = f"INSERT INTO {sources['dim']} VALUES (3, 'again', 5)"
        scans = refresh_scans(spark, change, sources["src"], sources["dim"])
        src_scans = scans[sources["src"]]
        assert src_scans, "the refresh never read the outer query's table"
        assert max(s.files_read for s in src_scans) == src_touched, (src_scans, src_touched)
        dim_scans = [s for s in scans[sources["dim"]] if s.files_read]
        assert dim_scans and max(s.files_read for s in dim_scans) <= dim_touched, dim_scans
        self._check(spark, project.test_schema)

    def test_keys_past_the_list_are_read_from_the_change_by_a_broadcast_semi_join(
        self, project, spark, sources, monkeypatch
    ):
        # No room in the list: the two changed keys are read from the change.
        monkeypatch.setattr(key_bounds, "MAX_LISTED_KEYS", 1)
        scans = ScanLog(spark)
        mark = scans.mark()
        spark.sql(f"INSERT INTO {sources['src']} VALUES (1, 'y', 6, 1.00), (4, 'z', 7, 1.00)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        probed = [line for line in log.splitlines() if "join partners read within" in line]
        assert probed and all("its keys read from the change" in line for line in probed), probed
        # The subquery's keys are read within the outer change's keys: the
        # semi join with the staged change sits on the table's read, below the
        # grouping of its keys. (Only `src` changed: no other semi join reads `dim`.)
        plans = scans.plans_since(mark)
        assert sum(semi_joins_on_read(plan, sources["dim"]) for plan in plans) >= 1, plans
        self._check(spark, project.test_schema)


NOT_IN_QUERIES = {
    "not_in_w": "select s.k, s.g, s.v from {src} as s "
    "where s.k not in (select d.w from {dim} as d where d.name <> 'none')",
}


@pytest.mark.usefixtures("every_source_large")
class TestNotInRelationsTheChangeLeaves(IvmProject):
    """A NOT IN over large sources: its keyless relations left out where the change leaves them.

    "The subquery has a NULL" is read at the pinned version alone while no
    changed subquery row is NULL, and so is "it has rows" while it has more
    rows than the change (changes.with_unchanged_relations).
    """

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=NOT_IN_QUERIES)

    @pytest.fixture(scope="class")
    def sources(self, project):
        # dim's w: 1, 7, 8, NULL-free; key 4 has no dim row yet.
        return sources_by_key(
            project, lambda k: f"({k}, 'n{k}', {(1, 7, 8)[k - 1]})" if k < 4 else None
        )

    def _refresh(self, spark, change: str) -> set[str]:
        """The key relations the refresh named unchanged, after `change`."""
        spark.sql(change)
        _, log = run_dbt_and_capture(["--debug", "run"])
        named = re.findall(r"read at the pinned version alone: ([\w, ]+)", log)
        return {alias.strip() for line in named for alias in line.split(",")}

    def _check(self, spark, schema: str) -> None:
        query = NOT_IN_QUERIES["not_in_w"]
        assert_model_matches_sources(spark, schema, "not_in_w", query, ["src", "dim"])
        assert state_builds(spark, schema, "not_in_w") == 1

    def test_a_change_without_nulls_leaves_both_keyless_relations(self, project, spark, sources):
        # One row in, with a w: no NULL, and three rows now against one changed.
        unchanged = self._refresh(spark, f"INSERT INTO {sources['dim']} VALUES (4, 'n4', 2)")
        assert unchanged >= {"__ivm_semi0_null", "__ivm_semi0_rows"}, unchanged
        self._check(spark, project.test_schema)

    def test_a_null_arriving_and_leaving_changes_has_a_null(self, project, spark, sources):
        # A NULL w hides every row, then its deletion shows them again.
        for change in (
            f"INSERT INTO {sources['dim']} VALUES (5, 'n5', NULL)",
            f"DELETE FROM {sources['dim']} WHERE w IS NULL",
        ):
            unchanged = self._refresh(spark, change)
            assert "__ivm_semi0_null" not in unchanged, (change, unchanged)
            self._check(spark, project.test_schema)

    def test_explain_shows_the_probe_and_writes_nothing(self, project, spark, sources):
        spark.sql(f"INSERT INTO {sources['dim']} VALUES (6, 'n6', 9)")
        state = f"{project.test_schema}.not_in_w__ivm_state"
        before = spark.sql(f"DESCRIBE HISTORY {state} LIMIT 1").first()["version"]
        _, log = run_dbt_and_capture(
            ["run-operation", "ivm_explain", "--args", "{model: not_in_w}"]
        )
        assert "probe_unchanged_relations" in log, log[-2000:]
        assert spark.sql(f"DESCRIBE HISTORY {state} LIMIT 1").first()["version"] == before


@pytest.mark.usefixtures("every_source_large")
class TestNotInOverALogUpstream(IvmProject):
    """A NOT IN whose subquery reads an ivm model kept as a log (ivm_state_form='log').

    Whether "it has rows" changed is asked of the log summed whole, each
    copy capped at the change's size plus one (reads.counted_up_to), not
    of the log summed per every column through its view.
    """

    QUERY = (
        "select s.k, s.g, s.v from {src} as s "
        "where s.k not in (select d.w from {dim} as d where d.name <> 'none')"
    )

    @pytest.fixture(scope="class")
    def models(self):
        log = "{{ config(ivm_state_form='log') }}\n"
        return {
            **model_files(queries={}),
            "dim_log.sql": log + "select d.k, d.name, d.w from {{ source('raw', 'dim') }} as d",
            "not_in_log.sql": self.QUERY.format(
                src="{{ source('raw', 'src') }}", dim="{{ ref('dim_log') }}"
            ),
        }

    @pytest.fixture(scope="class")
    def sources(self, project):
        # dim's w: 1, 7, 8; key 4 has no dim row yet.
        return sources_by_key(
            project, lambda k: f"({k}, 'n{k}', {(1, 7, 8)[k - 1]})" if k < 4 else None
        )

    def _refresh(self, spark, project, change: str) -> tuple[set[str], str]:
        """The key relations the refresh named unchanged after `change`, and its log."""
        spark.sql(change)
        _, log = run_dbt_and_capture(["--debug", "run"])
        named = re.findall(r"read at the pinned version alone: ([\w, ]+)", log)
        schema = project.test_schema
        query = self.QUERY.format(src=f"{schema}.src", dim=f"{schema}.dim_log")
        difference = bag_difference(spark, f"SELECT * FROM {schema}.not_in_log", query)
        assert difference.equal, f"not_in_log differs from its query: {difference}"
        return {alias.strip() for line in named for alias in line.split(",")}, log

    def test_has_rows_is_counted_from_the_log_summed_whole(self, project, spark, sources):
        unchanged, log = self._refresh(
            spark, project, f"INSERT INTO {sources['dim']} VALUES (4, 'n4', 2)"
        )
        assert "__ivm_semi0_rows" in unchanged, unchanged
        assert "SEQUENCE(1, LEAST(`__ivm_count`, 2))" in log, "the presence probe was not capped"

    def test_rows_falling_to_the_changes_size_are_read_again(self, project, spark, sources):
        # Three rows go, one is left: no more rows than the change, so "has
        # rows" is read with its change; then the last goes and it turns.
        for change in (
            f"DELETE FROM {sources['dim']} WHERE k >= 2",
            f"DELETE FROM {sources['dim']}",
        ):
            unchanged, _ = self._refresh(spark, project, change)
            assert "__ivm_semi0_rows" not in unchanged, (change, unchanged)
