"""How a large state's rows lie in its files: sorted by the key its MERGEs look up.

Delta skips a file only by the min/max statistics of its columns, for a
predicate whose values are known when the statement is planned. A state
written in the order its build query's shuffle leaves it spreads every key
over every file, so a MERGE of a few thousand change rows into a state of
millions reads and rewrites every file (the warehouse at scale 6000:
`slv_orders`' window node rewrote 12 million rows for 8,399 changes).

A large state is therefore written

- over sources of delta.confs.SORTED_STATE_BYTES or more, sorted by its
  sort key (`sort_key`: a window's partition column, else the first
  column its MERGE matches on: an aggregate's first group key, a
  projection's first column), in files of at most `ROWS_PER_FILE` rows, so
  each file holds one range of keys. A refresh's MERGE carries the change's
  key ranges in its ON (`target_bounds`), a condition on the state alone,
  which Delta's MERGE uses to prune the files it searches for matches: a
  change whose keys lie in a few ranges (new keys above the top, the
  recent rows a day's batch touches) reads and rewrites only those files;
- with deletion vectors where the built state holds at least
  `DELETION_VECTOR_STATE_BYTES` (`deletion_vectors_pay`; turned on right
  after the build, whose size is known only then, over sources past
  delta.confs.SMALL_SOURCE_BYTES): a MERGE that changes a few rows of a
  file marks them deleted instead of copying the file's other rows. On the
  warehouse at scale 1500, vectors on every state over such sources took
  the day's batch's MERGEs from 124.5 to 77.5 task CPU s
  (`mart_customer_ltv`'s, 3.68 M state rows, 21.3 -> 4.9); at 4 MiB,
  81.1. On a state of a few files they cost more than they spare: TPC-H
  SF 5's `lineitem_supplier_extremes` (2.2 M rows in 3.5 MB) refreshed in 26.9 s with them where 19.1 s without, and a
  small state's MERGE took twice as long. Delta 3.3 and 4.0.1 refuse to
  scan a table that may have vectors without data skipping ("Cannot work
  with a non-pinned table snapshot of the TahoeFileIndex", which failed
  `mart_products_never_delivered` at scale 6000, 2026-12-03): the
  small-source confs keep data skipping on where a source or the state may
  have them (delta.confs.skips_without_statistics).

Rows a MERGE inserts or rewrites land in new files whatever their keys, so
the sort decays with every refresh; nothing sorts a state again yet but a
rebuild (`--full-refresh`): a re-sort by `ivm_housekeeping` past a share of
unsorted files is open (CONTRIBUTING.md, known gaps).

Smaller states (sources under delta.confs.SORTED_STATE_BYTES, a GB) are
not sorted: sorted, they are a file or two per shuffle partition,
so the sort costs their build (and every recompute) a sampling pass and a
range shuffle for files there is little to skip in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.plan import ViewClass, ViewPlan
from ivm_compiler.sql import TableName

# Spark's writers cut a task's output into files of at most this many rows.
ROWS_PER_FILE_CONF = "spark.sql.files.maxRecordsPerFile"
ROWS_PER_FILE = 1_000_000

DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
# A built state of at least this many bytes gets deletion vectors. Measured
# on both sides of it: TPC-H SF 5's 3.5 MB MIN/MAX state refreshed slower
# with them (26.9 s against 19.1 s); the warehouse's 8.1 MB
# `mart_category_sales` state merged faster (under 4 task CPU s against 8.5
# to 9.4), and with vectors on its states of 16 MB and more alone the
# batch's MERGEs took 92.1 task CPU s where 77.5 with them on every state
# over a source past 16 MB (2026-12-05; the module docstring).
DELETION_VECTOR_STATE_BYTES = 4 * 1024 * 1024
# Recorded on a sorted state: the column its files are sorted by, which the
# refresh bounds its MERGEs by and housekeeping sorts again.
SORT_KEY_PROPERTY = "spark_ivm.sort_key"
# The most distinct change keys a MERGE's probe lists per key column: more
# than a partner read's key_bounds.MAX_LISTED_KEYS, as a MERGE's list is one
# statement's, where a partner's list is repeated in each of its reads. A
# day's batch at scale 6000 names more than 10,000 customers, which left
# `mart_category_sales`' 7 M-row state unbounded; on a synthetic state of
# that size a list of 29,649 keys took the MERGE 9.1 s where 26.2 s
# unbounded (bench/results/issue54/merge-key-list-7m-30k-keys.txt).
MAX_LISTED_MERGE_KEYS = 50_000


@dataclass(frozen=True)
class Layout:
    """How a state is written: sorted by a column or not. (Deletion vectors are
    turned on after the build, by its size: deletion_vectors_pay.)"""

    sort_key: str | None = None

    @property
    def properties(self) -> dict[str, str]:
        """The state table's properties that keep this layout.

        >>> Layout("__ivm_g0").properties
        {'spark_ivm.sort_key': '__ivm_g0'}
        >>> Layout().properties
        {}
        """
        if self.sort_key is None:
            return {}
        return {SORT_KEY_PROPERTY: self.sort_key}

    @property
    def write_settings(self) -> dict[str, str]:
        """The session confs a sorted write runs under: files of at most ROWS_PER_FILE rows."""
        if self.sort_key is None:
            return {}
        return {ROWS_PER_FILE_CONF: str(ROWS_PER_FILE)}


PLAIN = Layout()


def sort_key(plan: ViewPlan) -> str | None:
    """The state column a large state is sorted by; None where it has no key to sort by.

    A window's state is merged and read partition by partition; every other
    state by its merge keys, the first of which is the most selective
    prefix its readers join or group by. A global aggregate has one row.
    """
    if plan.view_class is ViewClass.WINDOW:
        return plan.window_partition[0].state_column if plan.window_partition else None
    return plan.merge_keys[0] if plan.keys else None


def layout(plan: ViewPlan, sort: bool) -> Layout:
    """The layout of a state: sorted by its key where `sort` (delta.Staging.sorted_states)."""
    if not sort or plan.log_state:
        # A log's rows are appended in change order: sorting its build
        # would not outlive the first append.
        return PLAIN
    return Layout(sort_key=sort_key(plan))


def deletion_vectors_pay(state_bytes: int | None) -> bool:
    """Whether a merged state just built should have deletion vectors: one of at least
    DELETION_VECTOR_STATE_BYTES (a log's appends rewrite no file: logs get none).

    >>> deletion_vectors_pay(8_100_000), deletion_vectors_pay(3_500_000)
    (True, False)
    >>> deletion_vectors_pay(None)
    False
    """
    if state_bytes is None:
        return False
    return state_bytes >= DELETION_VECTOR_STATE_BYTES


def sorted_rows(rows: exp.Query, by: str | None) -> exp.Query:
    """The state's built rows in `by` order (the guard row, whose keys are NULL, first).

    >>> print(sorted_rows(exp.select("a").from_("t"), "a").sql("spark"))
    SELECT * FROM (SELECT a FROM t) AS `__ivm_sorted` ORDER BY `a`
    """
    if by is None:
        return rows
    return (
        exp.select(exp.Star())
        .from_(rows.subquery(exp.to_identifier(f"{names.RESERVED_PREFIX}sorted", quoted=True)))
        .order_by(exp.column(by, quoted=True))
    )


@dataclass(frozen=True)
class TargetBounds:
    """The change's keys in a state's sort key: the ranges its non-NULL keys lie in, and
    the keys themselves where the probe listed them."""

    column: str
    data_type: str
    ranges: key_bounds.KeyRanges
    listed: tuple[str, ...] | None = None


def target_bounds(bounds: TargetBounds, target: str) -> exp.Expr:
    """A MERGE's condition on its target alone: a row whose key a change row may match, or the guard row.

    One per key column bounded (the MERGE's ON holds them all): a state row
    a change row matches equals it in every key column.

    Every change row's key lies in one of the ranges (and the list) or is
    NULL (the probe leaves NULLs out, so a NULL key is always searched:
    Delta skips the files without one by their null counts), so the
    condition removes no match. Delta prunes by it the files it searches
    for matches, and, as no clause reads unmatched state rows, Spark filters
    the state's rows by it before joining them with the change: with the
    keys listed, only the touched keys' rows are shuffled.

    >>> b = TargetBounds("k", "int", (("1", "4"),))
    >>> print(target_bounds(b, "t").sql("spark"))
    (`t`.`k` BETWEEN CAST('1' AS INT) AND CAST('4' AS INT) OR `t`.`k` IS NULL OR NOT `t`.`__ivm_guard` IS NULL)
    >>> b = TargetBounds("k", "int", (), ("1", "4"))
    >>> print(target_bounds(b, "t").sql("spark"))
    (`t`.`k` IN (1, 4) OR `t`.`k` IS NULL OR NOT `t`.`__ivm_guard` IS NULL)
    """
    column = exp.column(bounds.column, table=exp.to_identifier(target, True), quoted=True)
    within: list[exp.Expr] = []
    keys: list[exp.Expr] = []
    if bounds.ranges:
        keys.append(key_bounds.ranges_predicate(column, bounds.ranges, bounds.data_type))
    if bounds.listed:
        keys.append(key_bounds.listed_predicate(column, bounds.listed, bounds.data_type))
    if keys:
        within.append(exp.and_(*keys, copy=False))
    within.append(exp.Is(this=column.copy(), expression=exp.null()))
    guard = exp.column(names.GUARD, table=exp.to_identifier(target, True), quoted=True)
    within.append(exp.not_(exp.Is(this=guard, expression=exp.null()), copy=False))
    # Every part is built here for this condition alone: combined without
    # copies (copying a listed change's keys was most of a MERGE's Python).
    return exp.paren(exp.or_(*within, copy=False), copy=False)


def describe_keys(staged: str, columns: Sequence[str]) -> str:
    """DESCRIBE QUERY of a staged change's key columns: their types, for the bounds' literals.

    >>> describe_keys("__ivm_staged_r1_rows", ["__ivm_g0", "__ivm_pv_a1"])
    'DESCRIBE QUERY SELECT `__ivm_g0`, `__ivm_pv_a1` FROM `__ivm_staged_r1_rows`'
    """
    query = exp.select(*[exp.column(c, quoted=True) for c in columns]).from_(
        exp.Table(this=exp.to_identifier(staged, quoted=True))
    )
    return f"DESCRIBE QUERY {query.sql(dialect='spark')}"


def probe_keys(
    staged: str, typed: Sequence[tuple[str, str]], list_keys: bool = False
) -> tuple[str, list[key_bounds.KeyColumn]]:
    """The key-bounds probe (key_bounds.probe_query) over a staged change's key columns.

    `typed`: each column with its type. Returns the probe's SQL and the
    keys whose ranges (and, with `list_keys`, lists of at most
    MAX_LISTED_MERGE_KEYS) key_bounds.parse_probe reads from its rows, in
    `typed` order.
    """
    table = TableName(db=None, name=staged)
    keys = [key_bounds.KeyColumn(table=table, column=c, data_type=t) for c, t in typed]
    rows = (
        exp.select(*[exp.column(c, quoted=True) for c, _ in typed])
        .from_(exp.Table(this=exp.to_identifier(staged, quoted=True)))
        .subquery(exp.to_identifier(staged, quoted=True))
    )
    probe = key_bounds.probe_query(
        {table: (rows, keys)}, list_keys=list_keys, most_listed=MAX_LISTED_MERGE_KEYS
    )
    return probe.sql(dialect="spark"), keys


def bounded(data_type: str) -> bool:
    """Whether a sort key's probed keys cast back to the values `=` compares (key_bounds.py)."""
    return key_bounds.bounded_type(data_type)
