"""Every construct the compiler refuses, table-driven.

Each refusal must happen while compiling (before any SQL runs) and say, in the
style of pg_ivm, which model, which construct, and how to fix it.
"""

from __future__ import annotations

import re

import pytest

from ivm_compiler import NotMaintainable, compile_model
from ivm_compiler.errors import FALLBACK_HINT
from tests.unit.golden import FakeCatalog

MODEL = "my_model"
SOURCES = {
    "shop.t": [("a", "int"), ("b", "int"), ("s", "string"), ("arr", "array<int>")],
    "shop.u": [("a", "int")],
    "shop.kv": [("id", "int"), ("attrs", "map<string,int>"), ("n", "int")],
}

# (id, model SQL, regex the construct named in the message must match, regex for the hint or None)
REFUSED = [
    # joins
    ("join", "SELECT t.a FROM shop.t JOIN shop.u ON t.a = u.a", r"^JOIN$", None),
    ("left_join", "SELECT t.a FROM shop.t LEFT JOIN shop.u ON t.a = u.a", r"^JOIN$", None),
    ("comma_join", "SELECT t.a FROM shop.t, shop.u", r"^JOIN$", None),
    ("cross_join", "SELECT t.a FROM shop.t CROSS JOIN shop.u", r"^JOIN$", None),
    # windows and what depends on row order
    (
        "window_function",
        "SELECT a, ROW_NUMBER() OVER (PARTITION BY s ORDER BY b) AS rn FROM shop.t",
        r"^the window function ROW_NUMBER\(\) OVER \(PARTITION BY s ORDER BY b\)$",
        None,
    ),
    (
        "aggregate_over_window",
        "SELECT a, SUM(b) OVER (PARTITION BY a) AS total FROM shop.t",
        r"^the window function SUM\(b\) OVER \(PARTITION BY a\)$",
        None,
    ),
    (
        "qualify",
        "SELECT a FROM shop.t QUALIFY ROW_NUMBER() OVER (ORDER BY b) = 1",
        r"^QUALIFY$",
        None,
    ),
    ("qualify_without_window", "SELECT a FROM shop.t QUALIFY a > 1", r"^QUALIFY$", None),
    ("limit", "SELECT a FROM shop.t LIMIT 10", r"^LIMIT/OFFSET$", None),
    ("offset", "SELECT a FROM shop.t LIMIT 10 OFFSET 5", r"^LIMIT/OFFSET$", None),
    ("order_by", "SELECT a FROM shop.t ORDER BY a", r"^ORDER BY$", r"remove the ORDER BY"),
    ("distinct_on", "SELECT DISTINCT ON (a) a, b FROM shop.t", r"^DISTINCT ON$", None),
    # nested queries
    (
        "subquery_in_from",
        "SELECT x.a FROM (SELECT a FROM shop.t) AS x",
        r"^a subquery$",
        r"own model",
    ),
    (
        "subquery_in_where",
        "SELECT a FROM shop.t WHERE a IN (SELECT a FROM shop.u)",
        r"^a subquery$",
        r"own model",
    ),
    (
        "exists_subquery",
        "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u WHERE u.a = t.a)",
        r"^a subquery$",
        r"own model",
    ),
    (
        "scalar_subquery",
        "SELECT a, (SELECT MAX(a) FROM shop.u) AS top FROM shop.t",
        r"^a subquery$",
        r"own model",
    ),
    (
        "cte",
        "WITH x AS (SELECT a FROM shop.t) SELECT a FROM x",
        r"^a common table expression \(WITH\)$",
        r"inline the CTE",
    ),
    # set operations
    (
        "union",
        "SELECT a FROM shop.t UNION SELECT a FROM shop.u",
        r"^the set operation UNION$",
        None,
    ),
    (
        "union_all",
        "SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u",
        r"^the set operation UNION ALL$",
        None,
    ),
    (
        "intersect",
        "SELECT a FROM shop.t INTERSECT SELECT a FROM shop.u",
        r"^the set operation INTERSECT$",
        None,
    ),
    (
        "except",
        "SELECT a FROM shop.t EXCEPT SELECT a FROM shop.u",
        r"^the set operation EXCEPT$",
        None,
    ),
    # aggregates outside COUNT/SUM/AVG
    (
        "min",
        "SELECT s, MIN(a) AS m FROM shop.t GROUP BY s",
        r"^the aggregate MIN$",
        r"COUNT, SUM or AVG",
    ),
    (
        "max",
        "SELECT s, MAX(a) AS m FROM shop.t GROUP BY s",
        r"^the aggregate MAX$",
        r"COUNT, SUM or AVG",
    ),
    (
        "max_in_having",
        "SELECT s, SUM(a) AS total FROM shop.t GROUP BY s HAVING MAX(b) > 1",
        r"^the aggregate MAX$",
        r"COUNT, SUM or AVG",
    ),
    (
        "stddev",
        "SELECT STDDEV(a) AS sd FROM shop.t",
        r"^the aggregate STDDEV$",
        r"COUNT, SUM or AVG",
    ),
    (
        "collect_list",
        "SELECT s, COLLECT_LIST(a) AS l FROM shop.t GROUP BY s",
        r"^the aggregate ",
        r"COUNT, SUM or AVG",
    ),
    (
        "count_if",
        "SELECT s, COUNT_IF(a > 1) AS n FROM shop.t GROUP BY s",
        r"^the aggregate COUNT_IF$",
        r"COUNT, SUM or AVG",
    ),
    (
        "count_distinct",
        "SELECT s, COUNT(DISTINCT a) AS n FROM shop.t GROUP BY s",
        r"^COUNT\(DISTINCT \.\.\.\)$",
        None,
    ),
    (
        "sum_distinct",
        "SELECT s, SUM(DISTINCT a) AS n FROM shop.t GROUP BY s",
        r"^SUM\(DISTINCT \.\.\.\)$",
        None,
    ),
    ("nested_aggregate", "SELECT SUM(SUM(a)) AS n FROM shop.t", r"^a nested aggregate$", None),
    (
        "filter_clause",
        "SELECT s, COUNT(*) FILTER (WHERE a > 0) AS n FROM shop.t GROUP BY s",
        r"^an aggregate FILTER clause$",
        r"SUM\(CASE WHEN cond THEN x END\)",
    ),
    # non-deterministic functions
    *[
        (
            f"nondeterministic_{name}",
            f"SELECT a, {call} AS v FROM shop.t",
            rf"^the non-deterministic function {shown}\(\)$",
            r"compute the value in the source table",
        )
        for name, call, shown in [
            ("rand", "RAND()", "RAND"),
            ("rand_seeded", "RAND(42)", "RAND"),
            ("randn", "RANDN()", "RANDN"),
            ("uuid", "UUID()", "UUID"),
            ("now", "NOW()", "NOW"),
            ("current_timestamp", "CURRENT_TIMESTAMP()", "CURRENT_TIMESTAMP"),
            ("current_timestamp_bare", "CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP"),
            ("current_date", "CURRENT_DATE()", "CURRENT_DATE"),
            (
                "monotonically_increasing_id",
                "MONOTONICALLY_INCREASING_ID()",
                "MONOTONICALLY_INCREASING_ID",
            ),
            ("spark_partition_id", "SPARK_PARTITION_ID()", "SPARK_PARTITION_ID"),
            ("input_file_name", "INPUT_FILE_NAME()", "INPUT_FILE_NAME"),
            ("shuffle", "SHUFFLE(arr)", "SHUFFLE"),
        ]
    ],
    (
        "nondeterministic_in_where",
        "SELECT a FROM shop.t WHERE RAND() < 0.5",
        r"^the non-deterministic function RAND\(\)$",
        r"compute the value in the source table",
    ),
    (
        "nondeterministic_in_aggregate",
        "SELECT s, SUM(a * RAND()) AS v FROM shop.t GROUP BY s",
        r"^the non-deterministic function RAND\(\)$",
        r"compute the value in the source table",
    ),
    # FROM-clause constructs
    (
        "lateral_view",
        "SELECT a, e FROM shop.t LATERAL VIEW EXPLODE(arr) x AS e",
        r"^LATERAL VIEW$",
        None,
    ),
    (
        "tablesample_percent",
        "SELECT a FROM shop.t TABLESAMPLE (10 PERCENT)",
        r"^TABLESAMPLE$",
        None,
    ),
    (
        "tablesample_bucket",
        "SELECT a FROM shop.t TABLESAMPLE (BUCKET 1 OUT OF 4)",
        r"^TABLESAMPLE$",
        None,
    ),
    (
        "table_function",
        "SELECT id FROM RANGE(10)",
        r"^the table function RANGE\(10\)$",
        r"Delta table",
    ),
    ("no_from", "SELECT 1 AS one", r"^a query without a FROM table$", r"exactly one Delta table"),
    (
        "time_travel_version",
        "SELECT a FROM shop.t VERSION AS OF 3",
        r"^time travel \(VERSION/TIMESTAMP AS OF\) in the model$",
        r"pins versions itself",
    ),
    (
        "time_travel_timestamp",
        "SELECT a FROM shop.t TIMESTAMP AS OF '2024-01-01'",
        r"^time travel \(VERSION/TIMESTAMP AS OF\) in the model$",
        r"pins versions itself",
    ),
    # grouping extensions
    (
        "rollup",
        "SELECT a, s, COUNT(*) AS n FROM shop.t GROUP BY ROLLUP (a, s)",
        r"^GROUP BY ROLLUP$",
        None,
    ),
    (
        "cube",
        "SELECT a, s, COUNT(*) AS n FROM shop.t GROUP BY CUBE (a, s)",
        r"^GROUP BY CUBE$",
        None,
    ),
    (
        "grouping_sets",
        "SELECT a, s, COUNT(*) AS n FROM shop.t GROUP BY GROUPING SETS ((a), (s))",
        r"^GROUP BY GROUPINGSETS$",
        None,
    ),
    (
        "with_rollup",
        "SELECT a, COUNT(*) AS n FROM shop.t GROUP BY a WITH ROLLUP",
        r"^GROUP BY ROLLUP$",
        None,
    ),
    # statements
    (
        "two_statements",
        "SELECT a FROM shop.t; SELECT a FROM shop.u",
        r"^2 SQL statements$",
        r"exactly one SELECT",
    ),
    (
        "not_a_select",
        "INSERT INTO shop.u SELECT a FROM shop.t",
        r"^a Insert statement$",
        r"one SELECT",
    ),
    (
        "unparsable",
        "SELECT a FROM shop.t WHERE",
        r"^SQL that the compiler's Spark parser rejects \(.+\)$",
        r"plain SELECT on Spark",
    ),
    # bookkeeping names
    (
        "reserved_alias",
        "SELECT a AS __ivm_count FROM shop.t",
        r"^the column name '__ivm_count' \(the prefix __ivm_ is reserved for bookkeeping\)$",
        r"rename the column",
    ),
    (
        "reserved_alias_any_case",
        "SELECT s, COUNT(*) AS __IVM_N FROM shop.t GROUP BY s",
        r"^the column name '__IVM_N' ",
        r"rename the column",
    ),
    (
        "reserved_column_reference",
        "SELECT a FROM shop.t WHERE __ivm_sign > 0",
        r"^the column name '__ivm_sign' ",
        r"rename the column",
    ),
    # what compile() refuses after asking the catalog
    (
        "unknown_column",
        "SELECT nope FROM shop.t",
        r"^a column the compiler cannot resolve against shop\.t ",
        r"check the column exists",
    ),
    (
        "column_outside_group_by",
        "SELECT s, b, COUNT(*) AS n FROM shop.t GROUP BY s",
        r"^the column `t`\.`b` outside GROUP BY and aggregates$",
        r"add it to GROUP BY or aggregate it",
    ),
    (
        "having_without_aggregates",
        "SELECT a FROM shop.t HAVING a > 1",
        r"^HAVING without aggregates$",
        None,
    ),
    (
        "distinct_with_aggregates",
        "SELECT DISTINCT s, COUNT(*) AS n FROM shop.t GROUP BY s",
        r"^SELECT DISTINCT together with aggregates$",
        None,
    ),
    (
        "map_column",
        "SELECT id, attrs FROM shop.kv",
        r"^the MAP column 'attrs' in a projection ",
        r"map_entries\(\)",
    ),
    (
        "map_column_distinct",
        "SELECT DISTINCT attrs FROM shop.kv",
        r"^the MAP column 'attrs' in a projection ",
        r"map_entries\(\)",
    ),
]

# What DESCRIBE QUERY answers for the few refused models that get that far.
DESCRIBE = {
    "SELECT nope FROM shop.t": [("nope", "int")],
    "SELECT s, b, COUNT(*) AS n FROM shop.t GROUP BY s": [
        ("s", "string"),
        ("b", "int"),
        ("n", "bigint"),
    ],
    "SELECT a FROM shop.t HAVING a > 1": [("a", "int")],
    "SELECT DISTINCT s, COUNT(*) AS n FROM shop.t GROUP BY s": [("s", "string"), ("n", "bigint")],
    "SELECT id, attrs FROM shop.kv": [("id", "int"), ("attrs", "map<string,int>")],
    "SELECT DISTINCT attrs FROM shop.kv": [("attrs", "map<string,int>")],
}


def test_cases_are_unique() -> None:
    ids = [case[0] for case in REFUSED]
    assert len(ids) == len(set(ids))
    sqls = [case[1] for case in REFUSED]
    assert len(sqls) == len(set(sqls))


@pytest.mark.parametrize(
    ("sql", "construct", "hint"), [pytest.param(*case[1:], id=case[0]) for case in REFUSED]
)
def test_refused(sql: str, construct: str, hint: str | None) -> None:
    catalog = FakeCatalog(SOURCES, sql, DESCRIBE.get(sql, [("a", "int")]))
    with pytest.raises(NotMaintainable) as raised:
        compile_model(MODEL, sql, catalog)
    error = raised.value
    message = str(error)
    assert error.model == MODEL
    assert message.startswith(f"Model '{MODEL}' cannot be maintained incrementally: ")
    assert re.search(construct, error.construct), error.construct
    assert f": {error.construct} is not supported by the ivm materialization." in message
    # The hint comes after 'Fix:' and says something.
    assert message.endswith(f"Fix: {error.hint}.")
    assert len(error.hint) > 10
    if hint is not None:
        assert re.search(hint, error.hint), error.hint
    else:
        assert error.hint == FALLBACK_HINT


def test_refusal_happens_before_describing_the_query() -> None:
    """Constructs refused by the parser never reach Spark, not even DESCRIBE QUERY."""
    sql = "SELECT a FROM shop.t ORDER BY a"
    catalog = FakeCatalog(SOURCES, sql, [("a", "int")])
    with pytest.raises(NotMaintainable):
        compile_model(MODEL, sql, catalog)
    assert catalog.asked == []


def test_describe_answering_other_columns_than_parsed_is_refused() -> None:
    # E.g. a source whose columns changed between the catalog read and DESCRIBE QUERY.
    sql = "SELECT a, b FROM shop.t"
    catalog = FakeCatalog(SOURCES, sql, [("a", "int")])
    with pytest.raises(NotMaintainable, match=r"2 parsed columns differ from the 1 Spark reports"):
        compile_model(MODEL, sql, catalog)


# parse.py promises to name "the construct as a user would write it"; these
# refusals name sqlglot's canonical node instead.
MISNAMED = [
    ("SELECT s, COLLECT_LIST(a) AS l FROM shop.t GROUP BY s", "COLLECT_LIST", "ARRAY_AGG"),
    ("SELECT a, UNIX_TIMESTAMP() AS u FROM shop.t", "UNIX_TIMESTAMP", "CURRENT_TIMESTAMP"),
    ("SELECT a FROM shop.t DISTRIBUTE BY a", "DISTRIBUTE BY", "ORDER BY"),
    ("SELECT a FROM shop.t SORT BY a", "SORT BY", "ORDER BY"),
]


@pytest.mark.parametrize(
    ("sql", "written", "shown"),
    [
        pytest.param(
            *case,
            id=case[1].lower().replace(" ", "_"),
            marks=pytest.mark.xfail(
                raises=AssertionError,
                strict=True,
                reason=f"refusal names {case[2]} for what the model writes as {case[1]}",
            ),
        )
        for case in MISNAMED
    ],
)
def test_refusal_names_the_construct_as_written(sql: str, written: str, shown: str) -> None:
    with pytest.raises(NotMaintainable) as raised:
        compile_model(MODEL, sql, FakeCatalog(SOURCES, sql, [("a", "int")]))
    assert shown not in raised.value.construct
    assert written in raised.value.construct
