"""A state kept as a log (ivm_state_form 'log', or 'auto' where allowed): changes appended.

A merged state takes each refresh's change with a guarded
MERGE, which on Delta costs about 13 Spark jobs however small the change:
it materializes its source, rebuilds the new version's file list, finds the
files holding touched rows and rewrites them (bench/micro/merge_jobs.py).
Where every state column adds up (counts and exact sums: projections,
DISTINCT, COUNT, SUM and AVG over integers and decimals), the change rows
can instead be appended as they are: the state is then a log of signed
partial rows (a Z-set, as DBSP and differential dataflow keep), and a
group's value is the sum of its rows. One append is 4 Spark jobs
(bench/results/issue20/append-state-2026-11-29.md).

Readers consolidate: the view sums each column per key (`consolidated`),
and drops keys whose count is back to zero where the merged form would have
deleted the row; a projection's view sums only the keys some row removes
rows of (`view_rows`), and its readers parse it back to the sums
(`summed_view`). A refresh rewrites the log as its consolidated rows
(`compact`) once the rows appended since the last rewrite outnumber the
rows that rewrite left, so a read never scans more than about twice the
consolidated state.

The guard against a concurrent refresh is Delta's transaction id instead of
the guard row: every write to a log state runs with
`spark.databricks.delta.write.txnAppId` = TXN_APP_ID and `txnVersion` = the
newest state version the refresh read, and Delta skips a write whose
transaction version is not above the newest it recorded for the id (measured
on this runtime for INSERT, INSERT OVERWRITE, CREATE OR REPLACE TABLE ... AS
and MERGE). Two refreshes that read the same version: one commits, the
other's write is skipped, which the refresh sees (the session's last commit
version is left unset) and reports as a concurrent refresh.

What a log cannot keep: MIN/MAX and COUNT(DISTINCT) (their pre-aggregations
need the stored value), floating-point sums and moments (their compensation
reads the stored sum), windows, top-k, set operations other than UNION ALL,
plan nodes, and a state that other ivm models read through its change feed,
unless the model is a projection: elsewhere its changes are partial rows
(a count or sum to add to a group's), not the model's rows. A projection's
log row with count c is c rows of the model added (removed where c < 0),
which is how its readers read the state's change feed
(reads.signed_changes); its compaction is an overwrite, which they sum
(reads.net_rows).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from sqlglot import exp

from ivm_compiler import changes, key_bounds, names, reads, state_rows
from ivm_compiler.compile import view_class_rule
from ivm_compiler.plan import MergeRule, ViewClass, ViewPlan
from ivm_compiler.sql import DIALECT, TableName, ident

# The table property that marks a state as a log (its readers must consolidate).
STATE_FORM_PROPERTY = "spark_ivm.state_form"
LOG = "log"
# Delta's idempotent-write confs (see the module docstring).
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
TXN_APP_ID = "spark_ivm_refresh"

# The view classes whose state rows add up, and the merge rules that add.
LOG_CLASSES = frozenset(
    {
        ViewClass.PROJECTION,
        ViewClass.DISTINCT,
        ViewClass.GROUPED_AGGREGATE,
        ViewClass.GLOBAL_AGGREGATE,
    }
)
ADDITIVE_RULES = frozenset({MergeRule.KEY, MergeRule.ADD, MergeRule.ADD_NULLABLE})


@dataclasses.dataclass(frozen=True)
class Circumstances:
    """What, beside its plan, a model's state form depends on (the refresh knows it)."""

    # Its CTEs or subqueries are kept as plan nodes (nodes.py).
    plan_nodes: bool = False
    # Other ivm models read its state's change feed.
    read_by_ivm_models: bool = False
    # It keeps join states (ivm_join_state).
    join_states: bool = False
    # No other client shares the connection's Spark session, so a skipped
    # write can be told from a committed one (the session's last commit version).
    own_session: bool = True


def refusal(plan: ViewPlan, circumstances: Circumstances = Circumstances()) -> str | None:
    """Why the plan's state cannot be a log; None when it can."""
    if circumstances.plan_nodes:
        return "its CTEs or subqueries are kept as plan nodes, whose changes it reads"
    if circumstances.read_by_ivm_models and plan.view_class is not ViewClass.PROJECTION:
        return (
            "other ivm models read its changes, which a log keeps as partial rows "
            "(only a projection's log rows are rows of the model)"
        )
    if circumstances.join_states:
        return "it keeps join states (ivm_join_state)"
    if not circumstances.own_session:
        return (
            "its connection shares a Spark session with other clients (a Thrift "
            "server with singleSession), where the write's guard cannot be read back"
        )
    if plan.view_class not in LOG_CLASSES:
        return f"a {plan.view_class.value.replace('_', ' ')} model's state is merged"
    if plan.top_k is not None:
        return "a model with ORDER BY ... LIMIT keeps its rows merged"
    kept = [c for c in plan.state_columns if c.rule not in ADDITIVE_RULES]
    if plan.preaggregations or kept:
        what = {
            MergeRule.RECOMPUTED: "MIN/MAX and COUNT(DISTINCT)",
            MergeRule.COMPENSATED_SUM: "floating-point SUM/AVG",
            MergeRule.MOMENT: "STDDEV/VARIANCE",
            MergeRule.CO_MOMENT: "COVAR/CORR",
        }
        named = sorted({what.get(c.rule, "this aggregate") for c in kept}) or [
            "MIN/MAX and COUNT(DISTINCT)"
        ]
        return f"{' and '.join(named)} need the stored value when a change is merged"
    return None


def with_log(plan: ViewPlan) -> ViewPlan:
    """The plan with a log state: its fingerprint changes, so a merged state is rebuilt."""
    fingerprint = hashlib.sha256(f"{plan.fingerprint} {LOG}".encode()).hexdigest()[:16]
    return dataclasses.replace(plan, log_state=True, fingerprint=fingerprint)


def _value(column: str) -> exp.Expr:
    return exp.column(column, quoted=True)


def consolidated(plan: ViewPlan, table: exp.Expr) -> exp.Select:
    """The log's rows summed per key: the rows a merged state would hold.

    The guard row is left out, and a NULL guard column added back, so the
    view reads these rows as it reads a merged state's. Keys whose count is
    back to zero go where the merged form deletes the row (grouped
    aggregates, projections); a global aggregate keeps its one row.
    """
    keys = [c.name for c in plan.state_columns if c.rule is MergeRule.KEY]
    values = [c.name for c in plan.state_columns if c.rule is not MergeRule.KEY]
    guard = exp.column(names.GUARD, quoted=True)
    select = (
        exp.select(
            *(_value(k) for k in keys),
            *(exp.alias_(exp.Sum(this=_value(v)), v, quoted=True) for v in values),
            exp.alias_(_null_string(), names.GUARD, quoted=True),
        )
        .from_(table)
        .where(exp.Is(this=guard, expression=exp.null()))
    )
    if keys:
        select = select.group_by(*(_value(k) for k in keys))
    if plan.view_class is not ViewClass.GLOBAL_AGGREGATE:
        count = exp.Sum(this=_value(names.COUNT))
        select = select.having(exp.NEQ(this=count, expression=exp.Literal.number(0)))
    return select


def view_rows(plan: ViewPlan, table: exp.Expr) -> exp.Query:
    """The log's rows as the model's view reads them: summed per key, or split by a projection's removals.

    Summing the whole log (`consolidated`) shuffles every row: the
    warehouse's NTILE fallback read slv_order_items' log of 17.5 M rows,
    6,437 of them with a negative count, through its view in 24.6 executor
    CPU s where a table of the same rows took 2.9 (2026-12-06). A
    projection's view repeats each row by its count, so the rows of a key
    need summing only where one of them removes rows: the other keys' rows
    are read as they are. The log is split by its key's hash, taken into
    HASH_BUCKETS buckets: the rows of a bucket some negated row falls in
    are summed, the rest passed through, and the negated rows' buckets are
    broadcast to both halves. Rows of one key share their bucket, so a
    bucket several keys share only sums a few more rows. Other view
    classes sum every key's rows (a DISTINCT row shows once however many
    rows hold it; a group's partial rows add up).
    """
    summed = consolidated(plan, table)
    keys = [c.name for c in plan.state_columns if c.rule is MergeRule.KEY]
    if plan.view_class is not ViewClass.PROJECTION or not keys:
        return summed
    guard = exp.column(names.GUARD, quoted=True)
    negated = (
        exp.select(exp.alias_(_key_bucket(keys), names.ROW_BUCKET, quoted=True))
        .distinct()
        .from_(table.copy())
        .where(exp.Is(this=guard.copy(), expression=exp.null()))
        .where(exp.LT(this=_value(names.COUNT), expression=exp.Literal.number(0)))
    )

    def split(select: exp.Select, kind: str) -> exp.Select:
        hashed = exp.EQ(
            this=_key_bucket(keys),
            expression=exp.column(names.ROW_BUCKET, table=ident(names.NEGATED_ALIAS), quoted=True),
        )
        joined = select.join(
            negated.subquery(ident(names.NEGATED_ALIAS)), on=hashed, join_type=kind
        )
        hint = exp.JoinHint(this="BROADCAST", expressions=[exp.to_table(names.NEGATED_ALIAS)])
        joined.set("hint", exp.Hint(expressions=[hint]))
        return joined

    as_they_are = (
        exp.select(
            *(_value(k) for k in keys),
            _value(names.COUNT),
            exp.alias_(_null_string(), names.GUARD, quoted=True),
        )
        .from_(table.copy())
        .where(exp.Is(this=guard, expression=exp.null()))
    )
    return exp.union(split(as_they_are, "LEFT ANTI"), split(summed, "LEFT SEMI"), distinct=False)


def summed_view(view: exp.Select, state: TableName) -> exp.Select:
    """`view` (a model's view text) with a split log (`view_rows`) put back as its sums.

    What readers of the model rewrite (reads.py: the columns they read,
    its change feed in its place) is the sum per key; the split's summing
    half without its join to the negated rows is that sum. In place.

    >>> from sqlglot import parse_one
    >>> text = (
    ...     "SELECT k FROM (SELECT /*+ BROADCAST(__ivm_negated) */ k, c FROM m.s "
    ...     "LEFT ANTI JOIN (SELECT h FROM m.s) AS __ivm_negated ON h = __ivm_negated.h "
    ...     "WHERE g IS NULL UNION ALL SELECT /*+ BROADCAST(__ivm_negated) */ k, SUM(c) AS c "
    ...     "FROM m.s LEFT SEMI JOIN (SELECT h FROM m.s) AS __ivm_negated ON h = __ivm_negated.h "
    ...     "WHERE g IS NULL GROUP BY k HAVING SUM(c) <> 0) AS s WHERE c > 0"
    ... )
    >>> summed_view(parse_one(text, read="spark"), TableName("m", "s")).sql(dialect="spark")
    'SELECT k FROM (SELECT k, SUM(c) AS c FROM m.s WHERE g IS NULL GROUP BY k HAVING SUM(c) <> 0) AS s WHERE c > 0'
    """
    for subquery in list(view.find_all(exp.Subquery)):
        split = subquery.this
        if subquery.alias != state.name or not isinstance(split, exp.Union):
            continue
        summing = split.expression
        if not isinstance(summing, exp.Select):
            continue
        joins = summing.args.get("joins") or []
        if not any(j.alias_or_name == names.NEGATED_ALIAS for j in joins):
            continue
        summed = summing.copy()
        summed.set("joins", None)
        summed.set("hint", None)
        subquery.set("this", summed)
    return view


# The buckets a projection log's view takes its key hashes into (view_rows):
# the broadcast of the negated rows' buckets holds fewer than twice as many
# values (XXHASH64 is signed, and so its remainder) however many rows a log
# negates between its rewrites. The rows summed are those of the negated
# buckets: 6,437 negated rows flag 0.6 % of 2^20 buckets; a log negating
# millions of rows sums most of its rows, as the view did before.
HASH_BUCKETS = 1 << 20


def _key_bucket(keys: list[str]) -> exp.Expr:
    # Spark's XXHASH64 hashes -0.0 as 0.0 and every NaN alike, as GROUP BY
    # groups them, so a key's rows never straddle the split.
    hashed = exp.Anonymous(this="XXHASH64", expressions=[_value(k) for k in keys])
    return exp.Mod(this=hashed, expression=exp.Literal.number(HASH_BUCKETS))


def _null_string() -> exp.Expr:
    return exp.cast(exp.null(), exp.DataType.build("STRING"))


def _state_row(plan: ViewPlan, guard: exp.Expr | None = None) -> list[exp.Expr]:
    """A state table's columns, in order, the guard column last (`guard`, or the column itself)."""
    columns = [_value(c) for c in state_rows.state_table_columns(plan)]
    if guard is None:
        return [*columns, _value(names.GUARD)]
    return [*columns, exp.alias_(guard, names.GUARD, quoted=True)]


def _marker_row(plan: ViewPlan, marker: str) -> exp.Select:
    """A row of NULLs whose guard column holds `marker`: readers skip it as the guard row."""
    return exp.select(
        *(exp.alias_(exp.null(), c, quoted=True) for c in state_rows.state_table_columns(plan)),
        exp.alias_(exp.Literal.string(marker), names.GUARD, quoted=True),
    )


def _change_rows(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    bounds: key_bounds.Bounds | None,
    join_reads: changes.JoinReads | None,
) -> exp.Select:
    """The view class's change query, its rows in state-table order with a NULL guard."""
    source = view_class_rule(plan.view_class).change_query(plan, ranges, state, bounds, join_reads)
    return exp.select(*_state_row(plan, _null_string())).from_(
        source.subquery(ident(names.CHANGE_ALIAS))
    )


def append_changes(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    marker: str,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
) -> str:
    """INSERT INTO the state the change's rows and a marker row (`marker`: the refresh id).

    The marker row makes every append a commit: Delta commits nothing for an
    INSERT of no rows, which would read as a write skipped for its
    transaction id (another refresh's).
    """
    rows = exp.union(
        _change_rows(plan, state, ranges, bounds, join_reads),
        _marker_row(plan, marker),
        distinct=False,
    )
    columns = [*state_rows.state_table_columns(plan), names.GUARD]
    insert = exp.Insert(
        this=exp.Schema(this=state.to_table(), expressions=[ident(c) for c in columns]),
        expression=rows,
    )
    return insert.sql(dialect=DIALECT)


def compact(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    guard: str,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
) -> str:
    """INSERT OVERWRITE the state with its rows and the change's consolidated, and one guard row.

    The marker rows of the appends go; the guard row holds `guard` (the
    guard the refresh read, which its commit records).
    """
    logged = exp.union(
        exp.select(*_state_row(plan)).from_(state.to_table()),
        _change_rows(plan, state, ranges, bounds, join_reads),
        distinct=False,
    )
    merged = consolidated(plan, logged.subquery(ident(names.CHANGE_ALIAS)))
    rows = exp.union(
        exp.select(*_state_row(plan)).from_(merged.subquery(ident(names.BUILT_ALIAS))),
        _marker_row(plan, guard),
        distinct=False,
    )
    insert = exp.Insert(this=state.to_table(), expression=rows, overwrite=True)
    return insert.sql(dialect=DIALECT)


def txn_settings(read_version: int | None) -> dict[str, str]:
    """The session confs a write to a log state runs under; none for a table not yet there."""
    if read_version is None:
        return {}
    return {TXN_APP_ID_CONF: TXN_APP_ID, TXN_VERSION_CONF: str(read_version)}
