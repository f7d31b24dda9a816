"""refresh/fallback.py and ivm_compiler/row_difference.py: a fallback table written in place.

Without Spark: a scripted runner answers the statements a fallback's refresh
reads (DESCRIBE QUERY, SHOW TBLPROPERTIES, the difference's count) and
records those it runs. The difference's SQL itself runs in Spark in
tests/functional/test_random_handoff.py.
"""

from __future__ import annotations

import logging

import pytest
import sqlglot
from sqlglot import exp

from dbt.adapters.spark_ivm.refresh.fallback import FallbackTable, Written, describe_write
from dbt.adapters.spark_ivm.refresh.handoff import Reader
from ivm_compiler import TableName, row_difference
from ivm_compiler.sql import DIALECT

TABLE = TableName("analytics", "ranked")
SQL = "select k, ntile(2) over (partition by g order by k) as quantile from raw.src"
COLUMNS = [("k", "int"), ("quantile", "int")]
DELTA = {
    "delta.minReaderVersion": "1",
    "delta.enableChangeDataFeed": "true",
    "spark_ivm.query": SQL,
}


class ScriptedRunner:
    def __init__(self, described=COLUMNS, shown=DELTA, counted=(2, 1, 1), size=1_000):
        self.described, self.shown, self.counted = described, shown, counted
        self.size = size
        self.executed: list[str] = []

    def query(self, sql: str):
        if sql.startswith("DESCRIBE QUERY"):
            return ["col_name", "data_type", "comment"], [[n, t, None] for n, t in self.described]
        if sql.startswith("SHOW TBLPROPERTIES"):
            return ["key", "value"], [[k, v] for k, v in self.shown.items()]
        if sql.startswith("SELECT COUNT(*)"):
            return ["a", "b", "c"], [list(self.counted)]
        if sql.startswith("DESCRIBE DETAIL"):
            return ["format", "sizeInBytes"], [["delta", self.size]]
        raise AssertionError(f"unexpected query {sql}")

    def execute(self, sql: str) -> None:
        self.executed.append(sql)


def table(runner: ScriptedRunner, columns=COLUMNS, sql: str = SQL) -> FallbackTable:
    return FallbackTable(
        runner,
        logging.getLogger("test"),
        "model.test.ranked",
        TABLE,
        sql,
        columns=lambda t: list(columns),
    )


def write(runner: ScriptedRunner, **kwargs) -> Written | str:
    return table(runner, **kwargs).write_in_place(["a.reader"], lambda: [Reader("a.reader")])


def test_the_difference_is_staged_counted_merged_and_freed():
    runner = ScriptedRunner()
    written = write(runner)
    assert isinstance(written, Written) and (written.inserted, written.deleted) == (1, 1)
    kept, static, staged, reset, reset_static, merged, *freed = runner.executed
    # Staged with its analyzed plan kept: views re-pointed meanwhile must not
    # make its reads miss the cache and compute it again.
    assert kept == "SET spark.sql.legacy.storeAnalyzedPlanForView=true"
    assert reset == "RESET spark.sql.legacy.storeAnalyzedPlanForView"
    # And planned statically: an adaptive CACHE TABLE holds its cache entry's
    # lock while it runs, and every other thread's UNCACHE waits on it.
    assert static == "SET spark.sql.adaptive.enabled=false"
    assert reset_static == "RESET spark.sql.adaptive.enabled"
    assert staged.startswith("CACHE TABLE `__ivm_staged_") and "NTILE(2)" in staged
    assert merged.startswith("MERGE INTO `analytics`.`ranked`")
    assert freed[0].startswith("UNCACHE TABLE IF EXISTS") and freed[1].startswith("DROP VIEW")
    assert describe_write(written).endswith("(+1 -1 rows, written in place)")


def test_a_difference_of_many_rows_overwrites_the_table_instead_of_merging_it():
    # 12,000 copies differ: past strategy.MIN_RECOMPUTE_ROWS, where a whole-row
    # MERGE would rewrite most files and readers recompute by their estimates.
    runner = ScriptedRunner(counted=(7_000, 6_000, 6_000))
    written = write(runner)
    assert isinstance(written, Written) and not written.chosen.merges
    _, _, staged, _, _, metadata, overwritten, reset, *_ = runner.executed
    assert staged.startswith("CACHE TABLE `__ivm_staged_")
    assert overwritten.startswith("INSERT OVERWRITE TABLE `analytics`.`ranked`")
    # Its commit says how many rows its readers change, so they need not sum it.
    assert metadata.startswith("SET spark.databricks.delta.commitInfo.userMetadata=")
    assert '"estimated_change_rows": 12000' in metadata and '"recomputed": true' in metadata
    assert reset == "RESET spark.databricks.delta.commitInfo.userMetadata"
    assert not any(s.startswith("MERGE") for s in runner.executed)
    assert "12,000 changed rows" in describe_write(written)
    assert describe_write(written).endswith("(+6000 -6000 rows, the table overwritten)")


def test_a_large_table_gets_deletion_vectors_and_its_large_difference_is_merged():
    # 12,000 copies differ in a table of 8 MB: vectors on, then a MERGE, which
    # rewrites no file with them and hands the readers the difference itself.
    runner = ScriptedRunner(counted=(7_000, 6_000, 6_000), size=8 * 1024 * 1024)
    written = write(runner)
    assert isinstance(written, Written) and written.chosen.merges
    _, _, staged, _, _, vectors, merged, *_ = runner.executed
    assert vectors == (
        "ALTER TABLE `analytics`.`ranked` SET TBLPROPERTIES ('delta.enableDeletionVectors'='true')"
    )
    assert staged.startswith("CACHE TABLE `__ivm_staged_")
    assert merged.startswith("MERGE INTO `analytics`.`ranked`")
    assert not any(s.startswith("INSERT OVERWRITE") for s in runner.executed)
    assert "12,000 changed rows into a table with deletion vectors" in describe_write(written)


def test_a_table_with_deletion_vectors_is_merged_without_asking_its_size():
    shown = {**DELTA, "delta.enableDeletionVectors": "true"}
    runner = ScriptedRunner(shown=shown, counted=(7_000, 6_000, 6_000), size=None)
    written = write(runner)
    assert isinstance(written, Written) and written.chosen.merges
    assert not any(s.startswith("ALTER TABLE") for s in runner.executed)


def test_an_upstream_not_yet_published_is_read_at_its_staged_state():
    staged = sqlglot.parse_one("SELECT k, g FROM raw.src__ivm_state VERSION AS OF 4", read=DIALECT)
    runner = ScriptedRunner()
    fallback = table(runner)
    fallback.staged_select = lambda t: staged if t == TableName("raw", "src") else None
    write_sql = fallback.build_sql()
    assert (
        write_sql is not None
        and "FROM (SELECT k, g FROM raw.src__ivm_state VERSION AS OF 4) AS src" in write_sql
    )
    assert table(runner).build_sql() is None  # nothing staged: dbt's own SQL
    fallback.write_in_place(["a.reader"], lambda: [Reader("a.reader")])
    staged_difference = next(s for s in runner.executed if s.startswith("CACHE TABLE"))
    assert "VERSION AS OF 4" in staged_difference  # the difference reads it too


def test_no_row_differing_writes_nothing():
    runner = ScriptedRunner(counted=(0, 0, 0))
    written = write(runner)
    assert isinstance(written, Written) and written.nothing is not None
    assert not any(s.startswith("MERGE") for s in runner.executed)
    assert (
        describe_write(written) == "no row of it differs from its query's, so nothing was written"
    )


def test_its_change_feed_and_query_are_set_first_where_missing():
    runner = ScriptedRunner(shown={"delta.minReaderVersion": "1", "spark_ivm.query": "old"})
    write(runner)
    assert "delta.enableChangeDataFeed" in runner.executed[0]
    assert "'spark_ivm.query'" in runner.executed[1] and "ntile(2)" in runner.executed[1]
    assert runner.executed[4].startswith("CACHE TABLE")


@pytest.mark.parametrize(
    ("runner", "kwargs", "reason"),
    [
        (ScriptedRunner(), {"columns": [("k", "int")]}, "its query's columns are not the table's"),
        (
            ScriptedRunner(described=[("m", "map<string,int>")]),
            {"columns": [("m", "map<string,int>")]},
            "it has a MAP column",
        ),
        (ScriptedRunner(shown={"format": "parquet"}), {}, "it is not a Delta table"),
        (ScriptedRunner(), {"sql": "select (("}, "its SQL does not parse"),
    ],
)
def test_a_table_that_cannot_take_its_difference_is_built_anew(runner, kwargs, reason):
    found = write(runner, **kwargs)
    assert isinstance(found, str) and reason in found
    assert not runner.executed


def test_dbts_spelling_of_types_is_the_querys():
    assert isinstance(
        write(ScriptedRunner(), columns=[("K", "integer"), ("quantile", "int")]), Written
    )


def test_the_merge_deletes_every_old_copy_and_inserts_each_new_one():
    merge = sqlglot.parse_one(row_difference.merge_difference(TABLE, "s", ["k", "q"]), read=DIALECT)
    assert isinstance(merge, exp.Merge)
    on = merge.args["on"].sql(dialect=DIALECT)
    # Only the source's DELETE rows match, NULL-safely on every column.
    assert "`__ivm_d`.`__ivm_action` = 'delete'" in on
    assert on.count("IS NOT DISTINCT FROM") == 2
    whens = [w.sql(dialect=DIALECT) for w in merge.args["whens"].expressions]
    assert whens == [
        "WHEN MATCHED THEN DELETE",
        (
            "WHEN NOT MATCHED AND `__ivm_d`.`__ivm_action` = 'insert' THEN INSERT (`k`, `q`) "
            "VALUES (`__ivm_d`.`k`, `__ivm_d`.`q`)"
        ),
    ]
    source = merge.args["using"].sql(dialect=DIALECT)
    assert "ARRAY_REPEAT('delete', CAST(IF(`__ivm_old` > 0, 1, 0) AS INT))" in source
    assert "ARRAY_REPEAT('insert', CAST(`__ivm_new` AS INT))" in source
