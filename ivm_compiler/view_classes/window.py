"""WINDOW: SELECT exprs, f(...) OVER (PARTITION BY p ...) FROM src WHERE q.

The state is the projection's (one row per distinct output row, with its
multiplicity; rules/counting.py), the window values computed in the
flattened rows, and the rows keyed also by the partition columns when the
outputs lack them. A window function with PARTITION BY p computes each row's
value from the rows of its own partition only, so a change of the source can
alter the model's rows only in the partitions its change rows (before or
after the change) fall into. A refresh therefore

1. probes the change feed for the distinct partition keys it touches (every
   change row, pre- and post-image, that passes the model's WHERE);
2. recomputes the model's rows of those partitions alone: the model's query at
   the pinned version with `p IN (<touched keys>)` added to the WHERE of the
   SELECT that holds the window functions. WHERE filters before windows are
   evaluated, and whole partitions are kept or dropped, so each kept row's
   window values are exactly what the full query gives it;
3. replaces those partitions' state rows with one MERGE (emit.merge_partitions;
   rows as in the projection class). There is no change query: window values
   are not linear in the change rows.

The keys are written into both statements as literals, so Delta skips the
files of other partitions (min/max statistics) in the source and the state.
The partition is the unit of change: within it the window values are
recomputed, not patched, so every window function that only reads its own
partition is maintained by the same rule.

Several window functions may partition differently; any column common to all
their PARTITION BY lists still bounds what a change can reach (a partition of
each function lies inside one partition of the common columns). Without a
common column every row may depend on every other: such a model is
recomputed on every refresh (refresh/recipe.py).

"Window" means SQL window functions only; a source's versions in a refresh
are a reads.VersionRange.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

from sqlglot import exp

from ivm_compiler import key_bounds, names, state_rows
from ivm_compiler.changes import JoinReads
from ivm_compiler.errors import FALLBACK_HINT, NotMaintainable
from ivm_compiler.plan import OutputColumn, PartitionColumn, ViewClass, ViewPlan
from ivm_compiler.reads import VersionRange
from ivm_compiler.rules import aggregates, counting
from ivm_compiler.rules.semi_joins import subquery_predicates
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    conjuncts,
    from_tables,
    joined_literals,
    parsed_type,
)
from ivm_compiler.view_classes.flattening import (
    distinct_expressions,
    flattened_rows,
    refuse_incomparable_keys,
    sources_of,
    typed_projections,
)
from ivm_compiler.view_classes.protocol import QualifiedModel

CLASSES: tuple[ViewClass, ...] = (ViewClass.WINDOW,)

# More touched partitions than this and the refresh recomputes the whole model:
# the keys are collected on the driver and become literals in the MERGE (in
# the rows' WHERE, in ON and in the delete's condition), whose size, planning
# and per-file skipping cost grow with their number, while a change touching
# that many partitions is likely to touch most files of a table anyway. The
# bound keeps the statement a few tens of kilobytes; it is not tuned yet
# (the benchmark has no window model).
MAX_TOUCHED_PARTITIONS = 2_000
# The bound where a source is large (delta.confs.Staging.large): there the
# state is sorted by the partition column with deletion vectors
# (layout.py), so a MERGE of many partitions writes just their rows, while
# recomputing the model rewrites the whole state. The warehouse at scale
# 1500's order dedupe (8,500 touched partitions of 1.8 million): recomputed
# 309 s, its partitions merged 154 s, with deletion vectors 138 s (all three
# on a machine loaded by other work, 2026-12-03).
MAX_TOUCHED_PARTITIONS_LARGE = 20_000

# The functions whose per-partition recomputation is tested; others are refused.
# NTILE, PERCENT_RANK and CUME_DIST read their whole partition (its row count,
# a row's position or peers in it), NTH_VALUE a row of its frame: each still
# reads its own partition only, which is all the rule asks.
RANKING = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.Ntile)
DISTRIBUTION = (exp.PercentRank, exp.CumeDist)
OFFSET = (exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue, exp.NthValue)
AGGREGATES = (exp.Sum, exp.Count, exp.Min, exp.Max, exp.Avg)
SUPPORTED = (*RANKING, *DISTRIBUTION, *OFFSET, *AGGREGATES)
SUPPORTED_TEXT = (
    "ROW_NUMBER, RANK, DENSE_RANK, NTILE, PERCENT_RANK, CUME_DIST, LAG, LEAD, "
    "FIRST_VALUE, LAST_VALUE, NTH_VALUE, or SUM, COUNT, MIN, MAX, AVG OVER a window"
)

# Functions whose value for a row depends on which of several rows tied on the
# ORDER BY comes first (RANK, DENSE_RANK, PERCENT_RANK and CUME_DIST give ties
# one value; NTILE splits tied rows between buckets by position; aggregates
# only with a ROWS frame, whose bounds count rows rather than ORDER BY values).
ORDER_SENSITIVE = (exp.RowNumber, exp.Ntile, *OFFSET)

# Partition values are sent back to Spark as literals cast from their text:
# only atomic types survive that round trip.
UNSUPPORTED_PARTITION_TYPES = ("array", "map", "struct", "binary", "variant", "interval")

# The probe's one column: a partition key as a JSON array of its values as text.
PROBE_COLUMN = f"{names.RESERVED_PREFIX}partition"


def windows_of(select: exp.Select) -> list[exp.Window]:
    """The window functions of a SELECT list and of its QUALIFY (window_filters.py).

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select a, rank() over (partition by a order by b) from t")
    >>> [w.this.sql() for w in windows_of(q)]
    ['RANK()']
    """
    qualify = select.args.get("qualify")
    parts = [*select.expressions, *([qualify] if qualify is not None else [])]
    return [w for p in parts for w in p.find_all(exp.Window)]


def function_of(window: exp.Window) -> exp.Expr:
    """The function a window applies, with IGNORE/RESPECT NULLS taken off."""
    function = window.this
    while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls)):
        function = function.this
    return function


def check_shape(model: str, select: exp.Query, merged: bool = True) -> None:
    """One SELECT over one table with an optional WHERE: what partition recomputation covers.

    A refresh never asks about windows over joins, groups, EXISTS/IN or under
    DISTINCT: window_inputs.py has made their input a plan node first (these
    refusals remain for a caller that compiles a query without splitting it).
    parse.py asks before CTEs and FROM-subqueries are merged (merged=False),
    so that a refresh refuses before it builds any plan node; a derived table
    in FROM is then still allowed, and plan() asks again after merging.
    """
    # Long but flat: one refusal and its message per shape the partition
    # recomputation does not cover.
    # A parenthesised query has no FROM of its own: refused as a join is.
    relations = from_tables(select) if isinstance(select, exp.Select) else []
    if (
        not isinstance(select, exp.Select)
        or len(relations) != 1
        or select.args.get("joins")
        or (merged and not isinstance(relations[0], exp.Table))
    ):
        raise NotMaintainable(
            model,
            "window functions over a join",
            "build the join as an ivm model of its own and compute the window functions in a "
            "model over it with ref(), or " + FALLBACK_HINT,
        )
    if subquery_predicates(select):
        raise NotMaintainable(
            model,
            "window functions over rows filtered by an EXISTS or IN subquery",
            "build the filtered rows as an ivm model of its own and compute the window "
            "functions in a model over it with ref(), or " + FALLBACK_HINT,
        )
    if select.args.get("group") or select.args.get("having"):
        raise NotMaintainable(
            model,
            "window functions together with GROUP BY or HAVING",
            "build the aggregate as an ivm model of its own and compute the window functions "
            "in a model over it with ref(), or " + FALLBACK_HINT,
        )
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on"):
        raise NotMaintainable(model, "DISTINCT ON")
    if distinct is not None:
        # window_inputs.py makes the windows a plan node under the DISTINCT, but
        # not when a top-k orders the distinct rows.
        raise NotMaintainable(
            model,
            "SELECT DISTINCT together with window functions and ORDER BY ... LIMIT",
            "select the distinct rows in an ivm model of its own and rank them in a model "
            "over it with ref(), or " + FALLBACK_HINT,
        )
    for projection in select.expressions:
        for call in projection.find_all(exp.AggFunc):
            if call.find_ancestor(exp.Window) is None:
                raise NotMaintainable(
                    model,
                    f"the aggregate {call.sql(dialect=DIALECT)} beside window functions",
                    "aggregate in an ivm model of its own and compute the window functions in "
                    "a model over it with ref(), or " + FALLBACK_HINT,
                )
    for window in windows_of(select):
        function = function_of(window)
        if not isinstance(function, SUPPORTED):
            written = function.sql(dialect=DIALECT).split("(", 1)[0].upper()
            raise NotMaintainable(
                model,
                f"the window function {written}",
                f"use {SUPPORTED_TEXT}, or " + FALLBACK_HINT,
            )


def takes(query: exp.Query) -> bool:
    """A SELECT with a window function in its SELECT list.

    >>> import sqlglot
    >>> takes(sqlglot.parse_one("select a, lag(b) over (partition by a order by c) from t"))
    True
    """
    return isinstance(query, exp.Select) and bool(windows_of(query))


def plan(model: QualifiedModel) -> ViewPlan:
    """The projection's state, keyed also by the partition columns common to all windows."""
    qualified = model.qualified
    assert isinstance(qualified, exp.Select)
    check_shape(model.model, qualified)
    projections = typed_projections(model.model, qualified, model.described)
    refuse_incomparable_keys(model.model, model.described, "column")
    source_columns = model.schemas[TableName.of(from_tables(qualified)[0])]
    partition = partition_columns(
        qualified, {name.lower(): data_type for name, data_type in source_columns}
    )
    keys = distinct_expressions(projections + [column for column, _ in partition])
    key_columns = [counting.key_column(i) for i in range(len(keys))]
    key_names = {key.sql(dialect=DIALECT): col.name for key, col in zip(keys, key_columns)}
    rows = flattened_rows(qualified, keys, {})
    qualify = qualified.args.get("qualify")
    if qualify is not None:
        # Evaluated after the windows: a recomputed partition keeps what the query keeps.
        rows.set("qualify", unqualified_outside_windows(qualify))
    return ViewPlan(
        model=model.model,
        view_class=ViewClass.WINDOW,
        sql=model.sql,
        query=model.query,
        sources=sources_of(rows),
        rows=rows,
        keys=tuple(c.name for c in key_columns),
        state_columns=(*key_columns, counting.count_column()),
        preaggregations=(),
        upstreams=model.upstreams_read,
        outputs=tuple(
            OutputColumn(
                name=name,
                data_type=data_type,
                expression=aggregates.state_column(key_names[p.sql(dialect=DIALECT)]),
            )
            for (name, data_type), p in zip(model.described, projections)
        ),
        having=None,
        fingerprint=model.fingerprint(ViewClass.WINDOW),
        window_partition=partition_state_columns(partition, key_names),
        tie_warnings=tuple(
            tie_warnings(model.model, qualified, [name for name, _ in source_columns])
        ),
    )


def unqualified_outside_windows(qualify: exp.Qualify) -> exp.Qualify:
    """QUALIFY with its columns outside window functions named without their table.

    Spark is sent QUALIFY as a filter over the windowed SELECT made a derived
    table (sqlglot's eliminate_qualify), which projects each such column under
    its name but leaves the filter's reference as written: `src`.`id` would
    name a table the outer query no longer reads. By name alone it is the
    derived table's column (the SELECT reads one relation).

    >>> import sqlglot
    >>> q = sqlglot.parse_one("select a from t qualify rank() over (order by t.b) = 1 and t.c > 0",
    ...     read="duckdb")
    >>> unqualified_outside_windows(q.args["qualify"]).sql(dialect="duckdb")
    'QUALIFY RANK() OVER (ORDER BY t.b) = 1 AND c > 0'
    """

    def plain(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.find_ancestor(exp.Window) is None:
            return exp.column(node.args["this"].copy())
        return node

    plained = qualify.transform(plain)
    assert isinstance(plained, exp.Qualify)  # only columns below it are replaced
    return plained


def partition_columns(
    select: exp.Select, column_types: dict[str, str]
) -> list[tuple[exp.Column, str]]:
    """The plain source columns every window function partitions by, with their types.

    In the first window's order; expressions and columns of types that cannot
    be written as literals do not count. Empty: no common partition.
    """
    common: list[tuple[exp.Column, str]] | None = None
    for window in windows_of(select):
        plain = [
            (column, column_types[column.name.lower()])
            for column in window.args.get("partition_by") or []
            if isinstance(column, exp.Column)
            and column.name.lower() in column_types
            and _literal_type(column_types[column.name.lower()])
        ]
        if common is None:
            common = plain
        else:
            written = {c.sql(dialect=DIALECT) for c, _ in plain}
            common = [(c, t) for c, t in common if c.sql(dialect=DIALECT) in written]
    seen: dict[str, tuple[exp.Column, str]] = {}
    for column, data_type in common or []:
        seen.setdefault(column.sql(dialect=DIALECT), (column, data_type))
    return list(seen.values())


def _literal_type(data_type: str) -> bool:
    lowered = data_type.lower()
    return not any(lowered.startswith(t) for t in UNSUPPORTED_PARTITION_TYPES)


def tie_warnings(model: str, select: exp.Select, source_columns: Sequence[str]) -> list[str]:
    """A warning per order-sensitive window whose ORDER BY may leave ties.

    The rule is deliberately simple: the ORDER BY must name every source column
    that is not one of the window's partition columns. Rows then never tie
    unless they are equal, and equal rows are interchangeable. Otherwise a
    refresh that recomputes a partition may order tied rows differently from a
    recomputation of the whole model (both are correct answers of the query).
    """
    warnings = []
    for window in windows_of(select):
        function = function_of(window)
        spec = window.args.get("spec")
        rows_frame = spec is not None and str(spec.args.get("kind") or "").upper() == "ROWS"
        if not (isinstance(function, ORDER_SENSITIVE) or (rows_frame and window.args.get("order"))):
            continue
        partitioned = {
            c.name.lower()
            for c in window.args.get("partition_by") or []
            if isinstance(c, exp.Column)
        }
        order = window.args.get("order")
        ordered = {c.name.lower() for c in order.find_all(exp.Column)} if order else set()
        missing = [c for c in source_columns if c.lower() not in partitioned | ordered]
        if missing:
            warnings.append(
                f"Model '{model}': {window.sql(dialect=DIALECT)} does not order by "
                f"{', '.join(missing)}: among rows tied on its ORDER BY, a refresh that "
                "recomputes their partition may pick a different row than a full "
                "recomputation would. Add columns that make the order unique (e.g. a "
                "unique id) to the ORDER BY, or set ivm_window_order_unique=true if "
                "the order is unique already."
            )
    return warnings


def partition_state_columns(
    partition: list[tuple[exp.Column, str]], key_names: dict[str, str]
) -> tuple[PartitionColumn, ...]:
    return tuple(
        PartitionColumn(
            source=column.copy(),
            state_column=key_names[column.sql(dialect=DIALECT)],
            data_type=data_type,
        )
        for column, data_type in partition
    )


# -- the state's queries and its view ----------------------------------------------


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """The projection's state of the rows; `rows_filter` keeps the touched partitions' rows.

    Rows that one_row_per_key shows distinct are each a state row counted
    once: grouping them by every column shuffled them all a second time for
    counts of 1 (the warehouse's order dedupe, at its build and at each
    refresh's recomputed partitions).
    """
    if isinstance(plan.rows, exp.Select) and one_row_per_key(plan.rows):
        return state_rows.ungrouped_build_query(plan, versions, rows_filter)
    return state_rows.build_query(plan, versions, rows_filter)


def one_row_per_key(rows: exp.Select) -> bool:
    """Whether the rows' QUALIFY keeps at most one row of each partition whose columns they project.

    The dedupe idiom, folded (window_filters.py): `ROW_NUMBER() OVER
    (PARTITION BY p ...) = 1` (or `<= 1`) keeps one row per value of p, and
    with every column of p projected no two kept rows are equal.

    >>> import sqlglot
    >>> rows = sqlglot.parse_one(
    ...     "SELECT t.id AS g0, t.v AS g1 FROM t QUALIFY ROW_NUMBER() OVER "
    ...     "(PARTITION BY t.id ORDER BY t.ts DESC) = 1 AND g1 > 0", read="duckdb")
    >>> one_row_per_key(rows)
    True
    >>> rows = sqlglot.parse_one(
    ...     "SELECT t.v AS g0 FROM t QUALIFY ROW_NUMBER() OVER "
    ...     "(PARTITION BY t.id ORDER BY t.ts DESC) = 1", read="duckdb")
    >>> one_row_per_key(rows)  # two ids may keep equal values
    False
    >>> rows = sqlglot.parse_one(
    ...     "SELECT t.id AS g0 FROM t QUALIFY RANK() OVER (PARTITION BY t.id ORDER BY t.ts) = 1",
    ...     read="duckdb")
    >>> one_row_per_key(rows)  # RANK keeps every row tied first
    False
    """
    qualify = rows.args.get("qualify")
    if qualify is None:
        return False
    projected = {p.unalias().sql(dialect=DIALECT) for p in rows.expressions}
    for condition in conjuncts(qualify.this):
        window = _first_row_window(condition)
        if window is not None and all(
            c.sql(dialect=DIALECT) in projected for c in window.args.get("partition_by") or []
        ):
            return True
    return False


def _first_row_window(condition: exp.Expr) -> exp.Window | None:
    """The ROW_NUMBER window a condition keeps the first row of (`= 1`, `1 =`, `<= 1`), if any."""
    one = exp.Literal.number(1)
    if isinstance(condition, exp.EQ):
        sides = [(condition.this, condition.expression), (condition.expression, condition.this)]
    elif isinstance(condition, exp.LTE):
        sides = [(condition.this, condition.expression)]
    else:
        return None
    for window, bound in sides:
        if (
            isinstance(window, exp.Window)
            and isinstance(window.this, exp.RowNumber)
            and bound == one
        ):
            return window
    return None


def change_query(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Refused: window values are not linear in the change rows (see emit.merge_partitions)."""
    raise ValueError("a WINDOW model's change is applied by merge_partitions")


def leaves_state(plan: ViewPlan, emptied: exp.Expr) -> exp.Expr | None:
    """A row leaves the state when its count reaches zero (merge_partitions deletes them)."""
    return emptied


def view(plan: ViewPlan, rows: exp.Select) -> exp.Select:
    """The projection's view: each row with a positive count, repeated count times."""
    return counting.repeated(rows.where(counting.populated()), counting.count())


# -- the refresh's statements ---------------------------------------------------


def probe_query(
    rows: exp.Select,
    changes: exp.Expr,
    partition: Sequence[PartitionColumn],
    limit: int = MAX_TOUCHED_PARTITIONS,
) -> exp.Select:
    """The distinct partition keys of the change rows that pass the model's WHERE.

    `rows` is the plan's flattened SELECT (its WHERE is the model's), `changes`
    the source's signed change rows under the model's alias. At most one key
    more than `limit` is asked for: that one says "too many".
    Each key comes back as a JSON array of its values cast to STRING, so every
    type reaches the driver as text (dbt's result tables guess types from
    values) and goes back as an exact literal.
    """
    values = exp.Array(
        expressions=[exp.cast(p.source.copy(), exp.DataType.build("string")) for p in partition]
    )
    select = exp.select(
        exp.alias_(exp.Anonymous(this="to_json", expressions=[values]), PROBE_COLUMN, quoted=True)
    ).distinct()
    select.set("from_", exp.From(this=changes))
    where = rows.args.get("where")
    if where is not None:
        select.set("where", where.copy())
    return select.limit(limit + 1)


PartitionKey = tuple[str | None, ...]


def parse_probe(rows: Sequence[Sequence[object]]) -> list[PartitionKey]:
    """The probe's rows as keys: one text value (or None for NULL) per partition column.

    >>> parse_probe([['[null,"b"]'], ['["1","a"]']])
    [(None, 'b'), ('1', 'a')]
    """
    return [tuple(json.loads(str(row[0]))) for row in rows]


def literal(value: str, data_type: str) -> exp.Expr:
    """A partition value (as text) as a literal of its column's type.

    >>> literal("1.50", "decimal(10,2)").sql(dialect="spark")
    '1.50'
    >>> literal("2024-01-02", "date").sql(dialect="spark")
    "CAST('2024-01-02' AS DATE)"
    """
    kind = _literal_kind(data_type)
    if kind == "string":
        return exp.Literal.string(value)
    if kind == "number":
        return exp.Literal.number(value)
    return exp.cast(exp.Literal.string(value), parsed_type(data_type), copy=False)


@functools.lru_cache(maxsize=256)
def _literal_kind(data_type: str) -> str:
    """How `literal` writes a value of `data_type`: once per type, not per value (a
    recomputed window lists thousands of partitions, and each type test builds types)."""
    built = parsed_type(data_type)
    if built.is_type(*exp.DataType.TEXT_TYPES):
        return "string"
    if built.is_type(*exp.DataType.INTEGER_TYPES, exp.DataType.Type.DECIMAL):
        return "number"
    return "cast"


def partition_predicate(
    columns: Sequence[exp.Expr],
    types: Sequence[str],
    keys: Sequence[PartitionKey],
) -> exp.Expr:
    """The rows whose partition columns hold one of `keys`; NULL matches NULL (Spark's NULL partition).

    >>> c = [exp.column("k")]
    >>> partition_predicate(c, ["int"], [("1",), (None,), ("3",)]).sql(dialect="spark")
    'k IN (1, 3) OR k IS NULL'
    >>> two = [exp.column("k"), exp.column("g")]
    >>> partition_predicate(two, ["int", "string"], [("1", None)]).sql(dialect="spark")
    'k = 1 AND g IS NULL'
    """
    if not keys:
        return exp.false()
    if len(columns) == 1:
        column, data_type = columns[0], types[0]
        values = sorted({key[0] for key in keys if key[0] is not None})
        parts: list[exp.Expr] = []
        if values:
            parts.append(
                exp.In(
                    this=column.copy(),
                    expressions=joined_literals([literal(v, data_type) for v in values]),
                )
            )
        if any(key[0] is None for key in keys):
            parts.append(exp.Is(this=column.copy(), expression=exp.Null()))
        return exp.or_(*parts, copy=False)
    # Built here for this predicate alone: combined without copies.
    return exp.or_(
        *[
            exp.and_(
                *[
                    exp.Is(this=column.copy(), expression=exp.Null())
                    if value is None
                    else exp.EQ(this=column.copy(), expression=literal(value, data_type))
                    for column, data_type, value in zip(columns, types, key)
                ],
                copy=False,
            )
            for key in sorted(keys, key=lambda k: [(v is None, v or "") for v in k])
        ],
        copy=False,
    )
