"""Parse a model's compiled SQL and refuse, before any SQL runs, what cannot be maintained.

The checks walk sqlglot's tree (Spark dialect); nothing here inspects SQL text.
Each refusal names the construct as a user would write it and, where one
exists, a rewrite that the ivm materialization does support.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ivm_compiler import window_filters
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable, first_line
from ivm_compiler.names import is_reserved
from ivm_compiler.rules import booleans, covariance, moments, semi_joins
from ivm_compiler.rules.semi_joins import SUBQUERY_PREDICATES
from ivm_compiler.sql import DIALECT, from_tables, set_operation_branches, set_operation_kind
from ivm_compiler.view_classes import set_operation, window
from ivm_compiler.view_classes.top_k import without_top_k
from ivm_compiler.window_inputs import inline_named_windows

# Functions whose result changes between evaluations of the same input: a
# maintained row computed with one could never be deleted again exactly.
NON_DETERMINISTIC_FUNCTIONS = frozenset(
    {
        "rand",
        "randn",
        "random",
        "uuid",
        "shuffle",
        "now",
        "current_timestamp",
        "current_date",
        "current_time",
        "localtimestamp",
        "curdate",
        "monotonically_increasing_id",
        "spark_partition_id",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
        "uniform",
        "randstr",
        "reflect",
        "java_method",
        "try_reflect",
    }
)
NON_DETERMINISTIC_NODES: tuple[type[exp.Expr], ...] = (
    exp.Rand,
    exp.Randn,
    exp.Uuid,
    exp.CurrentTimestamp,
    exp.CurrentDate,
    exp.CurrentTime,
    exp.Uniform,
)

# Table-generating functions: one input row becomes several output rows.
GENERATOR_NODES: tuple[type[exp.Expr], ...] = (
    exp.Explode,
    exp.Inline,
    exp.Stack,
    exp.Unnest,
)
GENERATOR_FUNCTIONS = frozenset(
    {"json_tuple", "inline_outer", "posexplode_outer", "explode_outer", "stack"}
)

# Spark aggregates sqlglot parses as anonymous functions: refused by name like
# every other aggregate outside SUPPORTED_AGGREGATES.
ANONYMOUS_AGGREGATES = frozenset(
    {
        "try_sum",
        "try_avg",
        "std",
        "histogram_numeric",
        "count_min_sketch",
        "hll_sketch_agg",
        "hll_union_agg",
        "kurtosis",
        "skewness",
        "mode",
        "median",
        "percentile",
        "percentile_approx",
        "approx_percentile",
        "regr_count",
        "regr_sxx",
        "regr_syy",
        "regr_sxy",
        "regr_avgx",
        "regr_avgy",
        "regr_slope",
        "regr_intercept",
        "regr_r2",
        "bit_and",
        "bit_or",
        "bit_xor",
        "bitmap_construct_agg",
        "bitmap_or_agg",
    }
)

# Aggregates the compiler maintains; the rest are refused by name.
SUPPORTED_AGGREGATES: tuple[type[exp.Expr], ...] = (
    exp.Count,
    exp.Sum,
    exp.Avg,
    exp.Min,
    exp.Max,
    *moments.AGGREGATES,
    *booleans.AGGREGATES,
    *covariance.AGGREGATES,
)
SUPPORTED_AGGREGATES_TEXT = (
    "COUNT, SUM, AVG, MIN, MAX, COUNT(DISTINCT x), STDDEV[_SAMP|_POP], VARIANCE|VAR_SAMP|VAR_POP, "
    "COVAR_POP, COVAR_SAMP, CORR, BOOL_AND|EVERY or BOOL_OR|SOME|ANY"
)


def parse_model(model: str, sql: str) -> exp.Query:
    """Parse the model's SQL into one SELECT or one set operation of SELECTs, or raise."""
    tree = parse_statement(model, sql)
    check_supported(model, tree)
    assert isinstance(tree, (exp.Select, exp.SetOperation))
    return tree


def parse_statement(model: str, sql: str) -> exp.Expr:
    """Parse the model's SQL into its one statement, whatever it contains."""
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except ParseError as error:
        raise NotMaintainable(
            model,
            f"SQL that the compiler's Spark parser rejects ({first_line(error)})",
            "check the model compiles and runs as a plain SELECT on Spark",
        ) from error
    if len(statements) != 1:
        raise NotMaintainable(
            model, f"{len(statements)} SQL statements", "a model must be exactly one SELECT"
        )
    _note_written_names(sql, statements[0])
    # Named windows as the windows they name, EVERY/SOME as BOOL_AND/BOOL_OR:
    # every later stage sees one form of each.
    return booleans.as_named(inline_named_windows(model, statements[0]))


# The key of a function node's meta that holds its name as the model's SQL spells it.
WRITTEN_NAME = "ivm_written_name"


def _note_written_names(sql: str, tree: exp.Expr) -> None:
    """Keep each function's name as written in its node's meta, for refusals to show.

    sqlglot reads synonyms as one node (ARRAY_AGG and COLLECT_LIST, RANDOM and
    RAND, CURDATE and CURRENT_DATE), which renders under one of the names; a
    refusal must name the call the model makes. The parser marks where each
    function's name token stands in `sql`.
    """
    for node in tree.find_all(exp.Func):
        start, end = node.meta.get("start"), node.meta.get("end")
        if isinstance(start, int) and isinstance(end, int):
            name = sql[start : end + 1]
            if name.replace("_", "").isalnum():
                node.meta[WRITTEN_NAME] = name


def check_supported(model: str, tree: exp.Expr) -> None:
    """Raise NotMaintainable naming the first construct outside the supported view classes."""
    tree = without_top_k(tree)
    branches = set_operation_branches(tree)
    if isinstance(tree, exp.SetOperation):
        set_operation.check_shape(model, tree)
    elif not isinstance(tree, exp.Select):
        raise NotMaintainable(
            model, f"a {type(tree).__name__} statement", "a model must be one SELECT"
        )

    for branch in branches:
        # A SELECT, or a parenthesised operand (a Subquery): the tree is one of those above.
        assert isinstance(branch, exp.Query)
        allowed = semi_joins.check(model, branch, in_set_operation=len(branches) > 1)
        windows = [w for p in branch.expressions for w in p.find_all(exp.Window)]
        if len(branches) == 1 and windows:
            # Window functions in the SELECT list of a single SELECT are maintained
            # by recomputing the partitions a change touches (view_classes/window.py).
            window.check_shape(model, branch, merged=False)
            allowed |= {id(w) for w in windows}
        elif len(branches) == 1 and isinstance(branch, exp.Select):
            # A filter over one windowed SELECT (window_filters.py): its windows are maintained
            # as the model's own.
            filtered = window_filters.filtered_windows(branch)
            if filtered is not None:
                window.check_shape(model, filtered, merged=False)
                allowed |= {id(w) for w in window.windows_of(filtered)}
        for node in branch.walk():
            _check_node(model, branch, node, allowed)
            if isinstance(node, exp.Select):
                _check_relation_names(model, node)

    tables = list(tree.find_all(exp.Table))
    if not tables:
        raise NotMaintainable(
            model, "a query without a FROM table", "read Delta tables through source() or ref()"
        )
    for table in tables:
        if not isinstance(table.this, exp.Identifier):
            raise NotMaintainable(
                model,
                f"the table function {table.this.sql(dialect=DIALECT)}",
                "read a Delta table through source() or ref()",
            )
        if table.args.get("version"):
            raise NotMaintainable(
                model,
                "time travel (VERSION/TIMESTAMP AS OF) in the model",
                "reference the current table: the materialization pins versions itself",
            )


def _is_relation(node: exp.Expr) -> bool:
    """A query used as a relation: a CTE's body or a derived table in FROM/JOIN."""
    if isinstance(node, exp.Subquery):
        return isinstance(node.parent, (exp.From, exp.Join))
    if isinstance(node, exp.Select):
        return isinstance(node.parent, exp.CTE) or (
            isinstance(node.parent, exp.Subquery) and _is_relation(node.parent)
        )
    return False


def _check_node(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    """Refuse the node if it is a construct without a delta rule: NODE_CHECKS, in order."""
    for check in NODE_CHECKS:
        check(model, root, node, allowed)


def _refuse_inner_set_operation(
    model: str, root: exp.Query, node: exp.Expr, allowed: set[int]
) -> None:
    if isinstance(node, exp.SetOperation):
        raise NotMaintainable(
            model,
            f"the set operation {set_operation_kind(node)} inside the query",
            "make it the whole model (an ivm model of its own) and ref() it, or " + FALLBACK_HINT,
        )


def _refuse_scalar_subquery(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    if (
        node is not root
        and isinstance(node, (exp.Select, exp.Subquery))
        and not _is_relation(node)
        and id(node) not in allowed
    ):
        raise NotMaintainable(
            model,
            "a scalar subquery, or EXISTS/IN outside the WHERE clause",
            "write it as a JOIN, or as a condition of the outer query's WHERE "
            f"({SUBQUERY_PREDICATES} are maintained there), or " + FALLBACK_HINT,
        )


def _refuse_join(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    if isinstance(node, exp.Join):
        _check_join(model, node)


def _refuse_pivot(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    if isinstance(node, exp.Pivot):
        raise NotMaintainable(model, "UNPIVOT" if node.args.get("unpivot") else "PIVOT")


def _refuse_misplaced_window(
    model: str, root: exp.Query, node: exp.Expr, allowed: set[int]
) -> None:
    if isinstance(node, exp.Window) and id(node) not in allowed:
        raise NotMaintainable(
            model,
            f"the window function {node.sql(dialect=DIALECT)} outside the SELECT list of a "
            "single SELECT (inside a set operation's operand or a subquery)",
            "compute the window functions in a model (or a FROM-subquery) of their own, "
            "or " + FALLBACK_HINT,
        )


def _refuse_qualify(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    if isinstance(node, exp.Qualify):
        # Spark 4.0.1's own parser rejects QUALIFY as well.
        raise NotMaintainable(
            model,
            "QUALIFY (which Spark 4.0 does not parse either)",
            "select the window function in a FROM-subquery and filter on it outside: "
            "select * from (select *, row_number() over (...) as rn from t) where rn = 1",
        )


def _refuse_row_order(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    """LIMIT/OFFSET, DISTRIBUTE/SORT/CLUSTER BY, and ORDER BY of the model's SELECT."""
    if isinstance(node, (exp.Limit, exp.Offset)):
        raise NotMaintainable(model, "LIMIT/OFFSET")
    for clause, written in (
        (exp.Distribute, "DISTRIBUTE BY"),
        (exp.Sort, "SORT BY"),
        (exp.Cluster, "CLUSTER BY"),
    ):
        if isinstance(node, clause):
            raise NotMaintainable(
                model,
                written,
                f"remove {written} (it only arranges rows while the query runs; a "
                "maintained table is not rewritten as a whole)",
            )
    if isinstance(node, exp.Order) and node.parent is root:
        raise NotMaintainable(
            model,
            "ORDER BY",
            "remove the ORDER BY (a maintained table has no row order; order when you read it)",
        )


def _refuse_row_generation(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    """DISTINCT ON, LATERAL VIEW, generators, TABLESAMPLE and GROUP BY CUBE/ROLLUP/GROUPING SETS."""
    if isinstance(node, exp.Distinct) and node.args.get("on"):
        raise NotMaintainable(model, "DISTINCT ON")
    if isinstance(node, exp.Lateral):
        raise NotMaintainable(model, "LATERAL VIEW")
    if isinstance(node, GENERATOR_NODES) or (
        isinstance(node, exp.Anonymous) and _function_name(node) in GENERATOR_FUNCTIONS
    ):
        raise NotMaintainable(
            model,
            f"the generator {_written(node)}() in the SELECT list",
            "explode the values into a Delta table of their own and read that table",
        )
    if isinstance(node, exp.TableSample):
        raise NotMaintainable(model, "TABLESAMPLE")
    if isinstance(node, (exp.Cube, exp.Rollup, exp.GroupingSets)):
        raise NotMaintainable(model, f"GROUP BY {type(node).__name__.upper()}")


def _refuse_aggregate_filter(
    model: str, root: exp.Query, node: exp.Expr, allowed: set[int]
) -> None:
    if isinstance(node, exp.Filter):
        raise NotMaintainable(
            model,
            "an aggregate FILTER clause",
            "write the condition inside the aggregate, e.g. SUM(CASE WHEN cond THEN x END)",
        )


def _refuse_non_deterministic(
    model: str, root: exp.Query, node: exp.Expr, allowed: set[int]
) -> None:
    if isinstance(node, NON_DETERMINISTIC_NODES) or (
        isinstance(node, exp.Func) and _function_name(node) in NON_DETERMINISTIC_FUNCTIONS
    ):
        # unix_timestamp() is parsed as a conversion of CURRENT_TIMESTAMP: name the call written.
        shown = node.parent if isinstance(node.parent, exp.StrToUnix) else node
        raise NotMaintainable(
            model,
            f"the non-deterministic function {_written(shown)}()",
            "compute the value in the source table, or " + FALLBACK_HINT,
        )


def _refuse_aggregate(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    """Aggregates other than those maintained (a window's function is its rule's to check)."""
    if isinstance(node, exp.AggFunc) and not _applied_by_window(node, allowed):
        _check_aggregate(model, node)
    if isinstance(node, exp.Anonymous) and _function_name(node) in ANONYMOUS_AGGREGATES:
        raise NotMaintainable(
            model,
            f"the aggregate {_written(node)}",
            f"use {SUPPORTED_AGGREGATES_TEXT}, or " + FALLBACK_HINT,
        )


def _refuse_reserved_name(model: str, root: exp.Query, node: exp.Expr, allowed: set[int]) -> None:
    if isinstance(node, (exp.Alias, exp.Column)) and is_reserved(node.alias_or_name):
        raise NotMaintainable(
            model,
            f"the column name {node.alias_or_name!r} (the prefix __ivm_ is reserved for bookkeeping)",
            "rename the column",
        )


# The refusals _check_node runs on every node of the model's query, in order: the
# first that applies names the construct. `allowed` holds the ids of the subqueries
# and window functions that rules maintain (semi joins, window functions).
NodeCheck = Callable[[str, exp.Query, exp.Expr, set[int]], None]
NODE_CHECKS: tuple[NodeCheck, ...] = (
    _refuse_inner_set_operation,
    _refuse_scalar_subquery,
    _refuse_join,
    _refuse_pivot,
    _refuse_misplaced_window,
    _refuse_qualify,
    _refuse_row_order,
    _refuse_row_generation,
    _refuse_aggregate_filter,
    _refuse_non_deterministic,
    _refuse_aggregate,
    _refuse_reserved_name,
)


def _applied_by_window(node: exp.Expr, allowed: set[int]) -> bool:
    """The function of an allowed window (sqlglot parses RANK() and friends as aggregates).

    view_classes/window.py checks which functions a window may apply.
    """
    parent = node.parent
    while isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return isinstance(parent, exp.Window) and id(parent) in allowed and parent.this is not None


def _check_relation_names(model: str, select: exp.Select) -> None:
    """Two relations of one FROM clause under one name (a self-join needs aliases)."""
    seen: set[str] = set()
    for relation in from_tables(select):
        name = relation.alias_or_name.lower()
        if name in seen:
            raise NotMaintainable(
                model,
                f"two sources under the one name {name!r}",
                "give each occurrence of a table its own alias",
            )
        seen.add(name)


def _check_join(model: str, join: exp.Join) -> None:
    """Inner, cross, outer, semi and anti joins are maintained (changes.py, rules/)."""
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    method = (join.args.get("method") or "").upper()
    if method == "NATURAL":
        raise NotMaintainable(
            model, "NATURAL JOIN", "name the join columns with JOIN ... USING (...) or ON"
        )
    inner = not side and kind in ("", "INNER", "CROSS")
    outer = side in ("LEFT", "RIGHT", "FULL") and kind in ("", "OUTER")
    semi = side in ("", "LEFT") and kind in ("SEMI", "ANTI")
    if inner or outer or semi:
        return
    written = " ".join(part for part in (side, kind) if part)
    raise NotMaintainable(
        model,
        f"{written} JOIN (inner, cross, LEFT, RIGHT, FULL, LEFT SEMI and LEFT ANTI joins "
        "are maintained)",
        "write the condition as an inner JOIN, or " + FALLBACK_HINT,
    )


def _check_aggregate(model: str, node: exp.AggFunc) -> None:
    if not isinstance(node, SUPPORTED_AGGREGATES):
        raise NotMaintainable(
            model,
            f"the aggregate {_written(node)}",
            f"use {SUPPORTED_AGGREGATES_TEXT}, or " + FALLBACK_HINT,
        )
    if isinstance(node.this, exp.Distinct) and not (
        isinstance(node, exp.Count) and len(node.this.expressions) == 1
    ):
        raise NotMaintainable(
            model,
            f"{_written(node)}(DISTINCT ...)",
            "COUNT(DISTINCT x) of one expression is maintained; for others aggregate a "
            "SELECT DISTINCT model, or " + FALLBACK_HINT,
        )
    if isinstance(node, exp.Count) and node.expressions:
        raise NotMaintainable(
            model,
            "COUNT with several arguments",
            "count rows where all are non-NULL with "
            "COUNT(CASE WHEN a IS NOT NULL AND b IS NOT NULL THEN 1 END)",
        )
    if any(
        isinstance(inner, exp.AggFunc)
        for inner in node.this.find_all(exp.AggFunc)
        if inner is not node
    ):
        raise NotMaintainable(model, "a nested aggregate")


def _written(node: exp.Expr) -> str:
    """The function's name as the model spells it, else as Spark SQL renders the node.

    >>> tree = parse_statement("m", "select random() from t")
    >>> _written(tree.find(exp.Rand)), tree.find(exp.Rand).sql(dialect=DIALECT)
    ('RANDOM', 'RAND()')
    """
    written = node.meta.get(WRITTEN_NAME)
    if isinstance(written, str):
        return written.upper()
    return node.sql(dialect=DIALECT).split("(", 1)[0].strip().upper()


def _function_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return type(node).__name__.lower()
