"""Every construct the compiler refuses, table-driven.

Each refusal must happen while compiling (before any SQL runs) and say, in the
style of pg_ivm, which model, which construct, and how to fix it.
"""

from __future__ import annotations

import re

import pytest

from ivm_compiler import NotMaintainable, TableName, compile_model
from ivm_compiler.errors import FALLBACK_HINT
from ivm_compiler.nodes import split_nodes
from ivm_compiler.plan import MergeRule
from tests.unit.golden import FakeCatalog

MODEL = "my_model"
SOURCES = {
    "shop.t": [
        ("a", "int"),
        ("b", "int"),
        ("s", "string"),
        ("arr", "array<int>"),
        ("x", "double"),
        ("f", "float"),
    ],
    "shop.u": [("a", "int")],
    "shop.kv": [("id", "int"), ("attrs", "map<string,int>"), ("n", "int")],
    "shop.tagged": [("id", "int"), ("tags", "array<map<string,string>>")],
    "shop.docs": [("id", "int"), ("doc", "variant")],
    "shop.signed": [("id", "int"), ("__ivm_sign", "int")],
}

# (id, model SQL, regex the construct named in the message must match, regex for the hint or None)
REFUSED = [
    # joins without a delta rule
    (
        "right_semi_join",
        "SELECT u.a FROM shop.t RIGHT SEMI JOIN shop.u ON t.a = u.a",
        (
            r"^RIGHT SEMI JOIN \(inner, cross, LEFT, RIGHT, FULL, LEFT SEMI and LEFT ANTI joins "
            r"are maintained\)$"
        ),
        r"^write the condition as an inner JOIN, or ",
    ),
    # outer joins whose padding has no key rule
    (
        "right_join_after_another_join",
        "SELECT t.a FROM shop.t JOIN shop.kv ON t.a = kv.id RIGHT JOIN shop.u ON t.b = u.a",
        r"^a RIGHT JOIN of 'u' after other joins \(the rows it pads come from several inputs\)$",
        r"write it as a LEFT JOIN with the inputs swapped",
    ),
    (
        "full_join_after_another_join",
        "SELECT t.a FROM shop.t LEFT JOIN shop.kv ON t.a = kv.id FULL JOIN shop.u ON t.b = u.a",
        r"^a FULL JOIN of 'u' after other joins",
        r"build the joins before it as an ivm model of its own",
    ),
    (
        "outer_join_in_a_set_operation",
        "SELECT t.a FROM shop.t LEFT JOIN shop.u ON t.a = u.a UNION ALL SELECT a FROM shop.u",
        r"^an outer join inside an operand of UNION ALL$",
        r"build that operand as an ivm model of its own",
    ),
    (
        "natural_join",
        "SELECT t.a FROM shop.t NATURAL JOIN shop.u",
        r"^NATURAL JOIN$",
        r"JOIN \.\.\. USING \(\.\.\.\) or ON",
    ),
    (
        "duplicate_alias",
        "SELECT x.a FROM shop.t AS x JOIN shop.u AS x ON x.a = x.a",
        r"^two sources under the one name 'x'$",
        r"give each occurrence of a table its own alias",
    ),
    (
        "self_join_without_aliases",
        "SELECT t.a FROM shop.t JOIN shop.t ON t.a = t.b",
        r"^two sources under the one name 't'$",
        r"give each occurrence of a table its own alias",
    ),
    # windows and what depends on row order
    # Windows over joins, groups, EXISTS/IN and under DISTINCT are maintained
    # through a plan node (window_inputs.py, test_nodes.py); a top-k over
    # distinct windows' rows is not.
    (
        "window_with_distinct_and_top_k",
        "SELECT DISTINCT a, RANK() OVER (PARTITION BY a ORDER BY b) AS r FROM shop.t ORDER BY r LIMIT 3",
        r"^SELECT DISTINCT together with window functions and ORDER BY \.\.\. LIMIT$",
        r"^select the distinct rows in an ivm model of its own",
    ),
    (
        "window_function_not_maintained",
        "SELECT a, PERCENTILE(b, 0.5) OVER (PARTITION BY a) AS q FROM shop.t",
        r"^the window function PERCENTILE$",
        r"^use ROW_NUMBER, RANK, DENSE_RANK",
    ),
    (
        "qualify",
        "SELECT a FROM shop.t QUALIFY ROW_NUMBER() OVER (ORDER BY b) = 1",
        r"^QUALIFY \(which Spark 4.0 does not parse either\)$",
        r"where rn = 1$",
    ),
    (
        "qualify_without_window",
        "SELECT a FROM shop.t QUALIFY a > 1",
        r"^QUALIFY \(which Spark 4.0 does not parse either\)$",
        r"select the window function in a FROM-subquery",
    ),
    ("limit", "SELECT a FROM shop.t LIMIT 10", r"^LIMIT/OFFSET$", None),
    ("offset", "SELECT a FROM shop.t LIMIT 10 OFFSET 5", r"^LIMIT/OFFSET$", None),
    ("order_by", "SELECT a FROM shop.t ORDER BY a", r"^ORDER BY$", r"remove the ORDER BY"),
    # Spark's clauses that arrange rows, named as written.
    *[
        (
            f"{clause.lower().replace(' ', '_')}",
            f"SELECT a FROM shop.t {clause} a",
            rf"^{clause}$",
            rf"remove {clause}",
        )
        for clause in ("DISTRIBUTE BY", "SORT BY", "CLUSTER BY")
    ],
    ("distinct_on", "SELECT DISTINCT ON (a) a, b FROM shop.t", r"^DISTINCT ON$", None),
    (
        "distinct_on_with_window",
        "SELECT DISTINCT ON (a) a, RANK() OVER (PARTITION BY a ORDER BY b) AS r FROM shop.t",
        r"^DISTINCT ON$",
        None,
    ),
    # nested queries: in an expression, or a relation that does not merge into the query
    *[
        (
            name,
            sql,
            r"^a scalar subquery, or EXISTS/IN outside the WHERE clause$",
            (
                r"^write it as a JOIN, or as a condition of the outer query's WHERE \(EXISTS, NOT "
                r"EXISTS, IN and NOT IN are maintained there\), or "
            ),
        )
        for name, sql in [
            ("scalar_subquery", "SELECT a, (SELECT MAX(a) FROM shop.u) AS top FROM shop.t"),
            (
                "exists_in_select_list",
                "SELECT a, EXISTS (SELECT 1 FROM shop.u WHERE u.a = t.a) AS e FROM shop.t",
            ),
            (
                "in_subquery_in_having",
                (
                    "SELECT s, COUNT(*) AS n FROM shop.t GROUP BY s HAVING MAX(a) IN "
                    "(SELECT a FROM shop.u)"
                ),
            ),
            (
                "exists_in_a_join_condition",
                (
                    "SELECT t.a FROM shop.t JOIN shop.kv ON t.a = kv.id AND EXISTS "
                    "(SELECT 1 FROM shop.u WHERE u.a = t.a)"
                ),
            ),
            (
                "exists_in_a_cte",
                (
                    "WITH x AS (SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u "
                    "WHERE u.a = t.a)) SELECT a FROM x"
                ),
            ),
        ]
    ],
    # EXISTS / IN subqueries outside what a semi join against distinct keys stands for
    (
        "exists_under_or",
        "SELECT a FROM shop.t WHERE b > 0 OR EXISTS (SELECT 1 FROM shop.u WHERE u.a = t.a)",
        r"^an EXISTS or IN subquery under OR, NOT or another expression \(EXISTS\(",
        r"^make each EXISTS, NOT EXISTS, IN and NOT IN test a condition of its own in WHERE",
    ),
    (
        "in_subquery_inside_case",
        "SELECT a FROM shop.t WHERE CASE WHEN b > 0 THEN a IN (SELECT a FROM shop.u) END",
        r"^an EXISTS or IN subquery under OR, NOT or another expression",
        r"joined to the others with AND",
    ),
    (
        "not_in_subquery_reading_the_outer_row",
        "SELECT a FROM shop.t WHERE a NOT IN (SELECT u.a + t.b FROM shop.u)",
        r"^the NOT IN subquery's column `u`.`a` \+ `t`.`b`, which reads the outer query$",
        r"^select columns of the subquery's own table",
    ),
    (
        "not_exists_subquery_with_limit",
        "SELECT a FROM shop.t WHERE NOT EXISTS (SELECT 1 FROM shop.u WHERE u.a = t.a LIMIT 1)",
        r"^LIMIT in a NOT EXISTS subquery \(which rows it keeps depends on their order\)$",
        r"^remove it, or ",
    ),
    # Subqueries kept as plan nodes (subquery_inputs.py) whose correlation cannot be taken out
    (
        "correlated_aggregate_without_group_by",
        "SELECT a FROM shop.t WHERE b IN (SELECT MAX(u.a) FROM shop.u WHERE u.a = t.a)",
        (
            r"^an IN subquery that aggregates without GROUP BY and reads the outer query "
            r"\(over an outer row's empty set of rows it still has one row"
        ),
        r"^GROUP BY the subquery's correlated column",
    ),
    (
        "aggregate_correlated_by_a_comparison",
        "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u WHERE u.a < t.a GROUP BY u.a)",
        (
            r"^the condition `u`.`a` < `t`.`a` in an EXISTS subquery that aggregates \(it "
            r"relates the subquery to the outer query other than by an equality"
        ),
        r"^correlate an aggregating subquery by equalities of its columns",
    ),
    (
        "correlation_in_a_subquerys_join",
        (
            "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u JOIN shop.kv "
            "ON u.a = kv.id AND kv.n = t.b)"
        ),
        (
            r"^the outer query's column `t`.`b` read by an EXISTS subquery outside the "
            r"top-level AND conditions of its WHERE"
        ),
        r"^move the correlation into the subquery's WHERE",
    ),
    (
        "correlation_in_a_nested_subquerys_condition",
        (
            "SELECT a FROM shop.t WHERE a IN (SELECT u.a FROM shop.u "
            "WHERE u.a IN (SELECT kv.id FROM shop.kv WHERE kv.n = t.b))"
        ),
        r"^the condition `u`.`a` IN \(SELECT .* in an IN subquery, which nests a subquery that",
        r"^correlate the inner subquery with the subquery's own tables",
    ),
    (
        "not_in_over_two_columns",
        "SELECT a FROM shop.t WHERE (a, b) NOT IN (SELECT id, n FROM shop.kv)",
        r"^NOT IN over several columns \(its NULL rules compare the columns one by one\)$",
        r"^write NOT EXISTS with an equality per column",
    ),
    (
        "semi_join_subquery_in_a_set_operation",
        "SELECT a FROM shop.t WHERE a IN (SELECT a FROM shop.u) UNION ALL SELECT a FROM shop.u",
        r"^an IN subquery inside an operand of a set operation$",
        r"build that operand as an ivm model of its own",
    ),
    (
        "left_semi_join_in_a_set_operation",
        "SELECT t.a FROM shop.t LEFT SEMI JOIN shop.u ON t.a = u.a UNION ALL SELECT a FROM shop.u",
        r"^a LEFT SEMI or LEFT ANTI JOIN inside an operand of UNION ALL$",
        r"build that operand as an ivm model of its own",
    ),
    (
        "semi_join_using",
        "SELECT t.a FROM shop.t LEFT SEMI JOIN shop.u USING (a)",
        r"^a LEFT SEMI JOIN of 'u' with USING$",
        r"^write the equalities in ON",
    ),
    (
        "full_join_after_a_semi_join",
        "SELECT t.a FROM shop.t LEFT ANTI JOIN shop.u ON t.a = u.a FULL JOIN shop.kv ON t.a = kv.id",
        r"^a FULL JOIN after a LEFT SEMI or LEFT ANTI JOIN$",
        r"^start the FROM clause with the outer join",
    ),
    # set operations: operands that aggregate or nest another operation are plan nodes
    (
        "order_by_on_a_union",
        "SELECT a FROM shop.t UNION ALL SELECT a FROM shop.u ORDER BY a",
        r"^ORDER BY on the result of UNION ALL$",
        None,
    ),
    # aggregates outside COUNT/SUM/AVG/MIN/MAX, COUNT(DISTINCT x), STDDEV, VARIANCE, COVAR, CORR
    (
        "any_value",
        "SELECT s, ANY_VALUE(a) AS v FROM shop.t GROUP BY s",
        r"^the aggregate ANY_VALUE$",
        r"COUNT, SUM, AVG, MIN, MAX, COUNT\(DISTINCT x\), STDDEV.*COVAR_POP, COVAR_SAMP, CORR",
    ),
    (
        "covar_in_a_window",
        "SELECT a, COVAR_POP(a, x) OVER (PARTITION BY s) AS c FROM shop.t",
        r"^the window function COVAR_POP$",
        r"^use ROW_NUMBER, RANK",
    ),
    (
        "collect_list",
        "SELECT s, COLLECT_LIST(a) AS l FROM shop.t GROUP BY s",
        r"^the aggregate COLLECT_LIST$",
        r"COUNT, SUM, AVG, MIN, MAX, COUNT\(DISTINCT x\), STDDEV",
    ),
    (
        "collect_set",
        "SELECT s, COLLECT_SET(a) AS l FROM shop.t GROUP BY s",
        r"^the aggregate COLLECT_SET$",
        r"COUNT, SUM, AVG, MIN, MAX, COUNT\(DISTINCT x\), STDDEV",
    ),
    (
        "count_if",
        "SELECT s, COUNT_IF(a > 1) AS n FROM shop.t GROUP BY s",
        r"^the aggregate COUNT_IF$",
        r"COUNT, SUM, AVG, MIN, MAX, COUNT\(DISTINCT x\), STDDEV",
    ),
    (
        "count_if_in_having",
        "SELECT s, MAX(a) AS m FROM shop.t GROUP BY s HAVING COUNT_IF(b > 1) > 0",
        r"^the aggregate COUNT_IF$",
        r"COUNT, SUM, AVG, MIN, MAX, COUNT\(DISTINCT x\), STDDEV",
    ),
    # DISTINCT inside an aggregate: only COUNT(DISTINCT x) of one expression
    *[
        (
            name,
            f"SELECT s, {call} AS n FROM shop.t GROUP BY s",
            rf"^{shown}\(DISTINCT \.\.\.\)$",
            (
                r"^COUNT\(DISTINCT x\) of one expression is maintained; for others "
                r"aggregate a SELECT DISTINCT model, or "
            ),
        )
        for name, call, shown in [
            ("count_distinct_of_two_columns", "COUNT(DISTINCT a, b)", "COUNT"),
            ("sum_distinct", "SUM(DISTINCT a)", "SUM"),
            ("avg_distinct", "AVG(DISTINCT a)", "AVG"),
        ]
    ],
    ("nested_aggregate", "SELECT SUM(SUM(a)) AS n FROM shop.t", r"^a nested aggregate$", None),
    (
        "count_several_arguments",
        "SELECT s, COUNT(a, b) AS n FROM shop.t GROUP BY s",
        r"^COUNT with several arguments$",
        r"COUNT\(CASE WHEN a IS NOT NULL AND b IS NOT NULL THEN 1 END\)",
    ),
    (
        "count_several_arguments_in_having",
        "SELECT s FROM shop.t GROUP BY s HAVING COUNT(a, b) > 0",
        r"^COUNT with several arguments$",
        r"COUNT\(CASE WHEN",
    ),
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
            ("unix_timestamp", "UNIX_TIMESTAMP()", "UNIX_TIMESTAMP"),
            # Spark 4's random generators.
            ("uniform", "UNIFORM(0, 10)", "UNIFORM"),
            ("uniform_seeded", "UNIFORM(0, 10, 42)", "UNIFORM"),
            ("randstr", "RANDSTR(5)", "RANDSTR"),
            # Calls into Java, which Spark marks non-deterministic.
            ("reflect", "REFLECT('java.util.UUID', 'randomUUID')", "REFLECT"),
            ("java_method", "JAVA_METHOD('java.util.UUID', 'randomUUID')", "JAVA_METHOD"),
            ("try_reflect", "TRY_REFLECT('java.util.UUID', 'randomUUID')", "TRY_REFLECT"),
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
    # generators in the SELECT list: one row becomes several
    *[
        (
            f"generator_{name}",
            f"SELECT a, {call} FROM shop.t",
            rf"^the generator {shown}\(\) in the SELECT list$",
            r"Delta table of their own",
        )
        for name, call, shown in [
            ("explode", "EXPLODE(arr) AS e", "EXPLODE"),
            ("explode_map", "EXPLODE(MAP(a, b)) AS (k, v)", "EXPLODE"),
            ("explode_outer", "EXPLODE_OUTER(arr) AS e", "EXPLODE_OUTER"),
            ("posexplode", "POSEXPLODE(arr) AS (p, e)", "POSEXPLODE"),
            ("posexplode_outer", "POSEXPLODE_OUTER(arr) AS (p, e)", "POSEXPLODE_OUTER"),
            ("inline", "INLINE(ARRAY(STRUCT(a, b)))", "INLINE"),
            ("inline_outer", "INLINE_OUTER(ARRAY(STRUCT(a, b)))", "INLINE_OUTER"),
            ("stack", "STACK(2, a, b) AS v", "STACK"),
            ("json_tuple", "JSON_TUPLE(s, 'k1', 'k2')", "JSON_TUPLE"),
        ]
    ],
    # FROM-clause constructs
    ("pivot", "SELECT * FROM shop.t PIVOT (SUM(b) FOR s IN ('x', 'y'))", r"^PIVOT$", None),
    ("unpivot", "SELECT * FROM shop.t UNPIVOT (v FOR k IN (a, b))", r"^UNPIVOT$", None),
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
    (
        "no_from",
        "SELECT 1 AS one",
        r"^a query without a FROM table$",
        r"read Delta tables through source\(\) or ref\(\)",
    ),
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
    # The source's own column is refused even when the model never reads it: change
    # rows would carry two __ivm_sign columns.
    (
        "reserved_source_column",
        "SELECT id FROM shop.signed",
        r"^the source column '__ivm_sign' of shop\.signed \(the prefix __ivm_ is reserved ",
        r"rename the column in the source",
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
        "untyped_null_output",
        "SELECT a, NULL AS note FROM shop.t",
        r"^the untyped NULL in column 'note' of type void \(Delta cannot store a column of type VOID\)$",
        r"CAST\(NULL AS STRING\) AS note",
    ),
    # values Spark cannot compare, where rows are identified by them
    (
        "map_column",
        "SELECT id, attrs FROM shop.kv",
        r"^the MAP column 'attrs' of type map<string,int> ",
        r"map_entries\(\)",
    ),
    (
        "map_column_distinct",
        "SELECT DISTINCT attrs FROM shop.kv",
        r"^the MAP column 'attrs' of type map<string,int> ",
        r"map_entries\(\)",
    ),
    (
        "map_nested_in_a_projected_array",
        "SELECT * FROM shop.tagged",
        r"^the MAP column 'tags' of type array<map<string,string>> ",
        r"map_entries\(\)",
    ),
    (
        "variant_column",
        "SELECT id, doc FROM shop.docs",
        r"^the VARIANT column 'doc' of type variant ",
        r"to_json\(\)",
    ),
    (
        "map_group_key",
        "SELECT attrs, COUNT(*) AS n FROM shop.kv GROUP BY attrs",
        r"^the MAP GROUP BY key '`kv`\.`attrs`' of type map<string,int> ",
        r"map_entries\(\)",
    ),
    (
        "map_group_key_left_out_of_the_select_list",
        "SELECT COUNT(*) AS n FROM shop.kv GROUP BY attrs",
        r"^the MAP GROUP BY key '`kv`\.`attrs`' of type map<string,int> ",
        r"map_entries\(\)",
    ),
    (
        "map_nested_in_a_group_key",
        "SELECT NAMED_STRUCT('m', attrs) AS sm, COUNT(*) AS n FROM shop.kv GROUP BY 1",
        r"^the MAP GROUP BY key 'STRUCT\(`kv`\.`attrs` AS `m`\)' of type struct<m:map<string,int>> ",
        r"map_entries\(\)",
    ),
    (
        "map_count_distinct_argument",
        "SELECT id, COUNT(DISTINCT attrs) AS n FROM shop.kv GROUP BY id",
        r"^the MAP MIN/MAX/COUNT\(DISTINCT\) argument '`kv`\.`attrs`' of type map<string,int> ",
        r"map_entries\(\)",
    ),
    (
        "variant_group_key",
        "SELECT doc, COUNT(*) AS n FROM shop.docs GROUP BY doc",
        r"^the VARIANT GROUP BY key '`docs`\.`doc`' of type variant ",
        r"to_json\(\)",
    ),
]

# What DESCRIBE QUERY answers for the refused models that get that far, and for the
# type probe of those among them that get to it: Spark 4.0.1's answers, except where
# a comment says otherwise.
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
    "SELECT * FROM shop.tagged": [("id", "int"), ("tags", "array<map<string,string>>")],
    "SELECT id, doc FROM shop.docs": [("id", "int"), ("doc", "variant")],
    "SELECT a, NULL AS note FROM shop.t": [("a", "int"), ("note", "void")],
    "SELECT attrs, COUNT(*) AS n FROM shop.kv GROUP BY attrs": [
        ("attrs", "map<string,int>"),
        ("n", "bigint"),
    ],
    "SELECT COUNT(*) AS n FROM shop.kv GROUP BY attrs": [("n", "bigint")],
    "SELECT NAMED_STRUCT('m', attrs) AS sm, COUNT(*) AS n FROM shop.kv GROUP BY 1": [
        ("sm", "struct<m:map<string,int>>"),
        ("n", "bigint"),
    ],
    "SELECT id, COUNT(DISTINCT attrs) AS n FROM shop.kv GROUP BY id": [
        ("id", "int"),
        ("n", "bigint"),
    ],
    # Not Spark 4.0.1's answer: it rejects grouping by a VARIANT (or by an ARRAY or
    # STRUCT holding one) already here, with GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE,
    # so the compiler never asks its probe. The case keeps the compiler's own check
    # honest for a Spark that would accept the model.
    "SELECT doc, COUNT(*) AS n FROM shop.docs GROUP BY doc": [("doc", "variant"), ("n", "bigint")],
    "SELECT s, SUM(x) AS total FROM shop.t GROUP BY s": [("s", "string"), ("total", "double")],
    "SELECT s, AVG(x) AS mean FROM shop.t GROUP BY s": [("s", "string"), ("mean", "double")],
    "SELECT AVG(f) AS mean FROM shop.t": [("mean", "double")],
    "SELECT SUM(a * x) AS total FROM shop.t": [("total", "double")],
    "SELECT s FROM shop.t GROUP BY s HAVING SUM(x) > 0": [("s", "string")],
}
PROBE = {
    "SELECT s, b, COUNT(*) AS n FROM shop.t GROUP BY s": [("key_0", "string")],
    "SELECT attrs, COUNT(*) AS n FROM shop.kv GROUP BY attrs": [("key_0", "map<string,int>")],
    "SELECT COUNT(*) AS n FROM shop.kv GROUP BY attrs": [("key_0", "map<string,int>")],
    "SELECT NAMED_STRUCT('m', attrs) AS sm, COUNT(*) AS n FROM shop.kv GROUP BY 1": [
        ("key_0", "struct<m:map<string,int>>")
    ],
    # Not Spark 4.0.1's answer: the probe asks MIN(attrs) for the argument's type, and
    # Spark rejects MIN over a MAP (DATATYPE_MISMATCH.INVALID_ORDERING_TYPE), so on
    # Spark this model fails at the probe with that error instead of this refusal.
    "SELECT id, COUNT(DISTINCT attrs) AS n FROM shop.kv GROUP BY id": [
        ("key_0", "int"),
        ("value_0", "map<string,int>"),
    ],
    # Not Spark 4.0.1's answer either (see DESCRIBE above).
    "SELECT doc, COUNT(*) AS n FROM shop.docs GROUP BY doc": [("key_0", "variant")],
    "SELECT s, SUM(x) AS total FROM shop.t GROUP BY s": [("key_0", "string"), ("sum_0", "double")],
    "SELECT s, AVG(x) AS mean FROM shop.t GROUP BY s": [
        ("key_0", "string"),
        ("sum_0", "double"),
        ("avg_0", "double"),
    ],
    # SUM over FLOAT is a DOUBLE in Spark.
    "SELECT AVG(f) AS mean FROM shop.t": [("sum_0", "double"), ("avg_0", "double")],
    "SELECT SUM(a * x) AS total FROM shop.t": [("sum_0", "double")],
    "SELECT s FROM shop.t GROUP BY s HAVING SUM(x) > 0": [("key_0", "string"), ("sum_0", "double")],
}


def test_cases_are_unique() -> None:
    ids = [case[0] for case in REFUSED]
    assert len(ids) == len(set(ids))
    sqls = [case[1] for case in REFUSED]
    assert len(sqls) == len(set(sqls))


# Refusals the compiler gets wrong today, by case id: strict xfails, so a fix asks
# for the marker's removal.
WRONG_TODAY: dict[str, str] = {}


@pytest.mark.parametrize(
    ("sql", "construct", "hint"),
    [
        pytest.param(
            *case[1:],
            id=case[0],
            marks=[
                pytest.mark.xfail(
                    raises=(AssertionError, pytest.fail.Exception),
                    strict=True,
                    reason=WRONG_TODAY[case[0]],
                )
            ]
            if case[0] in WRONG_TODAY
            else [],
        )
        for case in REFUSED
    ],
)
def test_refused(sql: str, construct: str, hint: str | None) -> None:
    catalog = FakeCatalog(SOURCES, sql, DESCRIBE.get(sql, [("a", "int")]), PROBE.get(sql))
    with pytest.raises(NotMaintainable) as raised:
        # As a refresh does: plan nodes first, then the model's query.
        split = split_nodes(MODEL, sql, TableName("shop", MODEL), catalog.columns)
        assert not split.nodes, f"{sql} is maintained through plan nodes (test_nodes.py)"
        compile_model(MODEL, sql, catalog)
    # A probe answer the compiler never asked for is stale.
    assert ("describe probe" in catalog.asked) == (sql in PROBE)
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


# Once refused ("it compares the two sides other than by equality", "no
# equality between the two sides"), now kept by partner filters
# (plan.PartnerFilter): an outer join's padding and a semi or anti join
# decided by the whole condition, row by row.
COMPARING_THE_SIDES = [
    "SELECT t.a FROM shop.t LEFT JOIN shop.u ON t.a = u.a AND t.b < u.a",
    "SELECT t.a FROM shop.t LEFT JOIN shop.u ON t.b > 0 AND u.a > 0",
    "SELECT a FROM shop.t WHERE EXISTS (SELECT 1 FROM shop.u WHERE u.a < t.a)",
    "SELECT t.a FROM shop.t LEFT SEMI JOIN shop.u ON t.a = u.a AND t.b <> u.a",
]


@pytest.mark.parametrize("sql", COMPARING_THE_SIDES)
def test_conditions_comparing_the_sides_are_kept_by_partner_filters(sql: str) -> None:
    plan = compile_model(MODEL, sql, FakeCatalog(SOURCES, sql, [("a", "int")]))
    filters = [f for term in plan.join_terms for f in term.filters]
    assert [f.source.alias for f in filters] == ["u"]
    assert not any(term.key_relations for term in plan.join_terms)


# Once refused ("floating-point sums drift"), now kept by rules/floating.py: the
# DESCRIBE and PROBE answers above are theirs.
FLOATING_POINT_SUMS = [
    "SELECT s, SUM(x) AS total FROM shop.t GROUP BY s",
    "SELECT s, AVG(x) AS mean FROM shop.t GROUP BY s",
    "SELECT AVG(f) AS mean FROM shop.t",
    "SELECT SUM(a * x) AS total FROM shop.t",
    "SELECT s FROM shop.t GROUP BY s HAVING SUM(x) > 0",
]


@pytest.mark.parametrize("sql", FLOATING_POINT_SUMS)
def test_floating_point_sums_are_kept_compensated(sql: str) -> None:
    catalog = FakeCatalog(SOURCES, sql, DESCRIBE[sql], PROBE[sql])
    plan = compile_model(MODEL, sql, catalog)
    rules = {c.name: c.rule for c in plan.state_columns}
    assert rules["__ivm_sum_a0"] is MergeRule.COMPENSATED_SUM
    assert rules["__ivm_err_a0"] is MergeRule.SUM_ERROR
    assert {rules[f"__ivm_{kind}_a0"] for kind in ("nan", "pinf", "ninf")} == {MergeRule.ADD}


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


def test_reserved_source_column_is_refused_before_describing_the_query() -> None:
    sql = "SELECT id FROM shop.signed"
    catalog = FakeCatalog(SOURCES, sql, [("id", "int")])
    with pytest.raises(NotMaintainable):
        compile_model(MODEL, sql, catalog)
    assert catalog.asked == ["columns shop.signed"]


# parse.py promises to name "the construct as a user would write it"; these
# refusals once named sqlglot's canonical node instead (a synonym of the call).
MISNAMED = [
    ("SELECT s, COLLECT_LIST(a) AS l FROM shop.t GROUP BY s", "COLLECT_LIST", "ARRAY_AGG"),
    ("SELECT s, ARRAY_AGG(a) AS l FROM shop.t GROUP BY s", "ARRAY_AGG", "COLLECT_LIST"),
    ("SELECT a, UNIX_TIMESTAMP() AS u FROM shop.t", "UNIX_TIMESTAMP", "CURRENT_TIMESTAMP"),
    ("SELECT a, RANDOM() AS r FROM shop.t", "RANDOM", "RAND("),
    ("SELECT a, CURDATE() AS d FROM shop.t", "CURDATE", "CURRENT_DATE"),
    ("SELECT a FROM shop.t DISTRIBUTE BY a", "DISTRIBUTE BY", "ORDER BY"),
    ("SELECT a FROM shop.t SORT BY a", "SORT BY", "ORDER BY"),
    ("SELECT a FROM shop.t CLUSTER BY a", "CLUSTER BY", "ORDER BY"),
]


@pytest.mark.parametrize(
    ("sql", "written", "shown"),
    [pytest.param(*case, id=case[1].lower().replace(" ", "_")) for case in MISNAMED],
)
def test_refusal_names_the_construct_as_written(sql: str, written: str, shown: str) -> None:
    with pytest.raises(NotMaintainable) as raised:
        compile_model(MODEL, sql, FakeCatalog(SOURCES, sql, [("a", "int")]))
    assert shown not in raised.value.construct
    assert written in raised.value.construct
