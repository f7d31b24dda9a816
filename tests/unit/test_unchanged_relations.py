"""changes.py: key relations a change leaves as they were, read at the pinned version alone.

The rules layer (tests/rules, `test_a_key_relation_the_change_leaves_...`)
runs these statements and checks the model against its query; here, the SQL.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from ivm_compiler import changes, emit
from ivm_compiler.reads import VersionRange
from tests.unit.test_compile import ORDERS_TABLE
from tests.unit.test_staged_feeds import NOT_IN_CHANGED, SHIPMENTS_TABLE, _not_in_plan

NULL, ROWS, KEYS = "__ivm_semi0_null", "__ivm_semi0_rows", "__ivm_semi0_keys"


def test_the_probe_counts_each_changed_relations_keyed_change_rows_once():
    sql = emit.unchanged_relations_probe(_not_in_plan(), NOT_IN_CHANGED)
    assert sql is not None
    for alias in (NULL, ROWS, KEYS):
        assert sql.count(f"SELECT '{alias}' AS relation, COUNT(*) AS found") == 1, alias
    # Only the orders changed: no key relation's input did.
    only_orders = {ORDERS_TABLE: VersionRange(3, 5), SHIPMENTS_TABLE: VersionRange(7, 7)}
    assert emit.unchanged_relations_probe(_not_in_plan(), only_orders) is None


def test_a_keyless_relation_is_read_now_up_to_one_row_past_its_change():
    touched = {NULL: 0, ROWS: 4, KEYS: 4}
    sql = emit.keyless_presence_probe(_not_in_plan(), NOT_IN_CHANGED, touched)
    assert sql is not None
    # "has rows" alone: "has a NULL" was not touched, the IN keys have keys.
    assert f"'{ROWS}'" in sql and f"'{NULL}'" not in sql and f"'{KEYS}'" not in sql
    assert sql.endswith("LIMIT 5) AS `__ivm_touched`"), sql
    assert "VERSION AS OF 7" in sql and "TABLE_CHANGES" not in sql
    assert changes.unchanged_relations(touched, {ROWS: 5}) == {NULL, ROWS}
    assert changes.unchanged_relations(touched, {ROWS: 4}) == {NULL}


def test_an_unchanged_relation_has_no_term_and_is_read_at_its_pinned_version():
    plan = _not_in_plan()
    before = changes.signed_rows(plan, NOT_IN_CHANGED).sql("spark")
    marked = changes.with_unchanged_relations(plan, {NULL})
    after = changes.signed_rows(marked, NOT_IN_CHANGED).sql("spark")
    # Its own change (its key's presence now against before, twice in each
    # of the two terms joining it) is gone, and so are those terms.
    presence = "IF(SUM(`__ivm_now`) > 0, 1, 0)"
    assert after.count(presence) == before.count(presence) - 4
    assert after.count(" UNION ALL ") < before.count(" UNION ALL ")
    assert f") AS `{NULL}`" in after
    assert changes.with_unchanged_relations(plan, set()) is plan


def test_a_change_that_leaves_every_relation_as_it_was_is_empty():
    only_shipments = {ORDERS_TABLE: VersionRange(5, 5), SHIPMENTS_TABLE: VersionRange(6, 7)}
    marked = changes.with_unchanged_relations(_not_in_plan(), {NULL, ROWS, KEYS})
    sql = changes.signed_rows(marked, only_shipments).sql("spark")
    # One term, with no rows (not a union of terms).
    assert isinstance(sqlglot.parse_one(sql, read="spark"), exp.Select)
    assert sql.endswith("WHERE FALSE"), sql
