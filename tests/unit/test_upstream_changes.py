"""An upstream ivm model's change as a reader reads it (reads.signed_changes), without Spark."""

from __future__ import annotations

import dataclasses

from sqlglot import exp, parse_one

from ivm_compiler import TableName, names
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.reads import VersionRange, signed_changes

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
