"""The stand-in itself: the Delta simulator and the Spark -> DuckDB rewrites.

The property tests are only as good as these pieces; each test pins one
behaviour of Delta or Spark that the emulation must reproduce.
"""

from __future__ import annotations

import contextlib
import doctest
from decimal import Decimal

import pytest
from sqlglot import exp

from ivm_compiler import TableName
from tests.rules import engine as engine_module
from tests.rules.engine import (
    Catalog,
    ChangeRow,
    Delete,
    DeltaTable,
    Engine,
    Insert,
    Update,
    spark_type,
)

T = TableName(db="raw", name="t")
COLUMNS = (("k", "int"), ("g", "string"), ("d", "decimal(10,2)"))


def table() -> DeltaTable:
    return DeltaTable(T, COLUMNS)


# -- the Delta simulator -------------------------------------------------------------------


def test_a_new_table_is_version_0_and_empty() -> None:
    t = table()
    assert t.version == 0
    assert t.rows_at(0) == []
    assert t.changes_between(0, 0) == []


def test_each_statement_commits_one_version_with_its_change_rows() -> None:
    t = table()
    assert t.commit(Insert(((1, "a", Decimal("1.50")), (1, "a", Decimal("1.50"))))) == 1
    assert t.commit(Delete("g", "a")) == 2
    assert t.rows_at(1) == [(1, "a", Decimal("1.50"))] * 2
    assert t.rows_at(2) == []
    assert t.changes_between(1, 1) == [ChangeRow((1, "a", Decimal("1.50")), "insert", 1)] * 2
    assert t.changes_between(2, 2) == [ChangeRow((1, "a", Decimal("1.50")), "delete", 2)] * 2


def test_an_update_writes_a_preimage_and_a_postimage_per_updated_row() -> None:
    t = table()
    t.commit(Insert(((1, "a", None), (2, "b", None), (1, "c", None))))
    t.commit(Update("k", 1, "g", "z"))
    assert t.rows_at(2) == [(1, "z", None), (2, "b", None), (1, "z", None)]
    assert t.changes_between(2, 2) == [
        ChangeRow((1, "a", None), "update_preimage", 2),
        ChangeRow((1, "z", None), "update_postimage", 2),
        ChangeRow((1, "c", None), "update_preimage", 2),
        ChangeRow((1, "z", None), "update_postimage", 2),
    ]


def test_an_update_that_keeps_the_value_still_writes_both_images() -> None:
    t = table()
    t.commit(Insert(((1, "a", None),)))
    t.commit(Update("k", 1, "g", "a"))
    assert [c.change_type for c in t.changes_between(2, 2)] == [
        "update_preimage",
        "update_postimage",
    ]


def test_where_null_matches_null_rows_only() -> None:
    t = table()
    t.commit(Insert(((None, "a", None), (0, "b", None))))
    t.commit(Delete("k", None))
    assert t.rows_at(2) == [(0, "b", None)]


def test_a_statement_matching_no_row_still_commits_a_version() -> None:
    t = table()
    t.commit(Insert(((1, "a", None),)))
    assert t.commit(Update("k", 9, "g", "z")) == 2
    assert t.commit(Delete("k", 9)) == 3
    assert t.rows_at(3) == t.rows_at(1)
    assert t.changes_between(2, 3) == []


def test_table_changes_reads_a_window_of_versions_both_ends_included() -> None:
    t = table()
    for k in range(1, 4):
        t.commit(Insert(((k, None, None),)))
    assert [c.row[0] for c in t.changes_between(2, 3)] == [2, 3]
    with pytest.raises(ValueError):
        t.changes_between(2, 4)


# -- reading versions and change feeds in DuckDB -----------------------------------------------


@pytest.fixture
def engine():
    t = table()
    t.commit(Insert(((1, "a", Decimal("1.50")), (None, None, None))))
    t.commit(Update("k", 1, "d", Decimal("-2.25")))
    with contextlib.closing(Engine([t])) as found:
        yield found


def test_version_as_of_reads_that_version(engine: Engine) -> None:
    _, rows = engine.query("SELECT k, d FROM raw.t VERSION AS OF 1 WHERE k IS NOT NULL")
    assert rows == [(1, Decimal("1.50"))]
    _, rows = engine.query("SELECT s.d FROM raw.t VERSION AS OF 2 AS s WHERE s.k = 1")
    assert rows == [(Decimal("-2.25"),)]


def test_a_plain_name_reads_the_pinned_or_the_newest_version(engine: Engine) -> None:
    sql = "SELECT t.d FROM raw.t WHERE t.k = 1"
    assert engine.query(sql)[1] == [(Decimal("-2.25"),)]
    assert engine.query(sql, pinned={T: 1})[1] == [(Decimal("1.50"),)]


def test_table_changes_has_deltas_columns(engine: Engine) -> None:
    columns, rows = engine.query(
        "SELECT * FROM table_changes('`raw`.`t`', 1, 2) ORDER BY _commit_version, _change_type"
    )
    assert columns == ["k", "g", "d", "_change_type", "_commit_version", "_commit_timestamp"]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        (1, Decimal("1.50"), "insert", 1),
        (None, None, "insert", 1),
        (1, Decimal("-2.25"), "update_postimage", 2),
        (1, Decimal("1.50"), "update_preimage", 2),
    ]


# -- where Spark and DuckDB differ ---------------------------------------------------------------


def test_null_safe_equality(engine: Engine) -> None:
    assert engine.query("SELECT NULL <=> NULL, 1 <=> NULL, 1 <=> 1")[1] == [(True, False, True)]


def test_nulls_sort_first_ascending_and_last_descending(engine: Engine) -> None:
    # Spark's defaults; a top-k view's ORDER BY depends on them.
    assert engine.query("SELECT k FROM raw.t ORDER BY k")[1] == [(None,), (1,)]
    assert engine.query("SELECT k FROM raw.t ORDER BY k DESC")[1] == [(1,), (None,)]


def test_integer_division_is_a_double_and_div_is_integral(engine: Engine) -> None:
    assert engine.query("SELECT 7 / 2, 7 div 2, -7 % 3")[1] == [(3.5, 3, -1)]


def test_except_all_and_intersect_all_are_bag_operations(engine: Engine) -> None:
    ones = "SELECT 1 AS x UNION ALL SELECT 1 UNION ALL SELECT 1 UNION ALL SELECT 2"
    assert sorted(engine.query(f"{ones} EXCEPT ALL SELECT 1")[1]) == [(1,), (1,), (2,)]
    # INTERSECT binds tighter than UNION and EXCEPT, in Spark as in DuckDB.
    twice = "SELECT * FROM (SELECT 1 AS x UNION ALL SELECT 1)"
    assert sorted(engine.query(f"SELECT * FROM ({ones}) INTERSECT ALL {twice}")[1]) == [
        (1,),
        (1,),
    ]


def test_lateral_view_explode_sequence_repeats_a_row(engine: Engine) -> None:
    sql = (
        "SELECT n, c FROM (SELECT 3 AS n) AS s "
        "LATERAL VIEW EXPLODE(SEQUENCE(1, n)) copies AS c ORDER BY c"
    )
    assert engine.query(sql)[1] == [(3, 1), (3, 2), (3, 3)]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT SUM(k) AS s FROM raw.t", "bigint"),
        ("SELECT SUM(d) AS s FROM raw.t", "decimal(20,2)"),
        ("SELECT AVG(d) AS s FROM raw.t", "decimal(14,6)"),
        ("SELECT AVG(k) AS s FROM raw.t", "double"),
        ("SELECT COUNT(*) AS s FROM raw.t", "bigint"),
        ("SELECT SUM(k) / COUNT(*) AS s FROM raw.t", "double"),
        ("SELECT MAX(g) AS s FROM raw.t", "string"),
        ("SELECT SUM(d) OVER (PARTITION BY g) AS s FROM raw.t", "decimal(20,2)"),
        ("SELECT AVG(d) OVER (PARTITION BY g) AS s FROM raw.t", "decimal(14,6)"),
    ],
)
def test_describe_answers_sparks_types(engine: Engine, query: str, expected: str) -> None:
    assert Catalog(engine).describe_query(query) == [("s", expected)]


def test_decimal_avg_is_sparks_quotient_rounded_half_up(engine: Engine) -> None:
    # 0.01 / 32 = 0.0003125: Spark rounds it half up to 0.000313, where a
    # double (0.0003125 has none) may land on either side of the midpoint.
    sql = (
        "SELECT AVG(CAST(IF(c = 1, 0.01, 0) AS DECIMAL(10, 2))) AS a, "
        "AVG(CAST(IF(c = 1, -0.01, 0) AS DECIMAL(10, 2))) AS b, "
        "AVG(CAST(IF(c <= 3, 1, NULL) AS DECIMAL(10, 2))) AS c "
        "FROM (SELECT 1 AS n) AS s LATERAL VIEW EXPLODE(SEQUENCE(1, 32)) copies AS c"
    )
    assert engine.query(sql)[1] == [(Decimal("0.000313"), Decimal("-0.000313"), Decimal(1))]


def test_a_decimal_division_outside_a_cast_is_refused(engine: Engine) -> None:
    with pytest.raises(NotImplementedError, match="scale Spark derives"):
        engine.query("SELECT d / CAST(2 AS DECIMAL(10, 0)) FROM raw.t")


def test_merge_set_targets_lose_their_alias(engine: Engine) -> None:
    sql = engine.translate(
        "MERGE INTO a.s AS t USING (SELECT 1 AS k) AS d ON t.k = d.k "
        "WHEN MATCHED THEN UPDATE SET t.n = d.k + 1"
    ).sql
    assert "SET n = d.k + 1" in sql


def test_a_clause_that_raises_becomes_an_error_clause(engine: Engine) -> None:
    """DuckDB evaluates a clause's values for rows the clause does not take (engine.py)."""
    sql = engine.translate(
        "MERGE INTO a.s AS t USING (SELECT 1 AS k) AS d ON t.k = d.k "
        "WHEN MATCHED AND d.k > 1 THEN UPDATE SET t.n = RAISE_ERROR('no')"
    ).sql
    assert "WHEN MATCHED AND d.k > 1 THEN ERROR 'no'" in sql


def test_types_map_back_to_sparks_names() -> None:
    assert spark_type("DECIMAL(38,2)") == "decimal(38,2)"
    with pytest.raises(NotImplementedError, match="HUGEINT"):
        spark_type("HUGEINT")


def test_docstring_examples() -> None:
    result = doctest.testmod(engine_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_engine_reads_the_state_table_by_its_own_name(engine: Engine) -> None:
    state = TableName(db="analytics", name="m__ivm_state")
    engine.ensure_schema(state)
    engine.connection.execute("CREATE TABLE analytics.m__ivm_state AS SELECT 1 AS x")
    assert engine.query(exp.select("x").from_(state.to_table()).sql("spark"))[1] == [(1,)]
