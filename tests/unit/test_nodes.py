"""Plan nodes: which CTEs and FROM-subqueries become nodes, and what each part reads."""

from __future__ import annotations

import pytest
from sqlglot import exp

from ivm_compiler import NotMaintainable, TableName
from ivm_compiler.nodes import node_relation, split_nodes
from ivm_compiler.parse import parse_model

MODEL = "model.shop.m"
RELATION = TableName("shop", "m")
SOURCES = {
    "shop.t": [("a", "int"), ("b", "int")],
    "shop.u": [("a", "int"), ("name", "string")],
}


def _columns(table: TableName) -> list[tuple[str, str]]:
    return SOURCES[str(table)]


def _split(sql: str):
    return split_nodes(MODEL, sql, RELATION, _columns)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a, b FROM shop.t WHERE b > 1",
        # Relations that only filter, project and join merge into the query.
        "WITH f AS (SELECT a FROM shop.t WHERE b > 1) SELECT f.a, u.name FROM f JOIN shop.u ON f.a = u.a",
        "SELECT x.a FROM (SELECT a FROM shop.t) x",
        "SELECT a, COUNT(*) AS n FROM shop.t GROUP BY a",
    ],
)
def test_a_query_without_unmergeable_relations_is_kept_as_written(sql: str) -> None:
    split = _split(sql)
    assert split.sql == sql
    assert split.nodes == ()


def test_an_aggregating_cte_becomes_a_node_the_query_reads_by_its_name() -> None:
    split = _split(
        "WITH totals AS (SELECT a, SUM(b) AS sb FROM shop.t GROUP BY a) "
        "SELECT u.name, totals.sb FROM shop.u JOIN totals ON u.a = totals.a"
    )
    (node,) = split.nodes
    assert node.name == "totals"
    assert node.relation == TableName("shop", "m__ivm_cte_totals")
    assert "GROUP BY" in node.sql and "shop`.`t`" in node.sql
    outer = parse_model(MODEL, split.sql)
    tables = {t.sql(dialect="spark") for t in outer.find_all(exp.Table)}
    assert tables == {"`shop`.`u` AS `u`", "`shop`.`m__ivm_cte_totals` AS `totals`"}


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ("SELECT x.n FROM (SELECT a, COUNT(*) AS n FROM shop.t GROUP BY a) AS x", ["x"]),
        ("WITH x AS (SELECT DISTINCT a FROM shop.t) SELECT a FROM x", ["x"]),
        ("SELECT x.a FROM (SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u) x", ["x"]),
        # Set operations: an operand that aggregates, dedupes or is another operation.
        (
            "SELECT a FROM shop.t UNION SELECT a FROM shop.u INTERSECT SELECT a FROM shop.t",
            ["operand_2"],
        ),
        (
            "SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u EXCEPT SELECT b FROM shop.t",
            ["operand_1"],
        ),
        ("SELECT a FROM shop.t EXCEPT SELECT COUNT(*) AS a FROM shop.u", ["operand_2"]),
        ("SELECT DISTINCT a FROM shop.t UNION ALL SELECT a FROM shop.u", ["operand_1"]),
        # A filtering subquery inside an aggregating one merges into it first.
        (
            (
                "SELECT y.a FROM (SELECT a, MAX(b) AS m FROM (SELECT * FROM shop.t WHERE b > 0) z "
                "GROUP BY a) y"
            ),
            ["y"],
        ),
        # The second node reads the first.
        (
            (
                "WITH d AS (SELECT DISTINCT a FROM shop.t), "
                "c AS (SELECT d.a, COUNT(*) AS n FROM d JOIN shop.u ON d.a = u.a GROUP BY d.a) "
                "SELECT c.a, c.n FROM c"
            ),
            ["d", "c"],
        ),
    ],
)
def test_relations_that_change_row_counts_become_nodes_in_refresh_order(
    sql: str, names: list[str]
) -> None:
    split = _split(sql)
    assert [node.name for node in split.nodes] == names
    earlier: set[str] = set()
    for node in split.nodes:
        read = {str(t) for t in _read_tables(node.sql)}
        # A node reads sources and earlier nodes only, never a CTE name.
        assert read <= {*SOURCES, *earlier}, (node.name, read)
        earlier.add(str(node.relation))
    assert {str(t) for t in _read_tables(split.sql)} <= {*SOURCES, *earlier}


def _read_tables(sql: str) -> set[TableName]:
    return {TableName.of(t) for t in parse_model(MODEL, sql).find_all(exp.Table)}


def test_the_same_source_in_a_node_and_in_the_query() -> None:
    split = _split(
        "SELECT t.a, t.b FROM shop.t JOIN (SELECT a, MAX(b) AS mb FROM shop.t GROUP BY a) m "
        "ON t.a = m.a AND t.b = m.mb"
    )
    (node,) = split.nodes
    assert _read_tables(node.sql) == {TableName("shop", "t")}
    assert _read_tables(split.sql) == {TableName("shop", "t"), node.relation}


def test_node_names_are_plain_identifiers_beside_the_model() -> None:
    assert node_relation(RELATION, "My CTE-1") == TableName("shop", "m__ivm_cte_my_cte_1")


def test_names_that_become_the_same_node_are_refused() -> None:
    with pytest.raises(NotMaintainable, match="both become the node m__ivm_cte_a_b"):
        _split(
            "WITH `a b` AS (SELECT DISTINCT a FROM shop.t), `a-b` AS (SELECT DISTINCT a FROM shop.u) "
            "SELECT `a b`.a FROM `a b` JOIN `a-b` ON `a b`.a = `a-b`.a"
        )


def test_a_refused_outer_query_is_refused_before_any_node_is_built() -> None:
    # split_nodes checks every part, so a refresh refuses before refreshing nodes.
    with pytest.raises(NotMaintainable, match="window function PERCENTILE"):
        _split(
            "WITH c AS (SELECT a, COUNT(*) AS n FROM shop.t GROUP BY a) "
            "SELECT a, PERCENTILE(n, 0.5) OVER () AS r FROM c"
        )


def test_a_refused_node_names_its_cte() -> None:
    with pytest.raises(NotMaintainable) as raised:
        _split(
            "WITH c AS (SELECT a, b FROM shop.t ORDER BY b LIMIT 3) "
            "SELECT c.a, COUNT(*) AS n FROM c GROUP BY c.a"
        )
    assert raised.value.model == f"{MODEL} (CTE c)"
    assert raised.value.construct.startswith("ORDER BY ... LIMIT inside a CTE or subquery")


def test_a_set_operation_of_plain_operands_needs_no_node() -> None:
    sql = "SELECT a FROM shop.t UNION SELECT a FROM shop.u WHERE a > 1"
    assert _split(sql).nodes == ()


def test_an_operand_node_keeps_the_chain_around_it() -> None:
    split = _split(
        "SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u EXCEPT SELECT b FROM shop.t"
    )
    outer = parse_model(MODEL, split.sql)
    assert isinstance(outer, exp.Except)
    assert {str(t) for t in _read_tables(split.sql)} == {"shop.t", "shop.m__ivm_cte_operand_1"}
    assert isinstance(parse_model(MODEL, split.nodes[0].sql), exp.Union)


def test_a_node_with_nodes_of_its_own_is_split_when_it_is_refreshed() -> None:
    split = _split(
        "WITH n AS (SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u EXCEPT SELECT b FROM shop.t) "
        "SELECT n.a, COUNT(*) AS c FROM n GROUP BY n.a"
    )
    (node,) = split.nodes
    inner = split_nodes(f"{MODEL} (CTE n)", node.sql, node.relation, _columns)
    assert [n.relation.name for n in inner.nodes] == ["m__ivm_cte_n__ivm_cte_operand_1"]


# -- windows over inputs that are not one relation (window_inputs.py) ----------

WINDOW_SOURCES = {
    "shop.t": [("a", "int"), ("b", "int"), ("s", "string")],
    "shop.u": [("a", "int"), ("name", "string")],
}


def _split_windows(sql: str):
    return split_nodes(MODEL, sql, RELATION, lambda table: WINDOW_SOURCES[str(table)])


def _reads(sql: str) -> set[str]:
    return {t.sql(dialect="spark") for t in parse_model(MODEL, sql).find_all(exp.Table)}


def test_windows_over_a_join_read_the_join_as_a_node() -> None:
    # The SCD2 dimension built from a join: the join's columns that the SELECT
    # list reads become a node, the windows read only that node.
    split = _split_windows(
        "SELECT t.a, u.name, t.b AS valid_from, LEAD(t.b) OVER (PARTITION BY t.a ORDER BY t.b) "
        "AS valid_to FROM shop.t JOIN shop.u ON t.a = u.a WHERE t.s <> 'x'"
    )
    (node,) = split.nodes
    assert node.name == "window_input"
    assert node.relation == TableName("shop", "m__ivm_cte_window_input")
    assert node.sql == (
        "SELECT `t`.`a` AS `a`, `u`.`name` AS `name`, `t`.`b` AS `b` FROM `shop`.`t` AS `t` "
        "JOIN `shop`.`u` AS `u` ON `t`.`a` = `u`.`a` WHERE `t`.`s` <> 'x'"
    )
    assert _reads(split.sql) == {"`shop`.`m__ivm_cte_window_input` AS `window_input`"}
    assert "LEAD(`window_input`.`b`) OVER (PARTITION BY `window_input`.`a`" in split.sql


def test_a_column_name_read_from_two_join_inputs_is_named_by_its_input() -> None:
    split = _split_windows(
        "SELECT t.a, u.a AS ua, RANK() OVER (PARTITION BY u.name ORDER BY t.b) AS r "
        "FROM shop.t JOIN shop.u ON t.a = u.a"
    )
    (node,) = split.nodes
    assert node.sql.startswith(
        "SELECT `t`.`a` AS `t_a`, `u`.`a` AS `u_a`, `u`.`name` AS `name`, `t`.`b` AS `b` FROM"
    )
    assert "`window_input`.`u_a` AS `ua`" in split.sql


def test_windows_over_rows_filtered_by_exists_read_those_rows_as_a_node() -> None:
    split = _split_windows(
        "SELECT a, RANK() OVER (PARTITION BY a ORDER BY b) AS r FROM shop.t "
        "WHERE EXISTS (SELECT 1 FROM shop.u WHERE u.a = t.a)"
    )
    (node,) = split.nodes
    assert "WHERE EXISTS(SELECT" in node.sql
    assert "EXISTS" not in split.sql


def test_windows_over_groups_read_the_aggregate_as_a_node() -> None:
    # HAVING filters groups before windows are evaluated, so it goes into the
    # node; an aggregate inside a window function's argument is the group's.
    split = _split_windows(
        "SELECT a, COUNT(*) AS n, SUM(SUM(b)) OVER (PARTITION BY a) AS total, "
        "RANK() OVER (ORDER BY COUNT(*) DESC) AS by_size FROM shop.t GROUP BY a HAVING MAX(b) > 0"
    )
    (node,) = split.nodes
    assert node.sql == (
        "SELECT `t`.`a` AS `a`, COUNT(*) AS `aggregate_1`, SUM(`t`.`b`) AS `aggregate_2` "
        "FROM `shop`.`t` AS `t` GROUP BY `t`.`a` HAVING MAX(`t`.`b`) > 0"
    )
    assert split.sql == (
        "SELECT `window_input`.`a` AS `a`, `window_input`.`aggregate_1` AS `n`, "
        "SUM(`window_input`.`aggregate_2`) OVER (PARTITION BY `window_input`.`a`) AS `total`, "
        "RANK() OVER (ORDER BY `window_input`.`aggregate_1` DESC) AS `by_size` "
        "FROM `shop`.`m__ivm_cte_window_input` AS `window_input`"
    )


def test_distinct_over_windows_over_a_join_is_two_nodes() -> None:
    # SQL removes duplicates after it evaluates windows: the windows are a node
    # (itself over the join's node) and the model is DISTINCT over it.
    split = _split_windows(
        "SELECT DISTINCT t.a, DENSE_RANK() OVER (PARTITION BY t.a ORDER BY u.name) AS r "
        "FROM shop.t JOIN shop.u ON t.a = u.a"
    )
    assert [node.name for node in split.nodes] == ["window_input", "window_rows"]
    assert _reads(split.nodes[1].sql) == {"`shop`.`m__ivm_cte_window_input` AS `window_input`"}
    assert split.sql == (
        "SELECT DISTINCT `window_rows`.`a` AS `a`, `window_rows`.`r` AS `r` "
        "FROM `shop`.`m__ivm_cte_window_rows` AS `window_rows`"
    )


def test_a_cte_of_windows_over_a_join_gets_its_input_node_before_it() -> None:
    split = _split_windows(
        "WITH x AS (SELECT t.a, t.b, LEAD(t.b) OVER (PARTITION BY t.a ORDER BY t.b) AS nb "
        "FROM shop.t JOIN shop.u ON t.a = u.a) SELECT a, COUNT(*) AS n FROM x WHERE nb IS NULL "
        "GROUP BY a"
    )
    assert [node.name for node in split.nodes] == ["window_input", "x"]
    assert _reads(split.nodes[1].sql) == {"`shop`.`m__ivm_cte_window_input` AS `window_input`"}
    assert _reads(split.sql) == {"`shop`.`m__ivm_cte_x` AS `x`"}


def test_a_top_k_over_windows_over_a_join_keeps_its_order_and_limit_outside() -> None:
    split = _split_windows(
        "SELECT t.a, ROW_NUMBER() OVER (PARTITION BY t.s ORDER BY t.b) AS rn "
        "FROM shop.t JOIN shop.u ON t.a = u.a ORDER BY rn, u.name LIMIT 3"
    )
    (node,) = split.nodes
    assert "LIMIT" not in node.sql and "`u`.`name` AS `name`" in node.sql
    assert split.sql.endswith("ORDER BY `rn`, `window_input`.`name` LIMIT 3")


def test_the_input_node_takes_a_name_no_cte_of_the_model_has() -> None:
    split = _split_windows(
        "WITH window_input AS (SELECT DISTINCT a FROM shop.u) "
        "SELECT t.a, RANK() OVER (ORDER BY t.b) AS r FROM shop.t JOIN window_input w ON t.a = w.a"
    )
    assert [node.name for node in split.nodes] == ["window_input", "window_input_2"]
    # Each part reads the nodes before it, never a copy of the model's CTEs.
    assert not any("WITH" in node.sql for node in split.nodes)


def test_named_windows_are_the_windows_they_name() -> None:
    # v names w: both resolve to w's PARTITION BY and ORDER BY.
    tree = parse_model(
        MODEL,
        "SELECT a, RANK() OVER w AS r, LAG(b) OVER v AS p FROM shop.t "
        "WINDOW w AS (PARTITION BY a ORDER BY b), v AS (w)",
    )
    assert tree.sql(dialect="spark") == (
        "SELECT a, RANK() OVER (PARTITION BY a ORDER BY b) AS r, "
        "LAG(b) OVER (PARTITION BY a ORDER BY b) AS p FROM shop.t"
    )


@pytest.mark.parametrize(
    ("sql", "construct"),
    [
        (
            "SELECT RANK() OVER v AS r FROM shop.t WINDOW w AS (ORDER BY b)",
            "OVER v without a WINDOW v AS (...) in its SELECT",
        ),
        (
            "SELECT RANK() OVER w AS r FROM shop.t WINDOW w AS (v), v AS (w)",
            "a WINDOW clause defining w through itself",
        ),
    ],
)
def test_an_undefined_window_name_is_refused_by_name(sql: str, construct: str) -> None:
    with pytest.raises(NotMaintainable) as raised:
        parse_model(MODEL, sql)
    assert raised.value.construct == construct


# EXISTS, IN, NOT EXISTS and NOT IN over subqueries that are not one table's rows:
# the subquery a node (subquery_inputs.py), its correlation in the outer test.
@pytest.mark.parametrize(
    ("sql", "node", "test"),
    [
        # Once refused: "an IN subquery that aggregates".
        (
            "SELECT a FROM shop.t WHERE a IN (SELECT MAX(a) FROM shop.u)",
            "SELECT MAX(`u`.`a`) AS `value_1` FROM `shop`.`u` AS `u`",
            "`t`.`a` IN (SELECT `subquery`.`value_1` FROM `shop`.`m__ivm_cte_subquery` AS `subquery`)",
        ),
        # Once refused: "an EXISTS subquery that aggregates"; the correlated
        # column joins the GROUP BY (once: it is there already).
        (
            "SELECT a FROM shop.t WHERE EXISTS (SELECT a FROM shop.u WHERE u.a = t.a GROUP BY a)",
            "SELECT `u`.`a` AS `a` FROM `shop`.`u` AS `u` GROUP BY `u`.`a`",
            (
                "EXISTS(SELECT 1 FROM `shop`.`m__ivm_cte_subquery` AS `subquery` "
                "WHERE `subquery`.`a` = `t`.`a`)"
            ),
        ),
        # Once refused: "an IN subquery that reads a join"; DISTINCT over the
        # compared column.
        (
            "SELECT a FROM shop.t WHERE a IN (SELECT u.a FROM shop.u JOIN shop.t AS x ON u.a = x.b)",
            (
                "SELECT DISTINCT `u`.`a` AS `a` FROM `shop`.`u` AS `u` "
                "JOIN `shop`.`t` AS `x` ON `u`.`a` = `x`.`b`"
            ),
            "`t`.`a` IN (SELECT `subquery`.`a` FROM `shop`.`m__ivm_cte_subquery` AS `subquery`)",
        ),
        # Once refused: "a subquery nested inside an IN subquery"; the node
        # keeps it, a semi join of its own.
        (
            "SELECT a FROM shop.t WHERE a IN (SELECT a FROM shop.u WHERE a IN (SELECT b FROM shop.t))",
            (
                "SELECT DISTINCT `u`.`a` AS `a` FROM `shop`.`u` AS `u` "
                "WHERE `u`.`a` IN (SELECT `t`.`b` AS `b` FROM `shop`.`t` AS `t`)"
            ),
            "`t`.`a` IN (SELECT `subquery`.`a` FROM `shop`.`m__ivm_cte_subquery` AS `subquery`)",
        ),
        # A correlation by a comparison moves to the outer test with the columns it reads;
        # the subquery's own condition stays in the node.
        (
            (
                "SELECT a FROM shop.t WHERE NOT EXISTS (SELECT 1 FROM shop.u JOIN shop.t AS x "
                "ON u.a = x.a WHERE u.name = 'n' AND x.b < t.b)"
            ),
            (
                "SELECT DISTINCT `x`.`b` AS `b` FROM `shop`.`u` AS `u` "
                "JOIN `shop`.`t` AS `x` ON `u`.`a` = `x`.`a` WHERE `u`.`name` = 'n'"
            ),
            (
                "NOT EXISTS(SELECT 1 FROM `shop`.`m__ivm_cte_subquery` AS `subquery` "
                "WHERE `subquery`.`b` < `t`.`b`)"
            ),
        ),
        # A derived table that only filters merges into the subquery, which is still a node.
        (
            "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM (SELECT a FROM shop.u WHERE a > 0) y)",
            "SELECT DISTINCT 1 AS `present` FROM `shop`.`u` AS `u` WHERE `u`.`a` > 0",
            "EXISTS(SELECT 1 FROM `shop`.`m__ivm_cte_subquery` AS `subquery`)",
        ),
    ],
)
def test_a_subquery_that_is_not_one_tables_rows_becomes_a_node(
    sql: str, node: str, test: str
) -> None:
    split = _split(sql)
    (found,) = split.nodes
    assert (found.name, found.relation) == ("subquery", TableName("shop", "m__ivm_cte_subquery"))
    assert found.sql == node
    where = parse_model(MODEL, split.sql).args["where"].this
    assert where.sql(dialect="spark") == test


def test_a_subquery_reading_one_aggregating_cte_reads_its_node() -> None:
    """The CTE is a node already: the test reads it, no second node over it."""
    split = _split(
        "WITH m AS (SELECT a, MAX(b) AS mb FROM shop.t GROUP BY a) "
        "SELECT a FROM shop.u WHERE a IN (SELECT mb FROM m WHERE m.a = u.a)"
    )
    assert [n.name for n in split.nodes] == ["m"]
    assert "`shop`.`m__ivm_cte_m` AS `m` WHERE `m`.`a` = `u`.`a`" in split.sql


def test_two_subqueries_take_two_nodes() -> None:
    split = _split(
        "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u JOIN shop.t AS x ON u.a = x.a) "
        "AND b NOT IN (SELECT MAX(a) FROM shop.u GROUP BY name)"
    )
    assert [n.name for n in split.nodes] == ["subquery", "subquery_2"]
