"""WINDOW models: which plans the compiler makes, the idioms that reach it through
plan nodes, and the ties rule (the emitted SQL is in fixtures/windows.sql)."""

from __future__ import annotations

from sqlglot import exp

from ivm_compiler import TableName, ViewClass, compile_model, emit
from ivm_compiler.nodes import split_nodes
from ivm_compiler.parse import parse_model
from ivm_compiler.sql import DIALECT
from tests.unit.golden import FakeCatalog

MODEL = "model.shop.m"
SOURCES = {"shop.src": [("id", "int"), ("k", "int"), ("ts", "int"), ("v", "decimal(10,2)")]}


def _columns(table: TableName) -> list[tuple[str, str]]:
    return SOURCES[str(table)]


def _compile(sql: str, describe: list[tuple[str, str]]):
    return compile_model(MODEL, sql, FakeCatalog(SOURCES, sql, describe))


def test_the_dedupe_idiom_is_one_window_model_with_its_filter_kept() -> None:
    # The filter over the ranking is folded into it (window_filters.py): no plan
    # node, one state holding the kept rows only.
    sql = (
        "select id, k, v from (select *, row_number() over (partition by k order by ts desc, id) "
        "as rn from shop.src) where rn = 1"
    )
    split = split_nodes(MODEL, sql, TableName("shop", "m"), _columns)
    assert split.nodes == () and split.sql == sql
    plan = _compile(sql, [("id", "int"), ("k", "int"), ("v", "decimal(10,2)")])
    assert plan.view_class is ViewClass.WINDOW
    assert [p.source.sql(dialect=DIALECT) for p in plan.window_partition] == ["`src`.`k`"]
    assert plan.rows.args["qualify"].sql(dialect="duckdb") == (
        'QUALIFY ROW_NUMBER() OVER (PARTITION BY "src"."k" ORDER BY "src"."ts" DESC, '
        '"src"."id" NULLS FIRST) = 1'
    )
    # Spark is sent the filter over a derived table: it does not parse QUALIFY.
    built = emit.create_state(
        plan, TableName("shop", "m__ivm_state"), {TableName("shop", "src"): 3}, "g"
    )
    assert "QUALIFY" not in built.upper() and "ROW_NUMBER() OVER" in built


def test_a_ranking_read_twice_stays_a_window_node() -> None:
    sql = (
        "with r as (select *, row_number() over (partition by k order by ts desc, id) as rn "
        "from shop.src) select a.id, b.v from r as a join r as b on a.k = b.k where a.rn = 1"
    )
    split = split_nodes(MODEL, sql, TableName("shop", "m"), _columns)
    (node,) = split.nodes
    assert "ROW_NUMBER()" in node.sql
    outer = parse_model(MODEL, split.sql)
    assert outer.find(exp.Window) is None


def test_a_window_operand_of_a_set_operation_is_a_node() -> None:
    sql = (
        "select k, rank() over (partition by k order by ts) as r from shop.src "
        "union all select k, 0 from shop.src"
    )
    split = split_nodes(MODEL, sql, TableName("shop", "m"), _columns)
    (node,) = split.nodes
    assert node.name == "operand_1" and "RANK()" in node.sql


def test_the_partition_is_what_every_window_partitions_by() -> None:
    plan = _compile(
        "select id, sum(v) over (partition by k, ts) as a, min(v) over (partition by ts, k) as b, "
        "max(v) over (partition by k, id) as c from shop.src",
        [("id", "int"), ("a", "decimal(20,2)"), ("b", "decimal(10,2)"), ("c", "decimal(10,2)")],
    )
    assert [p.source.name for p in plan.window_partition] == ["k"]
    # k is not an output: it becomes a state key column of its own.
    (partition,) = plan.window_partition
    assert partition.state_column == plan.keys[-1]
    assert partition.data_type == "int"


def test_no_common_partition_column_leaves_the_plan_without_partition() -> None:
    for sql in (
        "select id, row_number() over (order by ts, id, k, v) as rn from shop.src",
        (
            "select id, sum(v) over (partition by k) as a, sum(v) over (partition by ts) as b "
            "from shop.src"
        ),
        # An expression is no plain column: it does not bound what a change reaches.
        "select id, count(*) over (partition by k % 2) as n from shop.src",
    ):
        outputs = [(p.alias_or_name, "int") for p in parse_model(MODEL, sql).expressions]
        plan = _compile(sql, outputs)
        assert plan.view_class is ViewClass.WINDOW
        assert plan.window_partition == (), sql


def test_ties_rule_warns_when_the_order_leaves_a_column_out() -> None:
    sql = (
        "select id, row_number() over (partition by k order by ts) as rn, "
        "lead(ts) over (partition by k order by ts, id, v) as nxt, "
        "rank() over (partition by k order by ts) as r, "
        "sum(v) over (partition by k order by ts) as running from shop.src"
    )
    plan = _compile(
        sql,
        [("id", "int"), ("rn", "int"), ("nxt", "int"), ("r", "int"), ("running", "decimal(20,2)")],
    )
    # ROW_NUMBER leaves id and v out; LEAD names every column; RANK gives ties one
    # value; SUM's default frame (RANGE) sums ties together.
    (warning,) = plan.tie_warnings
    assert warning.startswith(f"Model '{MODEL}': ROW_NUMBER() OVER (PARTITION BY `src`.`k`")
    assert "does not order by id, v" in warning
    # A ROWS frame counts rows, so ties matter there.
    plan = _compile(
        "select id, sum(v) over (partition by k order by ts rows between 1 preceding and "
        "current row) as s from shop.src",
        [("id", "int"), ("s", "decimal(20,2)")],
    )
    assert len(plan.tie_warnings) == 1 and "does not order by id, v" in plan.tie_warnings[0]


def test_ivm_explain_shows_the_probe_and_the_partition_merge() -> None:
    from types import SimpleNamespace

    from dbt.adapters.spark_ivm.operations.explain import _change_statements
    from ivm_compiler.reads import VersionRange as Window

    source = TableName("shop", "src")
    refresh = SimpleNamespace(state=TableName("shop", "m__ivm_state"))
    plan = _compile(
        "select id, rank() over (partition by k order by ts) as r from shop.src",
        [("id", "int"), ("r", "int")],
    )
    guard = emit.Guard(read="r-0", write="r-1")
    shown = _change_statements(  # type: ignore[arg-type]
        plan, refresh, {source: Window(3, 4)}, {source: 4}, guard, pending=True
    )
    assert sorted(shown) == ["merge_partitions", "probe_partitions"]
    assert "TABLE_CHANGES('`shop`.`src`', 4, 4)" in shown["probe_partitions"]
    # No keys yet: the predicate is FALSE until the probe answers.
    assert "WHERE FALSE" in shown["merge_partitions"]
    unpartitioned = _compile(
        "select id, rank() over (order by ts, id, k, v) as r from shop.src",
        [("id", "int"), ("r", "int")],
    )
    assert (
        _change_statements(  # type: ignore[arg-type]
            unpartitioned, refresh, {source: Window(3, 4)}, {source: 4}, guard, pending=True
        )
        == {}
    )
