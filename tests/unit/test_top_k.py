"""Top-k models: the state keeps every row or the best ones, the view orders and limits."""

from __future__ import annotations

import re

import pytest

from ivm_compiler import NotMaintainable, TableName, compile_model, emit, reads
from ivm_compiler.plan import UpstreamModel
from ivm_compiler.rules import top_k_buffer
from ivm_compiler.view_classes.top_k import Ordering, TopK
from tests.unit.golden import FakeCatalog

MODEL = "model.shop.top"
SOURCES = {"shop.t": [("a", "int"), ("b", "int"), ("s", "string")]}
GROUPED = "SELECT s, COUNT(*) AS n, SUM(b) AS sb FROM shop.t GROUP BY s"
GROUPED_TYPES = [("s", "string"), ("n", "bigint"), ("sb", "bigint")]
# Spark's answer for the SUM's argument types (the compiler's probe query).
PROBE = [("key_0", "string"), ("sum_0", "bigint")]


def _compile(sql: str, describe=GROUPED_TYPES, upstreams=None):
    return compile_model(MODEL, sql, FakeCatalog(SOURCES, sql, describe, PROBE), upstreams)


def test_the_state_is_the_query_without_order_and_limit() -> None:
    top = _compile(f"{GROUPED} ORDER BY n DESC, s LIMIT 3")
    plain = _compile(GROUPED)
    assert top.top_k == TopK(
        order=(Ordering("n", descending=True, nulls_first=False), Ordering("s", False, True)),
        limit=3,
    )
    assert top.state_columns == plain.state_columns
    assert top.rows.sql() == plain.rows.sql()
    # Another k is another view: the fingerprint says the model changed.
    assert top.fingerprint != plain.fingerprint
    assert top.fingerprint != _compile(f"{GROUPED} ORDER BY n DESC, s LIMIT 4").fingerprint


def test_the_view_orders_the_full_ranking_and_keeps_k_rows() -> None:
    plan = _compile(f"{GROUPED} ORDER BY 2 DESC NULLS FIRST, s LIMIT 3")
    view = emit.view_query(plan, TableName("shop", "top__ivm_state"), version=7)
    sql = view.sql(dialect="spark")
    assert sql.startswith("SELECT * FROM (SELECT ")
    assert sql.endswith(") AS `__ivm_ranked` ORDER BY `n` DESC NULLS FIRST, `s` ASC LIMIT 3"), sql
    assert "VERSION AS OF 7" in sql
    # The model's query as written, for the oracle, keeps its LIMIT.
    assert "LIMIT 3" in emit.model_query(plan, {TableName("shop", "t"): 5})


@pytest.mark.parametrize(
    ("sql", "construct"),
    [
        (f"{GROUPED} ORDER BY SUM(a) LIMIT 3", r"^ORDER BY SUM\(a\) with LIMIT, which is not"),
        (f"{GROUPED} ORDER BY n LIMIT 3 OFFSET 1", r"^LIMIT/OFFSET$"),
        (f"{GROUPED} LIMIT 3", r"^LIMIT/OFFSET$"),
        (f"{GROUPED} ORDER BY n", r"^ORDER BY$"),
    ],
)
def test_what_the_view_cannot_order_is_refused(sql: str, construct: str) -> None:
    with pytest.raises(NotMaintainable) as raised:
        _compile(sql)
    assert re.search(construct, raised.value.construct), raised.value.construct


def test_a_model_over_a_top_k_model_is_refused() -> None:
    from sqlglot import parse_one

    upstream_view = parse_one(
        "SELECT * FROM (SELECT a FROM shop.up__ivm_state VERSION AS OF 3) AS r ORDER BY a LIMIT 2",
        read="spark",
    )
    upstreams = {
        TableName("shop", "t"): UpstreamModel(
            state=TableName("shop", "t__ivm_state"), view=upstream_view, published_version=3
        )
    }
    with pytest.raises(NotMaintainable, match="whose view shows only its top rows"):
        _compile("SELECT a FROM shop.t", describe=[("a", "int")], upstreams=upstreams)


# -- a state kept to its best rows (rules/top_k_buffer.py) ------------------------------------

ROWS = "SELECT a, s FROM shop.t WHERE b > 0"
ROWS_TYPES = [("a", "int"), ("s", "string")]
STATE = TableName("shop", "top__ivm_state")
VERSIONS = {TableName("shop", "t"): 5}
RANGES = {TableName("shop", "t"): reads.VersionRange(recorded=4, pinned=5)}
GUARD = emit.Guard(read="g1", write="g2")


def test_a_projections_build_keeps_its_best_rows_up_to_an_edge() -> None:
    plan = _compile(f"{ROWS} ORDER BY a DESC, s LIMIT 3", describe=ROWS_TYPES)
    assert top_k_buffer.keeps_best_rows(plan)
    create = emit.create_state(plan, STATE, VERSIONS, "g1")
    # The 10,000th best row is the edge; the rows at or before it are kept.
    assert "ORDER BY `__ivm_edge0` DESC, `__ivm_edge1` ASC LIMIT 10000" in create
    assert "ORDER BY `__ivm_edge0` ASC, `__ivm_edge1` DESC LIMIT 1" in create
    assert "CROSS JOIN" in create
    # The edge is found among the flattened rows; only those up to it are grouped.
    assert "FROM __ivm_rows ORDER BY `__ivm_edge0` DESC" in create
    assert "FROM __ivm_best GROUP BY `__ivm_g0`, `__ivm_g1`" in create
    # The view still orders the state and keeps k.
    assert emit.view_query(plan, STATE).sql(dialect="spark").endswith("LIMIT 3")


def test_an_aggregates_top_k_keeps_every_group() -> None:
    """A group's values change with any change: one past the edge may move before it."""
    plan = _compile(f"{GROUPED} ORDER BY n DESC, s LIMIT 3")
    assert not top_k_buffer.keeps_best_rows(plan)
    assert "__ivm_edge" not in emit.create_state(plan, STATE, VERSIONS, "g1")
    assert "__ivm_edge" not in emit.merge_changes(plan, STATE, RANGES, GUARD)


def test_a_change_is_kept_to_the_states_edge_unless_it_shows_fewer_than_k() -> None:
    plan = _compile(f"{ROWS} ORDER BY a DESC, s LIMIT 3", describe=ROWS_TYPES)
    merge = emit.merge_changes(plan, STATE, RANGES, GUARD)
    # The edge is the state's worst row, and what it shows, read from the state the MERGE writes.
    worst = (
        "SELECT `__ivm_g0` AS `__ivm_edge0`, `__ivm_g1` AS `__ivm_edge1` FROM `shop`.`top__ivm_state` "
        "WHERE `__ivm_guard` IS NULL AND `__ivm_count` > 0) AS `__ivm_edge` "
        "ORDER BY `__ivm_edge0` ASC, `__ivm_edge1` DESC LIMIT 1"
    )
    assert worst in merge, merge
    assert "WHERE `__ivm_edge`.`__ivm_shown` < 3 OR " in merge
    # A change that may leave fewer than 3 rows fails the MERGE, which wrote nothing.
    short = "WHEN MATCHED AND `__ivm_d`.`__ivm_short` THEN UPDATE SET `__ivm_t`.`__ivm_guard` = RAISE_ERROR('ivm top-k short"
    assert short in merge
    # The staged change rows (emit.stage_change_rows) are kept to it likewise.
    assert worst in emit.stage_change_rows(plan, STATE, RANGES, "__ivm_staged_x_rows")
    # Over staged signed rows (emit.stage_changes), the edge wraps the query reading them.
    staged = emit.merge_changes(plan, STATE, RANGES, GUARD, staged="__ivm_staged_x")
    assert worst in staged and "FROM `__ivm_staged_x` GROUP BY" in staged
    assert "__ivm_changes" not in staged


@pytest.mark.parametrize(
    ("sql", "removed"),
    [
        (
            f"{ROWS} ORDER BY a LIMIT 3",
            "SUM(IF(`__ivm_kept`.`__ivm_count` < 0, -`__ivm_kept`.`__ivm_count`, 0))",
        ),
        (
            "SELECT DISTINCT a, s FROM shop.t ORDER BY a LIMIT 3",
            "SUM(IF(`__ivm_kept`.`__ivm_count` < 0, 1, 0))",
        ),
    ],
)
def test_a_change_may_leave_too_few_by_a_projections_copies_or_distinct_rows(
    sql: str, removed: str
) -> None:
    """Counted against what the view shows: every copy a projection loses, a DISTINCT row per
    change row that lowers its count (which may not empty it: an over-count, never an under-count)."""
    merge = emit.merge_changes(_compile(sql, describe=ROWS_TYPES), STATE, RANGES, GUARD)
    assert f"`__ivm_edge`.`__ivm_shown` - {removed} OVER () < 3 AS `__ivm_short`" in merge, merge
