"""Join states: which inputs can keep one, what it holds, and the SQL that keeps it.

What a join state changes in a refresh's result is tested end to end by
tests/functional/test_join_states.py; these pin the compiler's choices.
"""

from __future__ import annotations

from typing import Any

import pytest
from dbt_common.exceptions import CompilationError

from dbt.adapters.spark_ivm.refresh.join_states import JoinStates, SourceFacts
from ivm_compiler import TableName, emit, join_states
from ivm_compiler.changes import signed_rows
from ivm_compiler.key_bounds import ChangeKeys
from ivm_compiler.reads import VersionRange as Window
from tests.unit.test_compile import (
    CUSTOMERS_TABLE,
    JOIN_DESCRIBE,
    JOIN_PROBE,
    JOIN_SQL,
    ORDERS_TABLE,
    SELF_JOIN_DESCRIBE,
    SELF_JOIN_SQL,
    compile_with,
)

MODEL_VIEW = TableName(db="analytics", name="my_model")


def test_each_join_input_keeps_the_columns_read_its_own_filter_and_its_join_key() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    orders, customers = join_states.candidates(plan)
    assert (orders.alias, orders.table) == ("o", ORDERS_TABLE)
    assert dict(orders.columns) == {"amount": "decimal(10,2)", "customer": "string", "qty": "int"}
    # `o.qty > 0` reads orders alone: the join state keeps only the rows passing
    # it, and with a join key (a NULL key meets no partner).
    assert orders.condition is not None and orders.filtered
    assert orders.condition.sql("spark") == "`o`.`qty` > 0 AND NOT `o`.`customer` IS NULL"
    assert orders.join_keys == ("customer",)
    assert (customers.alias, customers.table) == ("c", CUSTOMERS_TABLE)
    assert dict(customers.columns) == {"country": "string", "name": "string"}
    assert customers.condition.sql("spark") == "NOT `c`.`name` IS NULL"
    assert not customers.filtered
    assert customers.join_keys == ("name",)
    assert orders.relation(MODEL_VIEW) == TableName(db="analytics", name="my_model__ivm_join_o")


def test_a_self_join_keeps_one_join_state_per_alias() -> None:
    plan, _ = compile_with(SELF_JOIN_SQL, SELF_JOIN_DESCRIBE)
    found = join_states.candidates(plan)
    assert [c.alias for c in found] == ["a", "b"]
    # The non-equi `a.id < b.id` reads both inputs: neither keeps it.
    assert all(not c.filtered and c.join_keys == ("customer",) for c in found)


def test_floating_point_columns_and_single_tables_keep_no_join_state() -> None:
    # orders.price is DOUBLE: -0.0 and 0.0 would share one join state row.
    plan, _ = compile_with(
        "SELECT o.price, c.name FROM shop.orders AS o JOIN shop.customers AS c "
        "ON o.customer = c.name",
        [("price", "double"), ("name", "string")],
    )
    assert [c.alias for c in join_states.candidates(plan)] == ["c"]
    single, _ = compile_with(
        "SELECT customer, qty FROM shop.orders", [("customer", "string"), ("qty", "int")]
    )
    assert join_states.candidates(single) == []


def test_the_refresh_reads_a_join_state_at_the_version_each_term_asks_for() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    _, customers = join_states.candidates(plan)
    relation = customers.relation(MODEL_VIEW)
    windows = {ORDERS_TABLE: Window(3, 5), CUSTOMERS_TABLE: Window(7, 8)}
    reads = {
        "c": {
            7: join_states.read(customers, relation, 40),
            8: join_states.read(customers, relation, 41),
        }
    }
    sql = signed_rows(plan, windows, join_reads=reads).sql("spark")
    # The orders term reads customers at the recorded version (join state
    # commit 40), the customers term reads its change feed; orders' partner
    # read is the source itself (no join state for it here).
    assert "`analytics`.`my_model__ivm_join_c` VERSION AS OF 40" in sql
    assert "`shop`.`customers` VERSION AS OF" not in sql
    assert "`shop`.`orders` VERSION AS OF 5" in sql
    assert "EXPLODE(SEQUENCE(1, `__ivm_count`))" in sql


def test_the_upkeep_merge_applies_net_counts_and_checks_the_guard() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    orders, _ = join_states.candidates(plan)
    sql = emit.merge_join_state(
        orders, orders.relation(MODEL_VIEW), Window(3, 5), emit.Guard(read="g1", write="g2")
    )
    assert sql.startswith("MERGE INTO `analytics`.`my_model__ivm_join_o` AS `__ivm_t`")
    assert "TABLE_CHANGES('`shop`.`orders`', 4, 5)" in sql
    # The model's own condition on orders filters the change rows too.
    assert "WHERE `o`.`qty` > 0 AND NOT `o`.`customer` IS NULL" in sql
    # Without the probe's bounds every row of the join state may match.
    assert "BETWEEN" not in sql
    assert "HAVING SUM(`o`.`__ivm_sign`) <> 0" in sql
    assert "no longer holds refresh g1" in sql
    assert (
        "WHEN MATCHED AND `__ivm_t`.`__ivm_count` + `__ivm_d`.`__ivm_count` = 0 THEN DELETE" in sql
    )
    create = emit.create_join_state(orders, orders.relation(MODEL_VIEW), 5, "g0")
    assert (
        "FROM `shop`.`orders` VERSION AS OF 5 AS `o` WHERE `o`.`qty` > 0 "
        "AND NOT `o`.`customer` IS NULL"
    ) in create
    assert create.endswith("ORDER BY `customer`")


def test_the_upkeep_merge_reads_the_join_state_within_the_change_key_range() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    orders, _ = join_states.candidates(plan)
    relation = orders.relation(MODEL_VIEW)
    guard = emit.Guard(read="g1", write="g2")
    bounded = emit.merge_join_state(
        orders,
        relation,
        Window(3, 5),
        guard,
        {(ORDERS_TABLE, "customer"): ChangeKeys((("ann", "bob"),))},
    )
    assert (
        "AND (`__ivm_t`.`customer` BETWEEN CAST('ann' AS STRING) AND CAST('bob' AS STRING) "
        "OR NOT `__ivm_t`.`__ivm_guard` IS NULL)"
    ) in bounded
    # Only NULL keys changed: the join state keeps none of them; the guard row still matches.
    nulls = emit.merge_join_state(
        orders, relation, Window(3, 5), guard, {(ORDERS_TABLE, "customer"): ChangeKeys(())}
    )
    assert "BETWEEN" not in nulls and "AND NOT `__ivm_t`.`__ivm_guard` IS NULL WHEN" in nulls


class _NoQueries:
    def execute(self, sql: str) -> None:
        raise AssertionError(f"no statement expected: {sql}")

    def query(self, sql: str) -> Any:
        raise AssertionError(f"no statement expected: {sql}")


class _Log:
    def info(self, msg: str) -> None: ...

    def debug(self, msg: str) -> None: ...


def _states(
    setting: Any,
    facts: dict[TableName, SourceFacts] | None = None,
    existing: tuple[str, ...] = (),
    refreshes: list[dict[TableName, int]] | None = None,
) -> JoinStates:
    return JoinStates(
        runner=_NoQueries(),
        log=_Log(),
        model="model.p.my_model",
        target=MODEL_VIEW,
        setting=setting,
        source_facts=lambda table: (facts or {}).get(table),
        relation_exists=lambda table: "table" if table.name in existing else None,
        recent_refreshes=lambda: refreshes or [],
    )


def test_a_listed_alias_that_cannot_keep_a_join_state_stops_the_refresh() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    assert [c.alias for c in _states(["C"]).chosen(plan, building=True)] == ["c"]
    with pytest.raises(CompilationError) as raised:
        _states(["c", "x"]).chosen(plan, building=True)
    message = str(raised.value)
    assert "Model 'model.p.my_model': ivm_join_state names 'x'" in message
    assert "inputs that can: c, o" in message and "Fix:" in message


def test_auto_keeps_a_join_state_for_large_sources_read_narrowly_or_filtered() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    large = 2 << 30
    facts = {
        # orders: 3 of 5 columns read, but filtered by `o.qty > 0`.
        ORDERS_TABLE: SourceFacts(size_bytes=large, column_count=5),
        # customers: 2 of 3 columns, no filter of its own.
        CUSTOMERS_TABLE: SourceFacts(size_bytes=large, column_count=3),
    }
    assert [c.alias for c in _states("auto", facts).chosen(plan, building=True)] == ["o"]
    small = {
        t: SourceFacts(size_bytes=1 << 20, column_count=f.column_count) for t, f in facts.items()
    }
    assert _states("auto", small).chosen(plan, building=True) == []
    assert _states("none", facts).chosen(plan, building=True) == []
    assert [c.alias for c in _states("all").chosen(plan, building=True)] == ["o", "c"]


def test_auto_drops_a_join_state_whose_source_changes_in_most_refreshes() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    kept = ("my_model__ivm_join_o", "my_model__ivm_join_c")

    def refreshes(orders: list[int]) -> list[dict[TableName, int]]:
        return [{ORDERS_TABLE: v, CUSTOMERS_TABLE: 7} for v in orders]

    # customers never changed; orders changed in 2 of the last 4 refreshes: both kept.
    rarely = _states("auto", existing=kept, refreshes=refreshes([1, 1, 2, 2, 3, 3, 3]))
    assert [c.alias for c in rarely.chosen(plan, building=False)] == ["o", "c"]
    # orders changed in 3 of the last 4: its join state goes, customers' stays.
    often = _states("auto", existing=kept, refreshes=refreshes([1, 1, 2, 3, 3, 4]))
    assert [c.alias for c in often.chosen(plan, building=False)] == ["c"]
    # Only the ones that exist are kept: 'auto' decides what to build at a build.
    assert _states("auto", refreshes=refreshes([1, 1])).chosen(plan, building=False) == []
