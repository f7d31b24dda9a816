"""key_bounds.py: a join's partner reads narrowed to the key range of the change."""

from __future__ import annotations

from dataclasses import replace

import sqlglot
from sqlglot import exp

from ivm_compiler import emit, key_bounds, layout
from ivm_compiler.changes import signed_rows
from ivm_compiler.reads import VersionRange as Window
from tests.unit.test_compile import (
    CUSTOMERS_TABLE,
    JOIN_DESCRIBE,
    JOIN_PROBE,
    JOIN_SQL,
    ORDERS_TABLE,
    compile_with,
)

BOTH_CHANGED = {ORDERS_TABLE: Window(recorded=3, pinned=5), CUSTOMERS_TABLE: Window(7, 8)}


def _term_filters(sql: str) -> list[str]:
    """The WHERE of each UNION ALL term of signed rows, as Spark SQL."""
    filters = []
    for select in sqlglot.parse_one(sql, read="spark").find_all(exp.Select):
        if not select.args.get("joins") or select.find_ancestor(exp.Subquery):
            continue
        where = select.args.get("where")
        filters.append(where.this.sql("spark") if where else "")
    return filters


def test_the_probe_asks_each_changed_inputs_join_column_once():
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    sql, keys = emit.probe_join_keys(plan, BOTH_CHANGED)
    assert keys == [
        key_bounds.KeyColumn(ORDERS_TABLE, "customer", "string"),
        key_bounds.KeyColumn(CUSTOMERS_TABLE, "name", "string"),
    ]
    assert sql.count("TABLE_CHANGES(") == 2
    assert "MIN(`__ivm_changes`.`customer`)" in sql and "MAX(`__ivm_changes`.`name`)" in sql
    # Strings have no distance between keys: their bounds are one range, no gaps asked.
    assert "LEAD(" not in sql


def test_the_probe_splits_a_numeric_key_at_its_widest_gaps():
    plan, _ = compile_with(
        "SELECT o.id, c.name FROM shop.orders AS o JOIN shop.customers AS c ON o.id = c.id",
        [("id", "int"), ("name", "string")],
    )
    sql, keys = emit.probe_join_keys(plan, BOTH_CHANGED)
    assert [k.column for k in keys] == ["id", "id"]
    assert sql.count("LEAD(k) OVER (ORDER BY k NULLS LAST)") == 2
    # The highest key (no next one) first, as the 'all' row, then the widest gaps.
    assert sql.count(f"ORDER BY nxt IS NULL DESC, nxt - k DESC LIMIT {key_bounds.MAX_RANGES}") == 2
    # One read of each changed input's rows per key: bounds and gaps together.
    assert sql.count("TABLE_CHANGES(") == 2
    # New keys at the top, deletions at the bottom: two ranges, not one over everything.
    bounds = key_bounds.parse_probe(
        keys,
        [
            (0, "all", "1", "9000"),
            (0, "gap", "12", "8990"),
            (0, "gap", "5", "7"),
            (1, "all", None, None),
        ],
    )
    assert bounds[(ORDERS_TABLE, "id")].ranges == (("1", "5"), ("7", "12"), ("8990", "9000"))
    assert bounds[(CUSTOMERS_TABLE, "id")].ranges == ()
    filters = _term_filters(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark"))
    assert filters[0] == (
        "(`c`.`id` BETWEEN CAST('1' AS INT) AND CAST('5' AS INT) "
        "OR `c`.`id` BETWEEN CAST('7' AS INT) AND CAST('12' AS INT) "
        "OR `c`.`id` BETWEEN CAST('8990' AS INT) AND CAST('9000' AS INT))"
    )


def test_a_merge_probe_lists_more_keys_than_a_partner_probe():
    # A MERGE's list is one statement's; a partner's is repeated in each of its reads.
    assert layout.MAX_LISTED_MERGE_KEYS > key_bounds.MAX_LISTED_KEYS
    sql, keys = layout.probe_keys("__ivm_staged_r1_rows", [("__ivm_g0", "int")], list_keys=True)
    assert f"LIMIT {layout.MAX_LISTED_MERGE_KEYS + 1}" in sql
    assert f"HAVING COUNT(*) <= {layout.MAX_LISTED_MERGE_KEYS}" in sql
    assert [key.column for key in keys] == ["__ivm_g0"]
    assert "COLLECT_LIST" not in layout.probe_keys("s", [("__ivm_g0", "int")])[0]


def test_over_a_large_source_the_probe_lists_the_changed_keys_too():
    plan, _ = compile_with(
        "SELECT o.id, c.name FROM shop.orders AS o JOIN shop.customers AS c ON o.id = c.id",
        [("id", "int"), ("name", "string")],
    )
    sql, keys = emit.probe_join_keys(plan, BOTH_CHANGED, list_keys=True)
    # Per key, one past the limit read, listed only within it.
    assert sql.count(f"LIMIT {key_bounds.MAX_LISTED_KEYS + 1}") == 2
    assert sql.count(f"HAVING COUNT(*) <= {key_bounds.MAX_LISTED_KEYS}") == 2
    assert sql.count("TO_JSON(COLLECT_LIST(CAST(k AS STRING)))") == 2
    assert "COLLECT_LIST" not in emit.probe_join_keys(plan, BOTH_CHANGED)[0]
    bounds = key_bounds.parse_probe(
        keys,
        [
            (0, "all", "1", "9000"),
            (0, "gap", "12", "8990"),
            (0, "list", '["9000", "1", "12", "8990"]', None),
            # Past the limit: no 'list' row.
            (1, "all", "3", "4"),
        ],
    )
    assert bounds[(ORDERS_TABLE, "id")].listed == ("1", "12", "8990", "9000")
    assert bounds[(CUSTOMERS_TABLE, "id")].listed is None
    filters = _term_filters(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark"))
    # orders changed: customers within the ranges and in the list (the ranges
    # skip files, the list keeps the rows); customers changed: ranges only.
    assert filters == [
        (
            "(`c`.`id` BETWEEN CAST('1' AS INT) AND CAST('12' AS INT) "
            "OR `c`.`id` BETWEEN CAST('8990' AS INT) AND CAST('9000' AS INT)) "
            "AND `c`.`id` IN (1, 12, 8990, 9000)"
        ),
        "`o`.`id` BETWEEN CAST('3' AS INT) AND CAST('4' AS INT)",
    ]


def test_a_listed_change_of_null_keys_only_reads_nothing():
    plan, _ = compile_with(
        "SELECT o.id, c.name FROM shop.orders AS o JOIN shop.customers AS c ON o.id = c.id",
        [("id", "int"), ("name", "string")],
    )
    _, keys = emit.probe_join_keys(plan, BOTH_CHANGED, list_keys=True)
    # DuckDB answers an empty list with NULL; Spark with '[]'.
    bounds = key_bounds.parse_probe(
        keys, [(0, "all", None, None), (0, "list", None, None), (1, "list", "[]", None)]
    )
    assert bounds[(ORDERS_TABLE, "id")] == key_bounds.ChangeKeys((), ())
    assert bounds[(CUSTOMERS_TABLE, "id")] == key_bounds.ChangeKeys((), ())
    assert _term_filters(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark")) == [
        "FALSE",
        "FALSE",
    ]


def test_each_term_reads_its_partner_within_the_changed_inputs_bounds():
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    _, keys = emit.probe_join_keys(plan, BOTH_CHANGED)
    bounds = key_bounds.parse_probe(keys, [(0, "all", "ann", "bob"), (1, "all", None, None)])
    filters = _term_filters(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark"))
    assert filters == [
        # orders changed: customers read for names in ['ann', 'bob'] only
        "`o`.`qty` > 0 AND `c`.`name` BETWEEN CAST('ann' AS STRING) AND CAST('bob' AS STRING)",
        # customers changed, every changed name NULL: no order can meet it
        "`o`.`qty` > 0 AND FALSE",
    ]


def test_without_an_answer_the_terms_are_unchanged():
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    assert _term_filters(signed_rows(plan, BOTH_CHANGED).sql("spark")) == [
        "`o`.`qty` > 0",
        "`o`.`qty` > 0",
    ]


def test_an_unchanged_input_is_not_probed():
    plan, _ = compile_with(JOIN_SQL, JOIN_DESCRIBE, JOIN_PROBE)
    windows = {ORDERS_TABLE: Window(3, 5), CUSTOMERS_TABLE: Window(8, 8)}
    _, keys = emit.probe_join_keys(plan, windows)
    assert [k.table for k in keys] == [ORDERS_TABLE]


def test_no_probe_without_a_join():
    plan, _ = compile_with(
        "SELECT customer, COUNT(*) AS n FROM shop.orders GROUP BY customer",
        [("customer", "string"), ("n", "bigint")],
        [("key_0", "string")],
    )
    assert emit.probe_join_keys(plan, {ORDERS_TABLE: Window(1, 2)}) is None


def _bounds_of(sql: str, describe) -> list[key_bounds.PartnerBound]:
    plan, _ = compile_with(sql, describe)
    from ivm_compiler.changes import linear_terms

    ((_, select, inputs),) = linear_terms(plan)
    return key_bounds.partner_bounds(select, inputs, 0, plan.source_columns)


def test_equalities_of_different_types_or_of_expressions_are_not_bounded():
    # o.id (int) = c.name (string): Spark compares them as numbers, while the
    # text bounds would order them as strings.
    assert (
        _bounds_of(
            "SELECT o.id, c.country FROM shop.orders AS o JOIN shop.customers AS c ON o.id = c.name",
            [("id", "int"), ("country", "string")],
        )
        == []
    )
    assert (
        _bounds_of(
            "SELECT o.id, c.country FROM shop.orders AS o "
            "JOIN shop.customers AS c ON o.id + 1 = c.id",
            [("id", "int"), ("country", "string")],
        )
        == []
    )


def test_floating_point_keys_are_not_bounded():
    assert (
        _bounds_of(
            "SELECT a.id FROM shop.orders AS a JOIN shop.orders AS b ON a.price = b.price",
            [("id", "int")],
        )
        == []
    )


def test_an_equality_in_where_bounds_like_one_in_on():
    found = _bounds_of(
        "SELECT o.amount, c.country FROM shop.orders AS o, shop.customers AS c "
        "WHERE o.id = c.id AND c.country = 'fr'",
        [("amount", "decimal(10,2)"), ("country", "string")],
    )
    assert [(b.key.column, b.partner_alias, b.partner_column) for b in found] == [("id", "c", "id")]


# A lookup whose padding is a partner filter: the key equality bounds, the band does not.
LOOKUP_SQL = (
    "SELECT o.id, c.name FROM shop.orders AS o LEFT JOIN shop.customers AS c "
    "ON o.id = c.id AND o.qty BETWEEN LENGTH(c.country) AND 9"
)
LOOKUP_DESCRIBE = [("id", "int"), ("name", "string")]


def _lookup_terms(bounds: key_bounds.Bounds) -> list[exp.Select]:
    plan, _ = compile_with(LOOKUP_SQL, LOOKUP_DESCRIBE)
    tree = sqlglot.parse_one(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark"), read="spark")
    return [s for s in tree.find_all(exp.Select) if s.args.get("joins") and s.parent_select is None]


def test_a_partner_filter_is_bounded_by_its_conditions_equalities_only():
    plan, _ = compile_with(LOOKUP_SQL, LOOKUP_DESCRIBE)
    _, keys = emit.probe_join_keys(plan, BOTH_CHANGED)
    # Both inputs' `id`: the band's columns are no key.
    assert keys == [
        key_bounds.KeyColumn(ORDERS_TABLE, "id", "int"),
        key_bounds.KeyColumn(CUSTOMERS_TABLE, "id", "int"),
    ]


def test_an_inputs_change_reads_the_filters_input_within_its_keys():
    bounds = {
        (ORDERS_TABLE, "id"): key_bounds.ChangeKeys((("3", "4"),)),
        (CUSTOMERS_TABLE, "id"): key_bounds.ChangeKeys((("7", "7"),)),
    }
    terms = [t.sql("spark") for t in _lookup_terms(bounds)]
    # The padding term of an order's change: customers' rows at the recorded
    # version, within the changed orders' keys, in the anti join's ON.
    (padding,) = [t for t in terms if t.count("LEFT ANTI JOIN") == 1 and "__ivm_partner" not in t]
    on = padding[padding.index("LEFT ANTI JOIN") :]
    assert "AND `c`.`id` BETWEEN CAST('3' AS INT) AND CAST('4' AS INT)" in on
    # The filter's own change: the orders a changed customer partners, and the
    # customers at both versions, within the changed customers' keys.
    turned = [t for t in terms if "__ivm_partner1_change" in t]
    assert len(turned) == 2
    for term in turned:
        assert term.endswith("WHERE `o`.`id` BETWEEN CAST('7' AS INT) AND CAST('7' AS INT)")
        for role in ("now", "then"):
            assert f"`__ivm_partner1_{role}`.`id` BETWEEN CAST('7' AS INT)" in term
        assert "`__ivm_partner1_change`.`id` BETWEEN" not in term


# A semi join's key relation: the distinct ids of customers, joined by equality.
EXISTS_SQL = (
    "SELECT o.id, o.amount FROM shop.orders AS o "
    "WHERE EXISTS (SELECT 1 FROM shop.customers AS c WHERE c.id = o.id)"
)
EXISTS_DESCRIBE = [("id", "int"), ("amount", "decimal(10,2)")]
EXISTS_BOUNDS = {
    (ORDERS_TABLE, "id"): key_bounds.ChangeKeys((("3", "4"),), ("3", "4")),
    (CUSTOMERS_TABLE, "id"): key_bounds.ChangeKeys((("7", "9"),), ("7", "9")),
}


def _terms(sql: str, describe, bounds: key_bounds.Bounds) -> list[str]:
    plan, _ = compile_with(sql, describe)
    tree = sqlglot.parse_one(signed_rows(plan, BOTH_CHANGED, bounds).sql("spark"), read="spark")
    return [
        s.sql("spark")
        for s in tree.find_all(exp.Select)
        if s.args.get("joins") and s.parent_select is None
    ]


def test_a_semi_joins_key_relation_is_probed_on_both_sides_where_keys_are_listed():
    plan, _ = compile_with(EXISTS_SQL, EXISTS_DESCRIBE)
    _, keys = emit.probe_join_keys(plan, BOTH_CHANGED, list_keys=True)
    assert keys == [
        key_bounds.KeyColumn(ORDERS_TABLE, "id", "int"),
        key_bounds.KeyColumn(CUSTOMERS_TABLE, "id", "int"),
    ]
    # Over small sources the probe lists nothing, and ranges alone would
    # not pay for a key relation (key_bounds.py): nothing is probed.
    assert emit.probe_join_keys(plan, BOTH_CHANGED) is None


def test_a_key_relation_is_not_bounded_by_ranges_alone_nor_over_small_sources():
    ranges_only = {key: replace(found, listed=None) for key, found in EXISTS_BOUNDS.items()}
    small = {key: replace(found, key_relations=False) for key, found in EXISTS_BOUNDS.items()}
    for bounds in (ranges_only, small):
        for term in _terms(EXISTS_SQL, EXISTS_DESCRIBE, bounds):
            assert "BETWEEN" not in term and "IN (3, 4)" not in term and "IN (7, 9)" not in term
    plan, _ = compile_with(EXISTS_SQL, EXISTS_DESCRIBE)
    assert emit.probe_join_keys(plan, BOTH_CHANGED, list_keys=True, key_relations=False) is None


def test_an_inputs_change_reads_the_key_relation_within_its_keys():
    orders_change, customers_change = _terms(EXISTS_SQL, EXISTS_DESCRIBE, EXISTS_BOUNDS)
    # The orders' change meets the customers' ids within the changed orders' ids,
    # a filter on the grouped key that Spark pushes into the customers' read.
    assert orders_change.endswith(
        "WHERE `__ivm_semi0_keys`.`__ivm_k0` BETWEEN CAST('3' AS INT) AND CAST('4' AS INT) "
        "AND `__ivm_semi0_keys`.`__ivm_k0` IN (3, 4)"
    )
    assert "IN (7, 9)" not in orders_change
    # The ids that gained or lost their customers: the orders read within the
    # changed customers' ids, and so are the customers counted for them.
    assert customers_change.endswith(
        "WHERE `o`.`id` BETWEEN CAST('7' AS INT) AND CAST('9' AS INT) AND `o`.`id` IN (7, 9)"
    )
    touched = customers_change[customers_change.index(") AS `__ivm_touched`") :]
    assert "`c`.`id` BETWEEN CAST('7' AS INT) AND CAST('9' AS INT) AND `c`.`id` IN (7, 9)" in (
        touched
    )


def test_keys_past_the_list_are_read_from_the_change_where_the_list_was():
    plan, _ = compile_with(EXISTS_SQL, EXISTS_DESCRIBE)
    # The probe lists keys but found more orders than it lists: no list row.
    past = {
        (ORDERS_TABLE, "id"): key_bounds.ChangeKeys((("3", "4000"),)),
        **{k: v for k, v in EXISTS_BOUNDS.items() if k[0] == CUSTOMERS_TABLE},
    }
    bounds = emit.keys_past_list(plan, BOTH_CHANGED, past)
    assert bounds[ORDERS_TABLE, "id"].read is not None
    assert bounds[CUSTOMERS_TABLE, "id"].read is None  # listed: the list stays
    orders_change, customers_change = _terms(EXISTS_SQL, EXISTS_DESCRIBE, bounds)
    # The customers' ids the orders' change meets, within the changed orders'
    # ids read from that change: a semi join Spark pushes into the customers' read.
    where = orders_change[orders_change.rindex("WHERE `__ivm_semi0_keys`") :]
    assert where.startswith(
        "WHERE `__ivm_semi0_keys`.`__ivm_k0` BETWEEN CAST('3' AS INT) AND CAST('4000' AS INT) "
        "AND `__ivm_semi0_keys`.`__ivm_k0` IN (SELECT `__ivm_change_keys`.`id` FROM (SELECT "
    )
    assert where.endswith("FROM TABLE_CHANGES('`shop`.`orders`', 4, 5)) AS `__ivm_change_keys`)")
    assert "`__ivm_change_keys`" not in customers_change
    # Ranges alone (no list asked, or key relations not read within keys): as before.
    for found in (past, {k: replace(v, key_relations=False) for k, v in bounds.items()}):
        for term in _terms(EXISTS_SQL, EXISTS_DESCRIBE, found):
            assert (
                "__ivm_change_keys" not in term
                and "`__ivm_semi0_keys`.`__ivm_k0` BETWEEN" not in term
            )


def test_a_filters_input_is_not_read_within_a_query_of_keys():
    # A partner filter's bound goes into its semi join's ON, which takes no subquery.
    bound = key_bounds.PartnerBound(key_bounds.KeyColumn(ORDERS_TABLE, "id", "int"), "f", "id")
    read = exp.select("id").from_("changes")
    bounds = {(ORDERS_TABLE, "id"): key_bounds.ChangeKeys((("3", "9"),), read=read)}
    within = key_bounds.bound_predicate(bound, bounds, subqueries=False)
    assert within.sql("spark") == "`f`.`id` BETWEEN CAST('3' AS INT) AND CAST('9' AS INT)"
    assert "IN (SELECT id FROM changes)" in key_bounds.bound_predicate(bound, bounds).sql("spark")


def test_a_key_relation_over_an_expression_is_not_bounded():
    # The key is c.id + 1: its bounds would have to be those of o.id minus one.
    sql = EXISTS_SQL.replace("c.id = o.id", "c.id + 1 = o.id")
    plan, _ = compile_with(sql, EXISTS_DESCRIBE)
    assert emit.probe_join_keys(plan, BOTH_CHANGED, list_keys=True) is None


def test_an_outer_joins_padding_reads_its_key_relation_within_the_change_keys():
    sql = "SELECT o.id, c.name FROM shop.orders AS o LEFT JOIN shop.customers AS c ON o.id = c.id"
    terms = _terms(sql, [("id", "int"), ("name", "string")], EXISTS_BOUNDS)
    padding = [t for t in terms if "`__ivm_keys" in t and "`__ivm_touched`" not in t]
    assert padding
    for term in padding:
        assert "`__ivm_k0` IN (3, 4)" in term
    changed_keys = [t for t in terms if "`__ivm_touched`" in t]
    assert changed_keys
    for term in changed_keys:
        assert term.endswith("`o`.`id` IN (7, 9)")
        assert "`c`.`id` IN (7, 9)" in term
