"""Change feeds a refresh reads more than once, staged first (emit.stage_feeds)."""

from __future__ import annotations

import dataclasses

from ivm_compiler import emit, log_state
from ivm_compiler.reads import VersionRange
from tests.unit.test_compile import (
    CUSTOMERS_TABLE,
    GUARD,
    JOIN_DESCRIBE,
    JOIN_PROBE,
    JOIN_SQL,
    ORDERS_TABLE,
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
