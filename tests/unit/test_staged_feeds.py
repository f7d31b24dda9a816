"""What a refresh reads more than once, staged first: change feeds (emit.stage_feeds) and
small sources' pinned snapshots (emit.stage_snapshots)."""

from __future__ import annotations

import dataclasses

from sqlglot import parse_one

from ivm_compiler import emit, log_state, reads
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.reads import VersionRange
from ivm_compiler.sql import TableName
from tests.unit.test_compile import (
    CUSTOMERS_TABLE,
    GUARD,
    JOIN_DESCRIBE,
    JOIN_PROBE,
    JOIN_SQL,
    ORDERS_TABLE,
    SHIPMENTS,
    STATE,
    compile_with,
)

BOTH_CHANGED = {ORDERS_TABLE: VersionRange(3, 5), CUSTOMERS_TABLE: VersionRange(7, 8)}
ORDERS_CHANGED = {ORDERS_TABLE: VersionRange(3, 5), CUSTOMERS_TABLE: VersionRange(8, 8)}


def _join_plan():
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    return plan


def _staged(plan, ranges):
    stages, _ = emit.stage_feeds(plan, ranges, "__ivm_staged_r")
    return [stage.table for stage in stages]


def test_a_join_stages_each_changed_inputs_feed_the_probe_and_a_term_read():
    # orders: its term and the probe; customers: its term, orders' term
    # (as R' - dR) and the probe.
    assert _staged(_join_plan(), BOTH_CHANGED) == [ORDERS_TABLE, CUSTOMERS_TABLE]
    assert _staged(_join_plan(), ORDERS_CHANGED) == [ORDERS_TABLE]


def test_a_feed_read_once_is_not_staged():
    plan, _ = compile_with(
        "SELECT customer, COUNT(*) AS n FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("n", "bigint")],
        [("key_0", "string")],
    )
    assert _staged(plan, {ORDERS_TABLE: VersionRange(3, 5)}) == []
    assert _staged(plan, {ORDERS_TABLE: VersionRange(5, 5)}) == []


def test_the_stage_keeps_the_columns_the_model_reads_and_the_change_type():
    stages, reading = emit.stage_feeds(_join_plan(), BOTH_CHANGED, "__ivm_staged_r")
    assert [stage.name for stage in stages] == ["__ivm_staged_r_0", "__ivm_staged_r_1"]
    assert [reading[stage.table].staged for stage in stages] == [s.name for s in stages]
    sql = stages[0].statement
    assert sql.startswith("CACHE TABLE `__ivm_staged_r_0` AS SELECT ")
    assert "TABLE_CHANGES('`shop`.`orders`', 4, 5)" in sql
    for column in ("`customer`", "`amount`", "`qty`", "`_change_type`"):
        assert column in sql
    assert "`status`" not in sql and "*" not in sql


def test_a_staged_range_is_read_from_its_stage_by_the_probe_and_every_write():
    plan = _join_plan()
    staged = {
        ORDERS_TABLE: dataclasses.replace(BOTH_CHANGED[ORDERS_TABLE], staged="__ivm_staged_r_0"),
        CUSTOMERS_TABLE: BOTH_CHANGED[CUSTOMERS_TABLE],
    }
    probe, _ = emit.probe_join_keys(plan, staged)
    merge = emit.merge_changes(plan, STATE, staged, GUARD)
    append = log_state.append_changes(log_state.with_log(plan), STATE, staged, "r-this", {})
    for sql in (probe, merge, append):
        assert "TABLE_CHANGES('`shop`.`orders`'" not in sql
        assert "FROM `__ivm_staged_r_0`" in sql
        # The unstaged input still reads its change feed.
        assert "TABLE_CHANGES('`shop`.`customers`', 8, 8)" in sql


# An upstream ivm model in place of the customers source: its view over its state.
CUSTOMERS_STATE = TableName(db="shop", name="customers__ivm_state")
CUSTOMERS_VIEW = parse_one(
    "SELECT CAST(__ivm_g0 AS INT) AS id, CAST(__ivm_g1 AS STRING) AS name, "
    "CAST(__ivm_g2 AS STRING) AS country FROM shop.customers__ivm_state "
    "LATERAL VIEW EXPLODE(ARRAY_REPEAT(1, __ivm_count)) AS c WHERE __ivm_guard IS NULL",
    read="spark",
)


def _join_over_an_upstream():
    return dataclasses.replace(
        _join_plan(), upstreams={CUSTOMERS_TABLE: UpstreamModel(CUSTOMERS_STATE, CUSTOMERS_VIEW)}
    )


def test_an_upstream_models_change_read_more_than_once_is_staged_as_its_signed_view_rows():
    plan = _join_over_an_upstream()
    stages, reading = emit.stage_feeds(plan, BOTH_CHANGED, "__ivm_staged_r")
    assert [stage.table for stage in stages] == [ORDERS_TABLE, CUSTOMERS_TABLE]
    staged = stages[1].statement
    assert staged.startswith("CACHE TABLE `__ivm_staged_r_1` AS SELECT ")
    assert "TABLE_CHANGES('`shop`.`customers__ivm_state`', 8, 8)" in staged
    # The view's rows, each with the sign of its state change row.
    assert "AS name," in staged and "AS `__ivm_sign`" in staged
    merge = emit.merge_changes(plan, STATE, reading, GUARD)
    probe, _ = emit.probe_join_keys(plan, reading)
    for sql in (merge, probe):
        assert "customers__ivm_state`'" not in sql
        assert "FROM `__ivm_staged_r_1`" in sql
    # Read once (its own term only when orders did not change): not staged.
    assert [s.table for s in emit.stage_feeds(plan, ORDERS_CHANGED, "r")[0]] == [ORDERS_TABLE]


def test_a_staged_upstream_reads_the_same_rows_as_its_feed():
    plan = _join_over_an_upstream()
    ranges = {ORDERS_TABLE: VersionRange(5, 5), CUSTOMERS_TABLE: VersionRange(7, 8)}
    stage = reads.stage_upstream_change(
        CUSTOMERS_TABLE, ranges[CUSTOMERS_TABLE], "s", plan.upstreams[CUSTOMERS_TABLE]
    )
    inline = reads.signed_changes(
        CUSTOMERS_TABLE, ranges[CUSTOMERS_TABLE], "s", plan.upstreams[CUSTOMERS_TABLE]
    )
    assert stage.expression.sql("spark") == inline.this.sql("spark")


# -- pinned snapshots of small sources (emit.stage_snapshots) ---------------------------

SHIPMENTS_TABLE = TableName(db="shop", name="shipments")
# NOT IN splits into five terms (L - L ⋈ M - ...): each reads the other input
# at its pinned version, and the key relations read the subquery's table.
NOT_IN_CHANGED = {ORDERS_TABLE: VersionRange(3, 5), SHIPMENTS_TABLE: VersionRange(6, 7)}


def _not_in_plan():
    plan, _ = compile_with(
        "SELECT o.customer FROM shop.orders o WHERE o.id NOT IN (SELECT id FROM shop.shipments)",
        [("customer", "string")],
        sources=SHIPMENTS,
    )
    return plan


def test_a_small_sources_snapshot_read_by_several_terms_is_staged_and_read_from_there():
    plan = _not_in_plan()
    small = {ORDERS_TABLE, SHIPMENTS_TABLE}
    stages, reading = emit.stage_snapshots(plan, NOT_IN_CHANGED, "__ivm_staged_r_snapshot", small)
    assert [stage.table for stage in stages] == [ORDERS_TABLE, SHIPMENTS_TABLE]
    assert stages[0].statement == (
        "CACHE TABLE `__ivm_staged_r_snapshot_0` AS "
        "SELECT `customer`, `id` FROM `shop`.`orders` VERSION AS OF 5"
    )
    assert "FROM `shop`.`shipments` VERSION AS OF 7" in stages[1].statement
    merge = emit.merge_changes(plan, STATE, reading, GUARD)
    append = log_state.append_changes(log_state.with_log(plan), STATE, reading, "r-this", {})
    for sql in (merge, append):
        assert "VERSION AS OF" not in sql
        assert "FROM `__ivm_staged_r_snapshot_0` AS `o`" in sql
        assert "`__ivm_staged_r_snapshot_1`" in sql
        # The change feeds are still read.
        assert "TABLE_CHANGES('`shop`.`orders`', 4, 5)" in sql


def test_only_small_sources_are_staged():
    plan = _not_in_plan()
    none, reading = emit.stage_snapshots(plan, NOT_IN_CHANGED, "s", small=set())
    assert none == [] and reading == NOT_IN_CHANGED
    stages, reading = emit.stage_snapshots(plan, NOT_IN_CHANGED, "s", small={SHIPMENTS_TABLE})
    assert [stage.table for stage in stages] == [SHIPMENTS_TABLE]
    merge = emit.merge_changes(plan, STATE, reading, GUARD)
    assert "`shop`.`orders` VERSION AS OF 5" in merge
    assert "`shop`.`shipments` VERSION AS OF" not in merge


def test_a_snapshot_read_once_is_not_staged():
    # A two-way join's terms read each partner once: dO ⋈ C' and O' ⋈ dC.
    stages, _ = emit.stage_snapshots(
        _join_plan(), BOTH_CHANGED, "s", small={ORDERS_TABLE, CUSTOMERS_TABLE}
    )
    assert stages == []
