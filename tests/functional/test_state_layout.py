"""A large state is written sorted by its key with deletion vectors, and a MERGE reads only the files of the change's keys (ivm_compiler/layout.py).

The sources here are tiny; the fixtures make every source count as large
and its states sorted and with deletion vectors (delta.confs.SMALL_SOURCE_BYTES,
SORTED_STATE_BYTES, layout.DELETION_VECTOR_STATE_BYTES)
and every state file hold at most a few
rows (layout.ROWS_PER_FILE), so the layout a warehouse-sized state gets is
checked on a few dozen rows: the files' key ranges, a MERGE that touches
only the files of its keys (Spark's "number of files read", ScanLog) and
marks their changed rows deleted instead of copying the others, and the
oracle after random changes. Delta refuses to scan a table that may have
deletion vectors without data skipping, which the small-source confs turn
off: a state with vectors refreshed once its sources count as small again,
and a source with vectors, keep it on (delta.confs.skips_without_statistics).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from dbt.tests.util import run_dbt, run_dbt_and_capture

from dbt.adapters.spark_ivm.delta import confs
from ivm_compiler import layout
from tests.functional import test_random_changes
from tests.functional.ivm_checks import (
    ScanLog,
    assert_model_matches_sources,
    state_builds,
    table_properties,
)
from tests.functional.ivm_project import IvmProject, create_source, model_files

QUERY = "select k, count(*) as n, sum(v) as sv from {src} group by k"
# Its refreshes read its own state's kept values (the refill of a MIN or MAX).
EXTREMES_QUERY = "select k, min(v) as lo, max(v) as hi from {src} group by k"
# A row per group and per distinct value (COUNT(DISTINCT)'s pre-aggregation).
DISTINCT_QUERY = "select g, count(distinct k) as dk from {src} group by g"
KEYS = range(1, 21)
ROWS_PER_FILE = 4


def merged_by_key(queries: dict[str, str]) -> dict[str, str]:
    """The models of `queries`, `by_key` with a merged state (never a log)."""
    files = model_files(queries=queries)
    return {**files, "by_key.sql": "{{ config(ivm_state_form='merged') }}\n" + files["by_key.sql"]}


def built_over_keys(project) -> str:
    """The source with a row per key in KEYS, the models built over it."""
    table = create_source(project, ", ".join(f"({k}, 'a', {k}, 1.00)" for k in KEYS))
    run_dbt(["run"])
    return table


@pytest.fixture(scope="class")
def large_sorted_states():
    """Every source counts as large, every state gets deletion vectors; a sorted state's files
    hold ROWS_PER_FILE rows at most."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(confs, "SMALL_SOURCE_BYTES", 0)
        patch.setattr(confs, "UNSKIPPED_SOURCE_BYTES", 0)
        patch.setattr(confs, "SORTED_STATE_BYTES", 0)
        patch.setattr(layout, "ROWS_PER_FILE", ROWS_PER_FILE)
        patch.setattr(layout, "DELETION_VECTOR_STATE_BYTES", 0)
        yield


@pytest.mark.usefixtures("large_sorted_states")
class TestLargeStateLayout(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        return merged_by_key({"by_key": QUERY, "extremes_by_key": EXTREMES_QUERY})

    @pytest.fixture(scope="class")
    def source(self, project):
        return built_over_keys(project)

    def _state(self, project) -> str:
        return f"{project.test_schema}.by_key__ivm_state"

    def _file_ranges(self, spark, state: str) -> list[tuple[int, int]]:
        """(lowest, highest) key of each data file of the state's current version."""
        return [
            (row[0], row[1])
            for row in spark.sql(
                f"SELECT MIN(__ivm_g0), MAX(__ivm_g0) FROM {state} "
                "WHERE __ivm_guard IS NULL GROUP BY _metadata.file_path ORDER BY 1"
            ).collect()
        ]

    def _check(self, project, spark) -> None:
        for model, query in (("by_key", QUERY), ("extremes_by_key", EXTREMES_QUERY)):
            assert_model_matches_sources(spark, project.test_schema, model, query, ["src"])
            assert state_builds(spark, project.test_schema, model) == 1

    def test_the_build_writes_sorted_files_with_deletion_vectors(self, project, spark, source):
        properties = {
            row[0]: row[1]
            for row in spark.sql(f"SHOW TBLPROPERTIES {self._state(project)}").collect()
        }
        assert properties.get(layout.DELETION_VECTORS_PROPERTY) == "true", properties
        assert properties.get(layout.SORT_KEY_PROPERTY) == "__ivm_g0", properties
        ranges = self._file_ranges(spark, self._state(project))
        # 20 keys in files of at most 4 rows.
        assert len(ranges) >= len(KEYS) // ROWS_PER_FILE, ranges
        for (_, high), (low, _) in itertools.pairwise(ranges):
            assert high < low, f"files' key ranges overlap: {ranges}"
        self._check(project, spark)

    def test_explain_shows_the_layout(self, project, source):
        _, log = run_dbt_and_capture(["run-operation", "ivm_explain", "--args", "{model: by_key}"])
        assert "layout: sorted by __ivm_g0, with deletion vectors" in log
        written = Path(project.project_root, "target", "ivm_explain", "by_key")
        create = (written / "create_state.sql").read_text()
        assert "'spark_ivm.sort_key'='__ivm_g0'" in create.replace(" ", ""), create

    def test_a_change_at_the_top_reads_and_copies_only_its_files(self, project, spark, source):
        state = self._state(project)
        total = spark.sql(f"SELECT COUNT(DISTINCT _metadata.file_path) FROM {state}").first()[0]
        scans = ScanLog(spark)
        mark = scans.mark()
        # An update of the highest key and a new key above it.
        spark.sql(f"UPDATE {source} SET v = v + 1 WHERE k = {max(KEYS)}")
        spark.sql(f"INSERT INTO {source} VALUES ({max(KEYS) + 1}, 'b', 5, 2.00)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert "the MERGE searches the state's rows with __ivm_g0 in" in log
        merge_scans = [s for s in scans.scans_since(mark, state) if "MERGE" in s.execution]
        assert merge_scans, "no scan of the state in the MERGE"
        # The file of the top key range, and the guard row's and NULL key's file.
        assert max(s.files_read for s in merge_scans) <= 2 < total, (merge_scans, total)
        metrics = spark.sql(f"DESCRIBE HISTORY {state} LIMIT 1").first()["operationMetrics"]
        # The updated key's old row is marked deleted in a vector; no other
        # row of its file is copied.
        assert int(metrics["numTargetDeletionVectorsAdded"]) >= 1, metrics
        assert metrics["numTargetRowsCopied"] == "0", metrics
        self._check(project, spark)

    def test_changes_spread_over_every_key_stay_exact(self, project, spark, source):
        spark.sql(f"UPDATE {source} SET v = NULL WHERE k % 3 = 0")
        spark.sql(f"DELETE FROM {source} WHERE k % 5 = 1")
        spark.sql(f"INSERT INTO {source} VALUES (NULL, 'c', 7, NULL), (0, 'c', 1, 1.00)")
        run_dbt(["run"])
        self._check(project, spark)

    def test_a_compacted_state_refreshes_incrementally(self, project, spark, source):
        # docs/housekeeping.md: OPTIMIZE rewrites the files with vectors and
        # keeps the rows, so the next refresh applies its change.
        state = self._state(project)
        spark.sql(f"OPTIMIZE {state}")
        optimized = spark.sql(f"DESCRIBE HISTORY {state} LIMIT 1").first()
        assert optimized["operation"] == "OPTIMIZE", optimized
        spark.sql(f"UPDATE {source} SET v = v * 3 WHERE k = 4")
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert "model.test.by_key: IVM incremental" in log
        self._check(project, spark)

    def test_states_with_vectors_refresh_once_their_sources_are_small(
        self, project, spark, source, monkeypatch
    ):
        # The sources count as small again: the change runs with the
        # small-source confs, which would turn data skipping off.
        monkeypatch.setattr(confs, "SMALL_SOURCE_BYTES", 16 * 1024 * 1024)
        spark.sql(f"UPDATE {source} SET v = v - 10 WHERE k IN (2, 7)")
        spark.sql(f"DELETE FROM {source} WHERE k = 11")
        _, log = run_dbt_and_capture(["--debug", "run"])
        # The small-source confs, but data skipping kept on.
        assert confs.set_conf(confs.SHUFFLE_PARTITIONS_CONF, "1") in log
        assert confs.set_conf(confs.DATA_SKIPPING_CONF, "false") not in log
        self._check(project, spark)

    def test_states_with_vectors_keep_data_skipping_under_the_unskipped_size(
        self, project, spark, source, monkeypatch
    ):
        # Large sources, but under UNSKIPPED_SOURCE_BYTES in all: a change
        # there would read them without data skipping.
        monkeypatch.setattr(confs, "UNSKIPPED_SOURCE_BYTES", 64 * 1024 * 1024)
        spark.sql(f"UPDATE {source} SET v = v + 4 WHERE k IN (3, 15)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert "model.test.by_key: IVM incremental" in log
        assert confs.set_conf(confs.SHUFFLE_PARTITIONS_CONF, "1") not in log
        assert confs.set_conf(confs.DATA_SKIPPING_CONF, "false") not in log
        self._check(project, spark)


class TestSourceWithDeletionVectors(IvmProject):
    """A small source whose deletes and updates leave deletion vectors in its files."""

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries={"by_key": QUERY, "extremes_by_key": EXTREMES_QUERY})

    @pytest.fixture(scope="class")
    def source(self, project):
        table = create_source(project, ", ".join(f"({k}, 'a', {k}, 1.00)" for k in KEYS))
        project.run_sql(
            f"ALTER TABLE {table} SET TBLPROPERTIES (delta.enableDeletionVectors = true)"
        )
        run_dbt(["run"])
        return table

    def test_changes_written_as_vectors_refresh_exactly(self, project, spark, source):
        spark.sql(f"DELETE FROM {source} WHERE k % 4 = 0")
        spark.sql(f"UPDATE {source} SET v = NULL WHERE k = 5")
        metrics = spark.sql(f"DESCRIBE HISTORY {source} LIMIT 1").first()["operationMetrics"]
        assert int(metrics["numDeletionVectorsAdded"]) >= 1, metrics
        spark.sql(f"INSERT INTO {source} VALUES (5, 'b', 5, NULL), (NULL, NULL, NULL, NULL)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        # The small-source confs, but data skipping kept on.
        assert confs.set_conf(confs.SHUFFLE_PARTITIONS_CONF, "1") in log
        assert confs.set_conf(confs.DATA_SKIPPING_CONF, "false") not in log
        for model, query in (("by_key", QUERY), ("extremes_by_key", EXTREMES_QUERY)):
            assert_model_matches_sources(spark, project.test_schema, model, query, ["src"])
            assert state_builds(spark, project.test_schema, model) == 1


# In scripts/test-extended only: the random sequences of test_random_changes
# again, over sorted states (about 45 s of the README command's worker time,
# over its budget); TestLargeStateLayout keeps the sorted path's oracle
# there, a change at every key included.
@pytest.mark.extended
@pytest.mark.usefixtures("large_sorted_states")
class TestRandomChangesOverSortedStates(test_random_changes.TestRandomChangeSequences):
    """The single-source models after random sequences, every state sorted and merged."""

    @pytest.fixture(scope="class")
    def project_config_update(self):
        return {"models": {"+materialized": "ivm", "+ivm_state_form": "merged"}}


@pytest.fixture(scope="class")
def large_unsorted_states():
    """Every source counts as large, past MERGE_LIST_BYTES, and every state gets
    deletion vectors, but no state is sorted (its sources are under
    delta.confs.SORTED_STATE_BYTES)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(confs, "SMALL_SOURCE_BYTES", 0)
        patch.setattr(confs, "UNSKIPPED_SOURCE_BYTES", 0)
        patch.setattr(confs, "MERGE_LIST_BYTES", 0)
        patch.setattr(layout, "DELETION_VECTOR_STATE_BYTES", 0)
        yield


@pytest.mark.usefixtures("large_unsorted_states")
class TestUnsortedStateMergeWithinListedKeys(IvmProject):
    """A state's MERGE over large sources reads the state within the change's listed keys."""

    @pytest.fixture(scope="class")
    def models(self):
        return merged_by_key({"by_key": QUERY})

    @pytest.fixture(scope="class")
    def source(self, project):
        return built_over_keys(project)

    def test_the_merge_is_bounded_by_the_listed_keys(self, project, spark, source):
        state = f"{project.test_schema}.by_key__ivm_state"
        assert layout.SORT_KEY_PROPERTY not in table_properties(spark, state)
        spark.sql(f"UPDATE {source} SET v = v + 1 WHERE k = 5")
        spark.sql(
            f"INSERT INTO {source} VALUES ({max(KEYS) + 1}, 'b', 5, 2.00), (NULL, 'c', 1, 1.00)"
        )
        _, log = run_dbt_and_capture(["--debug", "run"])
        # Two non-NULL keys listed; the NULL key is searched by IS NULL.
        assert "the MERGE searches the state's rows with __ivm_g0 in 2 listed keys" in log
        merge = next(
            line
            for line in log.splitlines()
            if "MERGE INTO" in line and "by_key__ivm_state" in line
        )
        assert "`__ivm_t`.`__ivm_g0` IN (5, 21)" in merge, merge
        assert_model_matches_sources(spark, project.test_schema, "by_key", QUERY, ["src"])

    def test_more_keys_than_the_probe_lists_merge_unbounded(
        self, project, spark, source, monkeypatch
    ):
        monkeypatch.setattr(layout, "MAX_LISTED_MERGE_KEYS", 1)
        spark.sql(f"UPDATE {source} SET v = v * 2 WHERE k IN (3, 9)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        assert "the MERGE searches the state's rows" not in log
        assert_model_matches_sources(spark, project.test_schema, "by_key", QUERY, ["src"])


@pytest.mark.usefixtures("large_unsorted_states")
class TestUnsortedStateMergeWithinEveryKeysList(IvmProject):
    """A state keyed by more than one column: its MERGE reads the state within each one's list."""

    @pytest.fixture(scope="class")
    def models(self):
        files = model_files(queries={"distinct_by_g": DISTINCT_QUERY})
        merged = "{{ config(ivm_state_form='merged') }}\n"
        return {**files, "distinct_by_g.sql": merged + files["distinct_by_g.sql"]}

    @pytest.fixture(scope="class")
    def source(self, project):
        return built_over_keys(project)

    def test_every_key_column_bounds_the_merge(self, project, spark, source):
        # Every row's group is 'a': its list alone would match the whole state,
        # a row per distinct k. The values' list keeps the MERGE to k = 7 and 8.
        spark.sql(f"UPDATE {source} SET g = 'b' WHERE k IN (7, 8)")
        _, log = run_dbt_and_capture(["--debug", "run"])
        searched = next(line for line in log.splitlines() if "the MERGE searches" in line)
        assert "__ivm_g0 in 2 listed keys" in searched, searched
        assert "__ivm_pv_a0 in 2 listed keys" in searched, searched
        merge = next(
            line
            for line in log.splitlines()
            if "MERGE INTO" in line and "distinct_by_g__ivm_state" in line
        )
        assert "`__ivm_t`.`__ivm_pv_a0` IN (7, 8)" in merge, merge
        assert_model_matches_sources(
            spark, project.test_schema, "distinct_by_g", DISTINCT_QUERY, ["src"]
        )
