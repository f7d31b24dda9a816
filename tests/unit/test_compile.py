"""compile_model's plan, its questions to the catalog, and its fingerprint.

The statements themselves are pinned by the golden fixtures; these tests pin
what the plan means and when a state must be rebuilt.
"""

from __future__ import annotations

import pytest

from ivm_compiler import NotMaintainable, TableName, ViewClass, compile_model, emit
from ivm_compiler import compile as compile_module
from ivm_compiler.plan import MergeRule
from tests.unit.golden import FakeCatalog

MODEL = "my_model"
ORDERS = [
    ("id", "int"),
    ("customer", "string"),
    ("amount", "decimal(10,2)"),
    ("qty", "int"),
    ("price", "double"),
]
# A ledger whose amounts use all of DECIMAL's precision.
LEDGER = [("id", "int"), ("amount", "decimal(38,14)")]
SOURCES = {"shop.orders": ORDERS, "shop.orders_v2": ORDERS, "shop.ledger": LEDGER}

# The DESCRIBE QUERY answers below (for models and for the compiler's type probe)
# are what Spark 4.0.1 reports over empty Delta tables with these columns.


def compile_with(
    sql: str,
    describe: list[tuple[str, str]],
    describe_probe: list[tuple[str, str]] | None = None,
    sources: dict[str, list[tuple[str, str]]] = SOURCES,
):
    catalog = FakeCatalog(sources, sql, describe, describe_probe)
    return compile_model(MODEL, sql, catalog), catalog


GROUPED_SQL = (
    "SELECT customer, COUNT(*) AS n, COUNT(qty) AS nq, SUM(amount) AS total, AVG(amount) AS mean "
    "FROM shop.orders WHERE qty > 0 GROUP BY customer"
)
GROUPED_DESCRIBE = [
    ("customer", "string"),
    ("n", "bigint"),
    ("nq", "bigint"),
    ("total", "decimal(20,2)"),
    ("mean", "decimal(14,6)"),
]
GROUPED_PROBE = [("key_0", "string"), ("sum_1", "decimal(20,2)"), ("avg_1", "decimal(14,6)")]


def test_grouped_plan() -> None:
    plan, catalog = compile_with(GROUPED_SQL, GROUPED_DESCRIBE, GROUPED_PROBE)
    assert plan.view_class is ViewClass.GROUPED_AGGREGATE
    assert plan.source == TableName(db="shop", name="orders")
    assert plan.source_alias == "orders"
    assert plan.where is not None and plan.where.sql("spark") == "`orders`.`qty` > 0"
    assert [k.sql("spark") for k in plan.keys] == ["`orders`.`customer`"]
    assert [(c.name, c.rule) for c in plan.state_columns] == [
        ("__ivm_g0", MergeRule.KEY),
        ("__ivm_count", MergeRule.ADD),
        # COUNT(qty) only needs the non-NULL count of qty ...
        ("__ivm_nn_a0", MergeRule.ADD),
        # ... SUM and AVG of amount share one count and one sum.
        ("__ivm_nn_a1", MergeRule.ADD),
        ("__ivm_sum_a1", MergeRule.ADD_NULLABLE),
    ]
    assert [(o.name, o.data_type) for o in plan.outputs] == GROUPED_DESCRIBE
    assert plan.having is None
    assert catalog.asked == ["columns shop.orders", "describe model", "describe probe"]


def test_one_probe_asks_keys_sums_and_averages_without_the_models_filter() -> None:
    _, catalog = compile_with(GROUPED_SQL, GROUPED_DESCRIBE, GROUPED_PROBE)
    # COUNT(qty) needs no type: only the argument that is summed and averaged is asked.
    assert catalog.probes == [
        (
            "SELECT `orders`.`customer` AS key_0, SUM(`orders`.`amount`) AS sum_1, "
            "AVG(`orders`.`amount`) AS avg_1 FROM `shop`.`orders` AS `orders` "
            "GROUP BY `orders`.`customer`"
        )
    ]


def test_probe_without_avg_asks_keys_and_sums() -> None:
    _, catalog = compile_with(
        "SELECT customer, SUM(qty) AS s FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("s", "bigint")],
        [("key_0", "string"), ("sum_0", "bigint")],
    )
    assert catalog.probes == [
        (
            "SELECT `orders`.`customer` AS key_0, SUM(`orders`.`qty`) AS sum_0 "
            "FROM `shop`.`orders` AS `orders` GROUP BY `orders`.`customer`"
        )
    ]


def test_no_probe_for_counts_without_keys() -> None:
    sql = "SELECT COUNT(*) AS n, COUNT(qty) AS nq FROM shop.orders"
    plan, catalog = compile_with(sql, [("n", "bigint"), ("nq", "bigint")])
    assert plan.view_class is ViewClass.GLOBAL_AGGREGATE
    assert catalog.asked == ["columns shop.orders", "describe model"]


def test_no_probe_for_projections() -> None:
    _, catalog = compile_with(
        "SELECT DISTINCT customer, qty FROM shop.orders", [("customer", "string"), ("qty", "int")]
    )
    assert catalog.asked == ["columns shop.orders", "describe model"]


@pytest.mark.parametrize(
    ("sql", "sum_type", "avg_type", "expected"),
    [
        # Spark's Average over integral inputs: a DOUBLE division.
        pytest.param(
            "SELECT AVG(qty) AS mean FROM shop.orders",
            "bigint",
            "double",
            (
                "CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_sum_a0` AS DOUBLE) / "
                "CAST(`__ivm_nn_a0` AS DOUBLE) END"
            ),
            id="integral",
        ),
        # Over decimals: the sum divided by the count as DECIMAL(20, 0), cast to the result type.
        pytest.param(
            "SELECT AVG(amount) AS mean FROM shop.orders",
            "decimal(20,2)",
            "decimal(14,6)",
            (
                "CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_sum_a0` / "
                "CAST(`__ivm_nn_a0` AS DECIMAL(20, 0)) AS DECIMAL(14, 6)) END"
            ),
            id="decimal",
        ),
        # At DECIMAL's full precision Spark bounds the sum and the average to 38 digits.
        pytest.param(
            "SELECT AVG(amount) AS mean FROM shop.ledger",
            "decimal(38,14)",
            "decimal(38,18)",
            (
                "CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_sum_a0` / "
                "CAST(`__ivm_nn_a0` AS DECIMAL(20, 0)) AS DECIMAL(38, 18)) END"
            ),
            id="decimal_38",
        ),
    ],
)
def test_avg_follows_sparks_average(sql: str, sum_type: str, avg_type: str, expected: str) -> None:
    plan, _ = compile_with(sql, [("mean", avg_type)], [("sum_0", sum_type), ("avg_0", avg_type)])
    assert plan.outputs[0].expression.sql("spark") == expected


def test_projection_keys_are_the_distinct_projected_expressions() -> None:
    plan, _ = compile_with(
        "SELECT customer, qty, customer AS again FROM shop.orders",
        [("customer", "string"), ("qty", "int"), ("again", "string")],
    )
    assert [k.sql("spark") for k in plan.keys] == ["`orders`.`customer`", "`orders`.`qty`"]
    assert [o.expression.sql("spark") for o in plan.outputs] == [
        "`__ivm_g0`",
        "`__ivm_g1`",
        "`__ivm_g0`",
    ]
    assert [c.name for c in plan.value_columns] == ["__ivm_count"]


def test_record_refresh() -> None:
    state = TableName(db="analytics", name="my_model__ivm_state")
    assert emit.record_refresh(state, "0123abcd") == (
        "ALTER TABLE `analytics`.`my_model__ivm_state` "
        "SET TBLPROPERTIES ('spark_ivm.last_refresh'='0123abcd')"
    )


def test_identifiers_are_quoted_everywhere() -> None:
    # A name that needs quoting survives into every statement intact.
    sources = {"shop.order lines": [("line id", "int"), ("customer", "string")]}
    sql = "SELECT `line id`, customer FROM shop.`order lines`"
    plan, _ = compile_with(sql, [("line id", "int"), ("customer", "string")], sources=sources)
    state = TableName(db="analytics", name="weird``name__ivm_state")
    merge = emit.merge_changes(plan, state, 1, 2)
    assert "TABLE_CHANGES('`shop`.`order lines`', 1, 2)" in merge
    assert "`order lines`.`line id` AS `__ivm_g0`" in merge
    assert "MERGE INTO `analytics`.`weird````name__ivm_state`" in merge
    view = emit.create_view(plan, state, TableName(db="analytics", name="weird"))
    assert "AS `line id`" in view


# -- fingerprint: when a state must be rebuilt ----------------------------------

BASE_SQL = "SELECT customer, SUM(qty) AS s FROM shop.orders GROUP BY customer"
BASE_DESCRIBE = [("customer", "string"), ("s", "bigint")]
BASE_PROBE = [("key_0", "string"), ("sum_0", "bigint")]


def fingerprint(
    sql: str = BASE_SQL,
    describe: list[tuple[str, str]] = BASE_DESCRIBE,
    probe: list[tuple[str, str]] | None = BASE_PROBE,
    sources: dict[str, list[tuple[str, str]]] = SOURCES,
) -> str:
    return compile_with(sql, describe, probe, sources)[0].fingerprint


def test_fingerprint_is_stable_across_formatting() -> None:
    reformatted = "select customer,\n       sum(qty) as s\n  from shop.orders\n group by customer\n"
    assert fingerprint(reformatted) == fingerprint()


# shop.orders with qty retyped from INT to DECIMAL(10,0).
RETYPED = {"shop.orders": [(name, "decimal(10,0)" if name == "qty" else t) for name, t in ORDERS]}


@pytest.mark.parametrize(
    ("sql", "describe", "probe", "sources"),
    [
        pytest.param(
            "SELECT customer, SUM(qty) AS s FROM shop.orders WHERE qty > 0 GROUP BY customer",
            BASE_DESCRIBE,
            BASE_PROBE,
            SOURCES,
            id="filter_added",
        ),
        pytest.param(
            "SELECT customer, SUM(amount) AS s FROM shop.orders GROUP BY customer",
            [("customer", "string"), ("s", "decimal(20,2)")],
            [("key_0", "string"), ("sum_0", "decimal(20,2)")],
            SOURCES,
            id="other_argument",
        ),
        pytest.param(
            "SELECT customer, SUM(qty) AS total FROM shop.orders GROUP BY customer",
            [("customer", "string"), ("total", "bigint")],
            BASE_PROBE,
            SOURCES,
            id="renamed_output",
        ),
        pytest.param(
            "SELECT customer, SUM(qty) AS s FROM shop.orders_v2 GROUP BY customer",
            BASE_DESCRIBE,
            BASE_PROBE,
            SOURCES,
            id="other_source",
        ),
        pytest.param(
            BASE_SQL,
            [("customer", "string"), ("s", "decimal(20,0)")],
            [("key_0", "string"), ("sum_0", "decimal(20,0)")],
            RETYPED,
            id="output_type_changed",
        ),
        pytest.param(
            "SELECT DISTINCT customer, qty AS s FROM shop.orders",
            [("customer", "string"), ("s", "int")],
            None,
            SOURCES,
            id="other_view_class",
        ),
    ],
)
def test_fingerprint_changes_with_meaning(
    sql: str,
    describe: list[tuple[str, str]],
    probe: list[tuple[str, str]] | None,
    sources: dict[str, list[tuple[str, str]]],
) -> None:
    assert fingerprint(sql, describe, probe, sources) != fingerprint()


def test_fingerprint_changes_with_the_state_format(monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint()
    monkeypatch.setattr(
        compile_module, "STATE_FORMAT_VERSION", compile_module.STATE_FORMAT_VERSION + 1
    )
    assert fingerprint() != before


def test_fingerprint_changes_when_a_star_expands_to_new_columns() -> None:
    sql = "SELECT * FROM shop.orders"
    describe = [(name, data_type) for name, data_type in ORDERS]
    widened = {"shop.orders": [*ORDERS, ("note", "string")]}
    assert (
        compile_with(sql, [*describe, ("note", "string")], sources=widened)[0].fingerprint
        != compile_with(sql, describe)[0].fingerprint
    )


# -- GROUP BY ALL ----------------------------------------------------------------


def test_group_by_all_groups_by_the_non_aggregated_outputs() -> None:
    plan, catalog = compile_with(
        "SELECT customer, COUNT(*) AS n FROM shop.orders GROUP BY ALL",
        [("customer", "string"), ("n", "bigint")],
        [("key_0", "string")],
    )
    assert plan.view_class is ViewClass.GROUPED_AGGREGATE
    assert [k.sql("spark") for k in plan.keys] == ["`orders`.`customer`"]
    assert catalog.probes == [
        (
            "SELECT `orders`.`customer` AS key_0 FROM `shop`.`orders` AS `orders` "
            "GROUP BY `orders`.`customer`"
        )
    ]


GROUP_BY_ALL_SQL = (
    "SELECT UPPER(customer) AS cu, qty + 1 AS q1, SUM(amount) AS total FROM shop.orders {}"
)
GROUP_BY_ALL_DESCRIBE = [("cu", "string"), ("q1", "int"), ("total", "decimal(20,2)")]
GROUP_BY_ALL_PROBE = [("key_0", "string"), ("key_1", "int"), ("sum_0", "decimal(20,2)")]


def test_group_by_all_compiles_like_the_group_by_it_stands_for() -> None:
    plans = {
        group: compile_with(
            GROUP_BY_ALL_SQL.format(group), GROUP_BY_ALL_DESCRIBE, GROUP_BY_ALL_PROBE
        )[0]
        for group in ("GROUP BY ALL", "GROUP BY UPPER(customer), qty + 1")
    }
    implicit, explicit = plans.values()
    assert [k.sql("spark") for k in implicit.keys] == [
        "UPPER(`orders`.`customer`)",
        "`orders`.`qty` + 1",
    ]
    state = TableName(db="analytics", name="my_model__ivm_state")
    # The state and its maintenance are the same; only the recorded model text differs.
    assert emit.create_state(implicit, state, 3) == emit.create_state(explicit, state, 3)
    assert emit.merge_changes(implicit, state, 4, 5) == emit.merge_changes(explicit, state, 4, 5)
    assert implicit.state_columns == explicit.state_columns
    assert [o.expression for o in implicit.outputs] == [o.expression for o in explicit.outputs]


def test_group_by_all_of_only_aggregates_is_a_global_aggregate() -> None:
    plan, _ = compile_with("SELECT COUNT(*) AS n FROM shop.orders GROUP BY ALL", [("n", "bigint")])
    assert plan.view_class is ViewClass.GLOBAL_AGGREGATE


# -- typed and untyped NULLs ---------------------------------------------------------


def test_a_typed_null_output_is_maintained() -> None:
    # The fix the untyped NULL refusal suggests compiles.
    plan, _ = compile_with(
        "SELECT id, CAST(NULL AS STRING) AS note FROM shop.orders",
        [("id", "int"), ("note", "string")],
    )
    assert [(o.name, o.data_type) for o in plan.outputs] == [("id", "int"), ("note", "string")]


@pytest.mark.parametrize(
    ("sql", "describe"),
    [
        pytest.param(
            "SELECT id, ARRAY(NULL) AS a FROM shop.orders",
            [("id", "int"), ("a", "array<void>")],
            id="array_of_null",
        ),
        pytest.param(
            "SELECT id, NAMED_STRUCT('x', NULL) AS s FROM shop.orders",
            [("id", "int"), ("s", "struct<x:void>")],
            id="struct_of_null",
        ),
    ],
)
def test_nested_untyped_null_output_is_refused(sql: str, describe: list[tuple[str, str]]) -> None:
    with pytest.raises(NotMaintainable, match=r"untyped NULL"):
        compile_with(sql, describe)


# -- types named like the incomparable ones -------------------------------------------

# A product table whose struct has a field named "variant": DESCRIBE shows the type
# as struct<variant:string,n:int>, which holds no VARIANT at all.
PRODUCTS = {"shop.products": [("id", "int"), ("info", "struct<variant:string,n:int>")]}


@pytest.mark.parametrize(
    ("sql", "describe", "probe"),
    [
        pytest.param(
            "SELECT id, info FROM shop.products",
            [("id", "int"), ("info", "struct<variant:string,n:int>")],
            None,
            id="projected",
        ),
        pytest.param(
            "SELECT info, COUNT(*) AS n FROM shop.products GROUP BY info",
            [("info", "struct<variant:string,n:int>"), ("n", "bigint")],
            [("key_0", "struct<variant:string,n:int>")],
            id="group_key",
        ),
    ],
)
def test_a_struct_field_named_variant_is_not_a_variant(
    sql: str, describe: list[tuple[str, str]], probe: list[tuple[str, str]] | None
) -> None:
    plan, _ = compile_with(sql, describe, probe, sources=PRODUCTS)
    assert plan.outputs


# -- Spark aggregates sqlglot does not know -----------------------------------------


@pytest.mark.parametrize(
    ("sql", "describe"),
    [
        pytest.param("SELECT TRY_SUM(qty) AS s FROM shop.orders", [("s", "bigint")], id="try_sum"),
        pytest.param("SELECT TRY_AVG(qty) AS m FROM shop.orders", [("m", "double")], id="try_avg"),
        pytest.param("SELECT STD(qty) AS sd FROM shop.orders", [("sd", "double")], id="std"),
        pytest.param(
            "SELECT EVERY(qty > 0) AS ok FROM shop.orders", [("ok", "boolean")], id="every"
        ),
    ],
)
def test_aggregates_unknown_to_sqlglot_are_refused(
    sql: str, describe: list[tuple[str, str]]
) -> None:
    with pytest.raises(NotMaintainable, match=r"the aggregate "):
        compile_with(sql, describe)
