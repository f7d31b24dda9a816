"""Top-k models: the state keeps every row, the view orders and limits."""

from __future__ import annotations

import re

import pytest

from ivm_compiler import NotMaintainable, TableName, compile_model, emit
from ivm_compiler.plan import UpstreamModel
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
