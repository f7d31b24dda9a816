"""compile_model's plan, its questions to the catalog, and its fingerprint.

The statements themselves are pinned by the golden fixtures; these tests pin
what the plan means and when a state must be rebuilt.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from ivm_compiler import NotMaintainable, TableName, ViewClass, compile_model, emit, merge_source
from ivm_compiler import compile as compile_module
from ivm_compiler.changes import signed_rows
from ivm_compiler.plan import MergeRule, PreAggregation, SourceRef
from ivm_compiler.reads import VersionRange as Window
from ivm_compiler.rules import extremes
from tests.unit.golden import FakeCatalog

MODEL = "my_model"
ORDERS = [
    ("id", "int"),
    ("customer", "string"),
    ("amount", "decimal(10,2)"),
    ("qty", "int"),
    ("price", "double"),
]
# Ledgers whose amounts use all of DECIMAL's precision; the fine one has more
# decimal places than Spark's `+` keeps at that precision.
LEDGER = [("id", "int"), ("amount", "decimal(38,4)")]
FINE_LEDGER = [("id", "int"), ("amount", "decimal(38,14)")]
CUSTOMERS = [("id", "int"), ("name", "string"), ("country", "string")]
SOURCES = {
    "shop.orders": ORDERS,
    "shop.orders_v2": ORDERS,
    "shop.ledger": LEDGER,
    "shop.fine_ledger": FINE_LEDGER,
    "shop.customers": CUSTOMERS,
}
ORDERS_TABLE = TableName(db="shop", name="orders")
CUSTOMERS_TABLE = TableName(db="shop", name="customers")
STATE = TableName(db="analytics", name="my_model__ivm_state")
GUARD = emit.Guard(read="r-read", write="r-this")

# The DESCRIBE QUERY answers below (for models and for the compiler's type probe)
# are what Spark 4.0.1 reports over empty Delta tables with these columns.


def compile_with(
    sql: str,
    describe: list[tuple[str, str]],
    describe_probe: list[tuple[str, str]] | None = None,
    sources: dict[str, list[tuple[str, str]]] = SOURCES,
    extremes_kept: int | None = extremes.KEPT_VALUES,
):
    catalog = FakeCatalog(sources, sql, describe, describe_probe)
    return compile_model(MODEL, sql, catalog, extremes_kept=extremes_kept), catalog


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
    assert plan.sources == (SourceRef(alias="orders", table=ORDERS_TABLE),)
    assert plan.tables == (ORDERS_TABLE,)
    # The rows the state is grouped from: the key and each distinct argument, named,
    # read from the model's FROM and filtered by its WHERE.
    assert plan.rows.sql("spark") == (
        "SELECT `orders`.`customer` AS `__ivm_g0`, `orders`.`qty` AS `__ivm_arg0`, "
        "`orders`.`amount` AS `__ivm_arg1` FROM `shop`.`orders` AS `orders` "
        "WHERE `orders`.`qty` > 0"
    )
    assert plan.keys == ("__ivm_g0",)
    assert plan.merge_keys == ("__ivm_g0",)
    assert plan.preaggregations == ()
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


def test_a_source_named_in_mixed_case_is_one_source() -> None:
    # dbt renders a source as declared (`Shop`.`Orders` with quoting on); Spark
    # matches it case-insensitively and sqlglot's qualify lower-cases it, so
    # the plan, the catalog question and the sources must all agree on it.
    # (This raised KeyError: TableName(db='shop', name='orders').)
    sql = GROUPED_SQL.replace("FROM shop.orders", "FROM `Shop`.`Orders`")
    plan, catalog = compile_with(sql, GROUPED_DESCRIBE, GROUPED_PROBE)
    assert plan.sources == (SourceRef(alias="orders", table=ORDERS_TABLE),)
    assert plan.tables == (ORDERS_TABLE,)
    assert catalog.asked[0] == "columns shop.orders"


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
            "decimal(38,4)",
            "decimal(38,8)",
            (
                "CASE WHEN `__ivm_nn_a0` = 0 THEN NULL ELSE CAST(`__ivm_sum_a0` / "
                "CAST(`__ivm_nn_a0` AS DECIMAL(20, 0)) AS DECIMAL(38, 8)) END"
            ),
            id="decimal_38",
        ),
    ],
)
def test_avg_follows_sparks_average(sql: str, sum_type: str, avg_type: str, expected: str) -> None:
    plan, _ = compile_with(sql, [("mean", avg_type)], [("sum_0", sum_type), ("avg_0", avg_type)])
    assert plan.outputs[0].expression.sql("spark") == expected


@pytest.mark.parametrize("aggregate", ["SUM", "AVG"])
def test_a_decimal_38_sum_with_more_than_6_places_is_refused(aggregate: str) -> None:
    # Spark adds two DECIMAL(38, 14) at DECIMAL(38, 13): the refresh's
    # stored + change would round. Found through dbt by tests/functional/
    # test_hostile_input.py (a DECIMAL(38, 10) sum near its maximum overflowed).
    sql = f"SELECT id, {aggregate}(amount) AS total FROM shop.fine_ledger GROUP BY id"
    with pytest.raises(NotMaintainable, match=r"DECIMAL\(38, 14\).*at scale 13") as refused:
        compile_with(
            sql,
            [("id", "int"), ("total", "decimal(38,14)")],
            [("key_0", "int"), ("sum_0", "decimal(38,14)")]
            + ([("avg_0", "decimal(38,18)")] if aggregate == "AVG" else []),
        )
    assert "CAST(`fine_ledger`.`amount` AS DECIMAL(38, 6))" in str(refused.value)


def test_projection_keys_are_the_distinct_projected_expressions() -> None:
    plan, _ = compile_with(
        "SELECT customer, qty, customer AS again FROM shop.orders",
        [("customer", "string"), ("qty", "int"), ("again", "string")],
    )
    assert plan.keys == ("__ivm_g0", "__ivm_g1")
    assert plan.rows.sql("spark") == (
        "SELECT `orders`.`customer` AS `__ivm_g0`, `orders`.`qty` AS `__ivm_g1` "
        "FROM `shop`.`orders` AS `orders`"
    )
    assert [o.expression.sql("spark") for o in plan.outputs] == [
        "`__ivm_g0`",
        "`__ivm_g1`",
        "`__ivm_g0`",
    ]
    assert [c.name for c in plan.value_columns] == ["__ivm_count"]


# -- joins ------------------------------------------------------------------------------

JOIN_SQL = (
    "SELECT c.country, COUNT(*) AS n, SUM(o.amount) AS total "
    "FROM shop.orders AS o JOIN shop.customers AS c ON o.customer = c.name "
    "WHERE o.qty > 0 GROUP BY c.country"
)
JOIN_DESCRIBE = [("country", "string"), ("n", "bigint"), ("total", "decimal(20,2)")]
JOIN_PROBE = [("key_0", "string"), ("sum_0", "decimal(20,2)")]


def test_join_plan() -> None:
    plan, catalog = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    assert plan.view_class is ViewClass.GROUPED_AGGREGATE
    assert plan.sources == (
        SourceRef(alias="o", table=ORDERS_TABLE),
        SourceRef(alias="c", table=CUSTOMERS_TABLE),
    )
    assert plan.tables == (ORDERS_TABLE, CUSTOMERS_TABLE)
    assert plan.rows.sql("spark") == (
        "SELECT `c`.`country` AS `__ivm_g0`, `o`.`amount` AS `__ivm_arg0` "
        "FROM `shop`.`orders` AS `o` JOIN `shop`.`customers` AS `c` "
        "ON `o`.`customer` = `c`.`name` WHERE `o`.`qty` > 0"
    )
    assert plan.keys == ("__ivm_g0",)
    assert catalog.asked == [
        "columns shop.orders",
        "columns shop.customers",
        "describe model",
        "describe probe",
    ]
    # The probe reads the model's joins, not its filter.
    assert catalog.probes == [
        (
            "SELECT `c`.`country` AS key_0, SUM(`o`.`amount`) AS sum_0 "
            "FROM `shop`.`orders` AS `o` JOIN `shop`.`customers` AS `c` "
            "ON `o`.`customer` = `c`.`name` GROUP BY `c`.`country`"
        )
    ]


SELF_JOIN_SQL = (
    "SELECT a.id, b.id AS later_id FROM shop.orders AS a "
    "JOIN shop.orders AS b ON a.customer = b.customer AND a.id < b.id"
)
SELF_JOIN_DESCRIBE = [("id", "int"), ("later_id", "int")]


def test_self_join_reads_one_table_under_two_aliases() -> None:
    plan, catalog = compile_with(SELF_JOIN_SQL, SELF_JOIN_DESCRIBE)
    assert plan.sources == (
        SourceRef(alias="a", table=ORDERS_TABLE),
        SourceRef(alias="b", table=ORDERS_TABLE),
    )
    # One table: asked for once, pinned once per refresh.
    assert plan.tables == (ORDERS_TABLE,)
    assert catalog.asked == ["columns shop.orders", "describe model"]
    assert plan.keys == ("__ivm_g0", "__ivm_g1")


def _term_reads(sql: str) -> list[str]:
    """How each UNION ALL term of signed rows reads its sources, in FROM order."""
    terms = []
    for select in sqlglot.parse_one(sql, read="spark").find_all(exp.Select):
        if not select.args.get("from_") or select.find_ancestor(exp.Subquery):
            continue
        reads = []
        for node in [select.args["from_"].this, *[j.this for j in select.args.get("joins") or []]]:
            if isinstance(node, exp.Subquery):
                feed = node.find(exp.Anonymous)
                window = ", ".join(e.sql("spark") for e in feed.expressions[1:])
                if isinstance(node.this, exp.Union):  # reads.table_before
                    pinned = next(t for t in node.find_all(exp.Table) if t.args.get("version"))
                    version = pinned.args["version"].expression.sql("spark")
                    reads.append(f"{node.alias}: version {version} less changes {window}")
                else:
                    reads.append(f"{node.alias}: changes {window}")
            else:
                reads.append(
                    f"{node.alias}: version {node.args['version'].expression.sql('spark')}"
                )
        terms.append("; ".join(reads))
    return terms


def test_self_join_changes_telescope_over_both_occurrences() -> None:
    plan, _ = compile_with(SELF_JOIN_SQL, SELF_JOIN_DESCRIBE)
    changes = signed_rows(plan, {ORDERS_TABLE: Window(recorded=4, pinned=6)})
    # dR x R + R' x dR: the first occurrence's change against the second as
    # recorded (read as version 6 less the changes, no old snapshot), then the
    # second's change against the first as pinned.
    assert _term_reads(changes.sql("spark")) == [
        "a: changes 5, 6; b: version 6 less changes 5, 6",
        "a: version 6; b: changes 5, 6",
    ]


def test_changes_leave_out_sources_without_commits() -> None:
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    unchanged = Window(recorded=5, pinned=5)
    assert not unchanged.changed
    changes = signed_rows(plan, {ORDERS_TABLE: unchanged, CUSTOMERS_TABLE: Window(3, 4)})
    assert _term_reads(changes.sql("spark")) == ["o: version 5; c: changes 4, 4"]
    with pytest.raises(ValueError, match="at least one source with changes"):
        signed_rows(plan, {ORDERS_TABLE: unchanged, CUSTOMERS_TABLE: Window(4, 4)})


# -- MIN, MAX and COUNT(DISTINCT) -----------------------------------------------------

EXTREMES_SQL = (
    "SELECT customer, MIN(qty) AS lowest, MAX(qty) AS highest, "
    "COUNT(DISTINCT amount) AS amounts, COUNT(qty) AS counted FROM shop.orders GROUP BY customer"
)
EXTREMES_DESCRIBE = [
    ("customer", "string"),
    ("lowest", "int"),
    ("highest", "int"),
    ("amounts", "bigint"),
    ("counted", "bigint"),
]
EXTREMES_PROBE = [("key_0", "string"), ("value_0", "int"), ("value_1", "decimal(10,2)")]


def test_min_max_and_count_distinct_plan() -> None:
    plan, _ = compile_with(EXTREMES_SQL, EXTREMES_DESCRIBE, EXTREMES_PROBE)
    assert plan.view_class is ViewClass.GROUPED_AGGREGATE
    assert [(c.name, c.rule, c.preaggregation) for c in plan.state_columns] == [
        ("__ivm_g0", MergeRule.KEY, None),
        ("__ivm_count", MergeRule.ADD, None),
        # COUNT(qty) is additive (a bounded MIN/MAX reads it too); MIN and MAX
        # of qty keep their best values, each in a pre-aggregation kept as an
        # array on the group row ...
        ("__ivm_nn_a0", MergeRule.ADD, None),
        ("__ivm_min_a0", MergeRule.RECOMPUTED, 1),
        ("__ivm_kv_a0_min", MergeRule.RECOMPUTED, 1),
        ("__ivm_max_a0", MergeRule.RECOMPUTED, 2),
        ("__ivm_kv_a0_max", MergeRule.RECOMPUTED, 2),
        # ... and COUNT(DISTINCT amount) keeps every value.
        ("__ivm_cd_a1", MergeRule.RECOMPUTED, 3),
    ]
    assert plan.preaggregations == (
        PreAggregation(
            argument_index=0,
            slot=1,
            argument="__ivm_arg0",
            value_column="__ivm_pv_a0_min",
            recomputed=(("__ivm_min_a0", "MIN"),),
            touched_flag="__ivm_touched_a0_min",
            kept=extremes.KEPT_VALUES,
        ),
        PreAggregation(
            argument_index=0,
            slot=2,
            argument="__ivm_arg0",
            value_column="__ivm_pv_a0_max",
            recomputed=(("__ivm_max_a0", "MAX"),),
            touched_flag="__ivm_touched_a0_max",
            kept=extremes.KEPT_VALUES,
        ),
        PreAggregation(
            argument_index=1,
            slot=3,
            argument="__ivm_arg1",
            value_column="__ivm_pv_a1",
            recomputed=(("__ivm_cd_a1", "COUNT"),),
            touched_flag="__ivm_touched_a1",
        ),
    )
    # Only COUNT(DISTINCT)'s values are rows of their own, matched by value.
    assert plan.merge_keys == ("__ivm_g0", "__ivm_slot", "__ivm_pv_a1")
    assert [o.expression.sql("spark") for o in plan.outputs] == [
        "`__ivm_g0`",
        "`__ivm_min_a0`",
        "`__ivm_max_a0`",
        "`__ivm_cd_a1`",
        "`__ivm_nn_a0`",
    ]
    # Another number of kept values is another state: the model is rebuilt.
    fewer, _ = compile_with(EXTREMES_SQL, EXTREMES_DESCRIBE, EXTREMES_PROBE, extremes_kept=4)
    assert fewer.fingerprint != plan.fingerprint


def test_min_max_keeping_every_value_share_one_pre_aggregation() -> None:
    """ivm_extreme_values='all': the pre-aggregation of every value, as COUNT(DISTINCT) keeps."""
    plan, catalog = compile_with(
        EXTREMES_SQL, EXTREMES_DESCRIBE, EXTREMES_PROBE, extremes_kept=None
    )
    assert [(c.name, c.rule, c.preaggregation) for c in plan.state_columns] == [
        ("__ivm_g0", MergeRule.KEY, None),
        ("__ivm_count", MergeRule.ADD, None),
        ("__ivm_nn_a0", MergeRule.ADD, None),
        ("__ivm_min_a0", MergeRule.RECOMPUTED, 1),
        ("__ivm_max_a0", MergeRule.RECOMPUTED, 1),
        ("__ivm_cd_a1", MergeRule.RECOMPUTED, 2),
    ]
    assert plan.preaggregations == (
        PreAggregation(
            argument_index=0,
            slot=1,
            argument="__ivm_arg0",
            value_column="__ivm_pv_a0",
            recomputed=(("__ivm_min_a0", "MIN"), ("__ivm_max_a0", "MAX")),
            touched_flag="__ivm_touched_a0",
        ),
        PreAggregation(
            argument_index=1,
            slot=2,
            argument="__ivm_arg1",
            value_column="__ivm_pv_a1",
            recomputed=(("__ivm_cd_a1", "COUNT"),),
            touched_flag="__ivm_touched_a1",
        ),
    )
    # A pre-aggregation row is told apart by its slot and identified by its value.
    assert plan.merge_keys == ("__ivm_g0", "__ivm_slot", "__ivm_pv_a0", "__ivm_pv_a1")
    assert [o.expression.sql("spark") for o in plan.outputs] == [
        "`__ivm_g0`",
        "`__ivm_min_a0`",
        "`__ivm_max_a0`",
        "`__ivm_cd_a1`",
        "`__ivm_nn_a0`",
    ]
    # A pre-aggregation row is told apart by its slot and identified by its value.
    assert plan.merge_keys == ("__ivm_g0", "__ivm_slot", "__ivm_pv_a0", "__ivm_pv_a1")
    assert [o.expression.sql("spark") for o in plan.outputs] == [
        "`__ivm_g0`",
        "`__ivm_min_a0`",
        "`__ivm_max_a0`",
        "`__ivm_cd_a1`",
        "`__ivm_nn_a0`",
    ]
    # The values are grouped by, so the probe asks their types (MIN keeps the type).
    assert catalog.probes == [
        (
            "SELECT `orders`.`customer` AS key_0, FIRST(`orders`.`qty`) AS value_0, "
            "FIRST(`orders`.`amount`) AS value_1 FROM `shop`.`orders` AS `orders` "
            "GROUP BY `orders`.`customer`"
        )
    ]


def test_global_max_keeps_its_group_row_and_its_values_on_it() -> None:
    plan, catalog = compile_with(
        "SELECT MAX(amount) AS highest FROM shop.orders",
        [("highest", "decimal(10,2)")],
        [("value_0", "decimal(10,2)")],
    )
    assert plan.view_class is ViewClass.GLOBAL_AGGREGATE
    assert plan.keys == ()
    # The one group row holds the kept values: nothing else to match or delete.
    assert plan.merge_keys == ()
    assert catalog.probes == [
        "SELECT FIRST(`orders`.`amount`) AS value_0 FROM `shop`.`orders` AS `orders`"
    ]
    merge = emit.merge_changes(plan, STATE, {ORDERS_TABLE: Window(recorded=1, pinned=2)}, GUARD)
    assert "THEN DELETE" not in merge.replace("WHEN NOT MATCHED BY SOURCE", "")
    assert "`__ivm_kv_a0_max` = IF(`__ivm_d`.`__ivm_touched_a0_max` = TRUE" in merge
    view = emit.create_view(plan, STATE, TableName(db="analytics", name="my_model"))
    assert view.endswith("FROM `analytics`.`my_model__ivm_state` WHERE `__ivm_guard` IS NULL")


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
    source = TableName(db="shop", name="order lines")
    merge = emit.merge_changes(plan, state, {source: Window(recorded=0, pinned=2)}, GUARD)
    assert "TABLE_CHANGES('`shop`.`order lines`', 1, 2)" in merge
    assert "`order lines`.`line id` AS `__ivm_g0`" in merge
    assert "`shop`.`order lines` VERSION AS OF 3 AS `order lines`" in emit.create_state(
        plan, state, {source: 3}, "r-1"
    )
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
    assert plan.keys == ("__ivm_g0",)
    assert plan.rows.sql("spark") == (
        "SELECT `orders`.`customer` AS `__ivm_g0` FROM `shop`.`orders` AS `orders`"
    )
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
    assert implicit.keys == ("__ivm_g0", "__ivm_g1")
    assert implicit.rows.sql("spark") == (
        "SELECT UPPER(`orders`.`customer`) AS `__ivm_g0`, `orders`.`qty` + 1 AS `__ivm_g1`, "
        "`orders`.`amount` AS `__ivm_arg0` FROM `shop`.`orders` AS `orders`"
    )
    assert implicit.rows == explicit.rows
    versions = {ORDERS_TABLE: 3}
    windows = {ORDERS_TABLE: Window(recorded=3, pinned=5)}
    # The state and its maintenance are the same; only the recorded model text differs.
    assert emit.create_state(implicit, STATE, versions, "r-1") == emit.create_state(
        explicit, STATE, versions, "r-1"
    )
    assert emit.merge_changes(implicit, STATE, windows, GUARD) == emit.merge_changes(
        explicit, STATE, windows, GUARD
    )
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
            "SELECT KURTOSIS(qty) AS k FROM shop.orders", [("k", "double")], id="kurtosis"
        ),
    ],
)
def test_aggregates_unknown_to_sqlglot_are_refused(
    sql: str, describe: list[tuple[str, str]]
) -> None:
    with pytest.raises(NotMaintainable, match=r"the aggregate "):
        compile_with(sql, describe)


# -- semi and anti joins (rules/semi_joins.py) -----------------------------------

SHIPMENTS = {**SOURCES, "shop.shipments": [("id", "int"), ("carrier", "string")]}


def _terms(plan) -> list[tuple[int, list[str]]]:
    """Each join term's sign and the roles of its key relations (keys, null, rows)."""
    return [
        (term.sign, [relation.alias.rsplit("_", 1)[1] for relation in term.key_relations])
        for term in plan.join_terms
    ]


@pytest.mark.parametrize(
    ("condition", "terms"),
    [
        # L ⋈ K
        ("EXISTS (SELECT 1 FROM shop.shipments s WHERE s.id = o.id)", [(1, ["keys"])]),
        ("o.id IN (SELECT id FROM shop.shipments)", [(1, ["keys"])]),
        # L - L ⋈ K
        (
            "NOT EXISTS (SELECT 1 FROM shop.shipments s WHERE s.id = o.id)",
            [(1, []), (-1, ["keys"])],
        ),
        # L - L ⋈ M - σ(x NULL) L ⋈ E - σ(x not NULL) L ⋈ N + L ⋈ N ⋈ M
        (
            "o.id NOT IN (SELECT id FROM shop.shipments)",
            [(1, []), (-1, ["keys"]), (-1, ["rows"]), (-1, ["null"]), (1, ["null", "keys"])],
        ),
        # A subquery without NULLs has an empty N.
        (
            "o.id NOT IN (SELECT id FROM shop.shipments WHERE id IS NOT NULL)",
            [(1, []), (-1, ["keys"]), (-1, ["rows"])],
        ),
    ],
)
def test_semi_and_anti_join_terms(condition: str, terms: list[tuple[int, list[str]]]) -> None:
    sql = f"SELECT o.customer FROM shop.orders o WHERE {condition}"
    plan, _ = compile_with(sql, [("customer", "string")], sources=SHIPMENTS)
    assert _terms(plan) == terms
    # The build reads the subquery's table as one more source, and pins it.
    assert plan.sources[1].table == TableName(db="shop", name="shipments")
    assert len(plan.tables) == 2


def test_not_in_terms_split_on_the_tested_value_being_null() -> None:
    sql = "SELECT o.customer FROM shop.orders o WHERE o.id NOT IN (SELECT id FROM shop.shipments)"
    plan, _ = compile_with(sql, [("customer", "string")], sources=SHIPMENTS)
    wheres = [
        t.rows.args["where"].this.sql("spark") if t.rows.args.get("where") else ""
        for t in plan.join_terms
    ]
    assert wheres == ["", "", "`o`.`id` IS NULL", "NOT `o`.`id` IS NULL", ""]
    # The NULL rule of the build's anti join is Spark's own NOT IN rewrite.
    anti = plan.rows.args["joins"][0]
    assert (anti.side, anti.kind) == ("LEFT", "ANTI")
    assert anti.args["on"].sql("spark") == (
        "`o`.`id` = `shipments`.`id` OR (`o`.`id` = `shipments`.`id`) IS NULL"
    )


def test_uncorrelated_exists_is_one_key_true() -> None:
    sql = "SELECT customer FROM shop.orders WHERE EXISTS (SELECT 1 FROM shop.shipments WHERE carrier = 'ups')"
    plan, _ = compile_with(sql, [("customer", "string")], sources=SHIPMENTS)
    (term,) = plan.join_terms
    (relation,) = term.key_relations
    assert relation.keys == (exp.true(),)
    assert relation.condition.sql("spark") == "`shipments`.`carrier` = 'ups'"
    assert term.rows.args["joins"][0].args["on"].sql("spark") == (
        f"TRUE = `{relation.alias}`.`__ivm_k0`"
    )


def test_subquery_over_the_models_own_table_takes_another_alias() -> None:
    sql = "SELECT id FROM shop.orders WHERE id IN (SELECT qty FROM shop.orders WHERE qty > 0)"
    plan, _ = compile_with(sql, [("id", "int")])
    assert plan.sources == (
        SourceRef(alias="orders", table=ORDERS_TABLE),
        SourceRef(alias="__ivm_sq0", table=ORDERS_TABLE),
    )
    (relation,) = plan.join_terms[0].key_relations
    assert relation.keys[0].sql("spark") == "`__ivm_sq0`.`qty`"
    assert relation.condition.sql("spark") == "`__ivm_sq0`.`qty` > 0"


def test_conditions_on_the_outer_row_go_into_the_key_join() -> None:
    # A row failing o.qty > 0 has an empty subquery: NOT EXISTS keeps it.
    sql = (
        "SELECT o.customer FROM shop.orders o WHERE NOT EXISTS "
        "(SELECT 1 FROM shop.shipments s WHERE s.id = o.id AND o.qty > 0 AND s.carrier = 'ups')"
    )
    plan, _ = compile_with(sql, [("customer", "string")], sources=SHIPMENTS)
    kept, removed = plan.join_terms
    assert kept.rows.args.get("joins") is None
    (relation,) = removed.key_relations
    assert relation.condition.sql("spark") == "`s`.`carrier` = 'ups'"
    assert removed.rows.args["joins"][0].args["on"].sql("spark") == (
        f"`o`.`id` = `{relation.alias}`.`__ivm_k0` AND `o`.`qty` > 0"
    )


def test_a_stale_guard_raises_the_error_the_adapter_recognises() -> None:
    error = emit.stale_guard_error(STATE, GUARD).sql(dialect="spark")
    assert error == (
        "RAISE_ERROR('ivm guard: analytics.my_model__ivm_state no longer holds refresh "
        "r-read: another refresh committed to it after this one read it')"
    )
    from dbt.adapters.spark_ivm.delta.errors import is_concurrent_refresh

    message = error.split("RAISE_ERROR('")[1].split("')")[0]
    assert is_concurrent_refresh(Exception(f"[USER_RAISED_EXCEPTION] {message}"))


def test_every_merge_checks_and_moves_the_guard_row() -> None:
    plan, _ = compile_with(GROUPED_SQL, GROUPED_DESCRIBE, GROUPED_PROBE)
    merge = sqlglot.parse_one(
        emit.merge_changes(plan, STATE, {ORDERS_TABLE: Window(recorded=1, pinned=2)}, GUARD),
        read="spark",
    )
    assert isinstance(merge, exp.Merge)
    # The source is the change rows, with a NULL guard, plus the guard source row
    # holding the refresh id read, appended by a full join that matches nothing.
    source = merge.args["using"]
    assert source.alias == "__ivm_d"
    assert source.this.selects[-1].sql("spark") == "`__ivm_check`.`__ivm_guard`"
    (join,) = source.this.args["joins"]
    assert join.side == "FULL" and join.args["on"] == exp.false()
    assert join.this.this.sql("spark") == "SELECT 'r-read' AS `__ivm_guard`"
    # The source does not read the state: the MERGE's own match is the check.
    assert "my_model__ivm_state" not in source.sql("spark")
    # The guard source row meets the guard row in ON only while it holds r-read...
    assert (
        merge.args["on"]
        .sql("spark")
        .endswith("AND `__ivm_t`.`__ivm_guard` IS NOT DISTINCT FROM `__ivm_d`.`__ivm_guard`")
    )
    # ... and the first clause then moves it to this refresh; model rows are
    # inserted with a NULL guard; a guard source row left unmatched (another
    # refresh moved the guard) reaches the last clause, which raises.
    move, *_, insert, refuse = merge.args["whens"].expressions
    assert move.sql("spark") == (
        "WHEN MATCHED AND NOT `__ivm_d`.`__ivm_guard` IS NULL "
        "THEN UPDATE SET `__ivm_t`.`__ivm_guard` = 'r-this'"
    )
    assert insert.args["condition"].sql("spark") == "`__ivm_d`.`__ivm_guard` IS NULL"
    assert "CAST(NULL AS STRING)" in insert.sql("spark")
    # Only the guard source row: a change row no clause inserts is left alone.
    assert not refuse.args.get("matched")
    assert refuse.args["condition"].sql("spark") == "NOT `__ivm_d`.`__ivm_guard` IS NULL"
    assert emit.stale_guard_error(STATE, GUARD).sql("spark") in refuse.sql("spark")


def test_the_state_is_built_with_its_guard_row_and_the_view_leaves_it_out() -> None:
    plan, _ = compile_with(GROUPED_SQL, GROUPED_DESCRIBE, GROUPED_PROBE)
    create = sqlglot.parse_one(
        emit.create_state(plan, STATE, {ORDERS_TABLE: 3}, "r-1"), read="spark"
    )
    union = create.expression
    assert isinstance(union, exp.Union) and not union.args.get("distinct")
    guard_row = union.expression
    values = {e.alias: e.this for e in guard_row.expressions}
    assert list(values) == [*(c.name for c in plan.state_columns), "__ivm_guard"]
    assert values.pop("__ivm_guard") == exp.Literal.string("r-1")
    assert all(isinstance(v, exp.Null) for v in values.values())
    view = emit.view_query(plan, STATE).sql("spark")
    assert "WHERE `__ivm_guard` IS NULL" in view


def test_a_moments_change_whose_parts_cancel_inserts_no_row() -> None:
    """A group the state lacks, inserted and deleted in one window: its STDDEV change carries
    its inserted and removed values apart, so the change row exists, with a count of 0."""
    sql = "SELECT customer, STDDEV(qty) AS sd FROM shop.orders GROUP BY customer"
    plan, _ = compile_with(
        sql,
        [("customer", "string"), ("sd", "double")],
        [("key_0", "string"), ("sum_0", "bigint")],
    )
    merge = sqlglot.parse_one(
        emit.merge_changes(plan, STATE, {ORDERS_TABLE: Window(recorded=1, pinned=2)}, GUARD),
        read="spark",
    )
    *_, insert, refuse = merge.args["whens"].expressions
    assert insert.args["condition"].sql("spark") == (
        "`__ivm_d`.`__ivm_guard` IS NULL AND `__ivm_d`.`__ivm_count` <> 0"
    )
    assert refuse.args["condition"] is not None


def test_only_a_merge_over_moments_turns_constraint_propagation_off() -> None:
    """The merged moments' layers (merge_source.py) need it off; every other MERGE keeps it."""
    moments_plan, _ = compile_with(
        "SELECT customer, STDDEV(qty) AS sd FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("sd", "double")],
        [("key_0", "string"), ("sum_0", "bigint")],
    )
    sums_plan, _ = compile_with(
        "SELECT customer, SUM(qty) AS total FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("total", "bigint")],
        [("key_0", "string"), ("sum_0", "bigint")],
    )
    assert emit.merge_settings(moments_plan) == {"spark.sql.constraintPropagation.enabled": "false"}
    assert emit.merge_settings(sums_plan) == {}


def test_recomputing_cancelled_groups_replaces_them_before_merging_the_rest() -> None:
    plan, _ = compile_with(
        "SELECT customer, STDDEV(qty) AS sd FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("sd", "double")],
        [("key_0", "string"), ("sum_0", "bigint")],
    )
    merge = sqlglot.parse_one(
        emit.merge_changes_recomputing_cancelled(
            plan, STATE, {ORDERS_TABLE: Window(recorded=1, pinned=2)}, {ORDERS_TABLE: 2}, GUARD
        ),
        read="spark",
    )
    move, replace, *_ = merge.args["whens"].expressions
    assert move.args["condition"].sql("spark") == "NOT `__ivm_d`.`__ivm_guard` IS NULL"
    assert replace.args["condition"].sql("spark") == "`__ivm_d`.`__ivm_replacing`"
    inserts = [w for w in merge.args["whens"].expressions if not w.args.get("matched")]
    assert "`__ivm_d`.`__ivm_replacing`" in inserts[0].args["condition"].sql("spark")
    source = merge.args["using"].sql("spark")
    # The recomputed rows read the source at the pinned version, only for cancelled groups.
    assert "VERSION AS OF 2" in source and "LEFT SEMI JOIN" in source
    assert "NOT COALESCE(`__ivm_cancelled`, FALSE)" in source


def test_a_plan_with_pre_aggregations_recomputes_the_model_instead() -> None:
    plan, _ = compile_with(
        "SELECT customer, STDDEV(qty) AS sd, MAX(qty) AS mx FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("sd", "double"), ("mx", "bigint")],
        [("key_0", "string"), ("sum_0", "bigint"), ("value_0", "bigint")],
    )
    assert plan.preaggregations and not merge_source.recomputes_groups(plan)
