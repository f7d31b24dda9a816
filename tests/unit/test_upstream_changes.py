"""An upstream ivm model's change as a reader reads it (reads.signed_changes), without Spark.

And an overwritten relation's summed change, staged (reads.stage_net_change);
and a projection kept as a log, whose change rows carry signed counts.
"""

from __future__ import annotations

import dataclasses

import pytest
from sqlglot import exp, parse_one

from ivm_compiler import TableName, compile_model, emit, log_state, names, reads
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.reads import (
    CHANGE_TYPE,
    VersionRange,
    signed_changes,
    stage_net_change,
    table_at_version,
)
from tests.unit import golden
from tests.unit.test_log_state import FIXTURES as LOG_FIXTURES

STATE = TableName("shop", "up__ivm_state")
# A view over a counted state: one row per unit of __ivm_count, the guard row left out.
VIEW = parse_one(
    "SELECT g, sv FROM shop.up__ivm_state "
    "LATERAL VIEW EXPLODE(ARRAY_REPEAT(1, __ivm_count)) AS c WHERE __ivm_guard IS NULL",
    read="spark",
)
UPSTREAM = UpstreamModel(state=STATE, view=VIEW)


def _changes(versions: VersionRange) -> exp.Expr:
    return signed_changes(TableName("shop", "up"), versions, "up", UPSTREAM)


def test_a_range_without_an_overwrite_reads_the_change_feed_row_by_row():
    sql = _changes(VersionRange(2, 4)).sql("spark")
    assert "TABLE_CHANGES('`shop`.`up__ivm_state`', 3, 4)" in sql
    assert names.NET_SIGN not in sql


def test_an_overwritten_range_is_read_net_per_row():
    read = _changes(dataclasses.replace(VersionRange(2, 4), overwritten=True))
    sql = read.sql("spark")
    assert "TABLE_CHANGES('`shop`.`up__ivm_state`', 3, 4)" in sql
    # Summed per view row (the view's columns), a row the overwrite left as it
    # was cancels; the rest are unit rows again, with the columns and the sign
    # a reader takes from any change.
    assert f"GROUP BY `g`, `sv` HAVING SUM(`{names.SIGN}`) <> 0" in sql
    outer = read.this
    assert [p.alias_or_name for p in outer.expressions] == ["g", "sv", names.SIGN]


def test_a_staged_sum_is_read_as_it_is():
    """Once staged (reads.stage_net_change), every read of the change reads the stage."""
    staged = VersionRange(2, 4, staged="__ivm_staged_x_net_0", overwritten=True)
    sql = _changes(staged).sql("spark")
    assert sql == "(SELECT * FROM `__ivm_staged_x_net_0`) AS `up`"


def test_a_source_overwritten_is_staged_summed_with_a_change_type():
    """A source's sum keeps the shape of its change feed, so the staged-feed read applies."""
    source = TableName("raw", "orders")
    versions = VersionRange(2, 4, overwritten=True)
    cache = stage_net_change(source, versions, "s", columns=["id", "amount"])
    rows = cache.expression
    assert [p.alias_or_name for p in rows.expressions] == ["id", "amount", CHANGE_TYPE]
    assert "GROUP BY `id`, `amount` HAVING" in cache.sql("spark")
    read = signed_changes(source, dataclasses.replace(versions, staged="s"), "o").sql("spark")
    assert "FROM `s`" in read and "TABLE_CHANGES" not in read


def _log_upstream(sql: str, describe: str) -> UpstreamModel:
    """A projection kept as a log, as its reader finds it: its view over the state, summed."""
    catalog = golden.FakeCatalog(
        LOG_FIXTURES.sources, sql, golden.split_columns(describe), golden.split_columns("")
    )
    plan = log_state.with_log(compile_model(golden.MODEL, sql, catalog))
    view = log_state.summed_view(emit.view_query(plan, golden.STATE, 7), golden.STATE)
    return UpstreamModel(state=golden.STATE, view=view)


LOG_UPSTREAM = "SELECT id, customer FROM shop.orders WHERE qty > 1"


def test_a_log_upstreams_change_is_each_rows_signed_count():
    """An appended log row with count c is c rows of the model; its sign that of c's."""
    upstream = _log_upstream(LOG_UPSTREAM, "id int, customer string")
    read = signed_changes(TableName("analytics", "my_model"), VersionRange(7, 9), "up", upstream)
    sql = read.sql("spark")
    assert "TABLE_CHANGES('`analytics`.`my_model__ivm_state`', 8, 9)" in sql
    # Not the view's consolidation: the change rows are read one by one.
    assert "GROUP BY" not in sql and "SUM(" not in sql
    signed = f"(IF({CHANGE_TYPE} IN ('insert', 'update_postimage'), 1, -1)) * `{names.COUNT}`"
    assert f"ABS({signed}) AS `{names.COUNT}`" in sql
    assert f"CAST(SIGN({signed}) AS INT) AS `{names.SIGN}`" in sql
    # The reader gets the model's columns and the sign, as from a merged state.
    assert [p.alias_or_name for p in read.this.expressions] == ["id", "customer", names.SIGN]


def test_a_log_upstream_overwritten_is_summed_per_row():
    upstream = _log_upstream(LOG_UPSTREAM, "id int, customer string")
    versions = VersionRange(7, 9, overwritten=True)
    sql = signed_changes(TableName("analytics", "my_model"), versions, "up", upstream).sql("spark")
    assert f"GROUP BY `id`, `customer` HAVING SUM(`{names.SIGN}`) <> 0" in sql


def test_a_log_upstream_at_a_version_is_read_consolidated():
    upstream = _log_upstream(LOG_UPSTREAM, "id int, customer string")
    sql = table_at_version(TableName("analytics", "my_model"), 9, "up", upstream).sql("spark")
    assert "`analytics`.`my_model__ivm_state` VERSION AS OF 9" in sql
    assert f"HAVING SUM(`{names.COUNT}`) <> 0" in sql


def test_a_log_upstream_at_a_version_written_whole_is_read_without_summing():
    # Its build or rewrite holds each row once with a positive count: each row
    # repeated by its count is the bag the sums give (UpstreamModel.unsummed_version).
    upstream = dataclasses.replace(
        _log_upstream(LOG_UPSTREAM, "id int, customer string"), unsummed_version=9
    )
    sql = table_at_version(TableName("analytics", "my_model"), 9, "up", upstream).sql("spark")
    assert "`analytics`.`my_model__ivm_state` VERSION AS OF 9" in sql
    assert "GROUP BY" not in sql and "SUM(" not in sql
    # Still without the guard row, each row repeated by its count.
    assert f"WHERE `{names.GUARD}` IS NULL" in sql and "EXPLODE(SEQUENCE(1" in sql
    # At any other version its appended rows may cancel: summed as before.
    sql = table_at_version(TableName("analytics", "my_model"), 10, "up", upstream).sql("spark")
    assert f"HAVING SUM(`{names.COUNT}`) <> 0" in sql


def test_a_log_of_partial_rows_is_not_read_as_a_change():
    """A DISTINCT's log row is a count to add, not rows: its reader is told to refresh it first."""
    upstream = _log_upstream("SELECT DISTINCT customer FROM shop.orders", "customer string")
    with pytest.raises(ValueError, match="is a log of partial rows.*refresh the model"):
        signed_changes(TableName("analytics", "my_model"), VersionRange(7, 9), "up", upstream)


def test_a_reader_of_some_of_a_log_upstreams_columns_sums_it_per_those():
    """reads.narrowed: the consolidation groups by the state columns the reader reads, only."""
    upstream = _log_upstream(LOG_UPSTREAM, "id int, customer string")
    up = TableName("analytics", "up")
    reader = "SELECT customer, COUNT(*) AS n FROM analytics.up GROUP BY customer"
    catalog = golden.FakeCatalog(
        {"analytics.up": [("id", "int"), ("customer", "string")]},
        reader,
        golden.split_columns("customer string, n bigint"),
        golden.split_columns("key_0 string"),
    )
    plan = compile_model("reader", reader, catalog, {up: upstream})
    narrowed = plan.upstreams[up]
    assert [p.alias_or_name for p in narrowed.view.expressions] == ["customer"]
    at_version = table_at_version(up, 9, "up", narrowed).sql("spark")
    assert f"GROUP BY `__ivm_g1` HAVING SUM(`{names.COUNT}`) <> 0" in at_version
    # Its change and net change have the same single column.
    changed = signed_changes(up, VersionRange(7, 9, overwritten=True), "up", narrowed)
    assert [p.alias_or_name for p in changed.this.expressions] == ["customer", names.SIGN]


def test_a_reader_of_every_column_or_of_a_merged_upstream_reads_it_as_it_is():
    upstream = _log_upstream(LOG_UPSTREAM, "id int, customer string")
    assert reads.narrowed(upstream, ["id", "customer"]) is upstream
    assert reads.narrowed(upstream, []) is upstream
    assert reads.narrowed(UPSTREAM, ["g"]) is UPSTREAM
