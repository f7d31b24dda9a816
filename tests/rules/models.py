"""The model queries the rules layer checks, and the sources they read.

Every query the Spark property tests run (tests/functional/ivm_project.py) is
here too, with `{src}`, `{dim}`, `{tag}` and `{hist}` as the Delta tables
raw.src, raw.dim, raw.tag and raw.hist (an SCD2 dimension, whose changes
also close a key's versions and open its next in one commit), plus cases
those suites lack (EXTRA_QUERIES: INTERSECT ALL, EXCEPT, a 3-way join without
a CTE, self-joins, aggregates inside expressions, GROUP BY ALL, a top-k of
rows, global aggregates over outer and anti joins, ...) and WINDOW models
over raw.events. Models with plan nodes (NODE_QUERIES, SUBQUERY_NODE_QUERIES)
refresh each node first, a model of its own whose state the model reads
through its change feed (oracle.Refreshes, oracle.chain_of).

Left out, each for a reason:
- Window functions without a PARTITION BY column common to all of them:
  refresh/recipe.py recomputes such a model whole, so it has no delta rule.
- Constructs the compiler refuses (NOT IN over several columns, a RIGHT
  JOIN after another join, ...): the refusal tests cover them
  (tests/unit/test_refusals.py).
- Window functions whose value depends on how ties are broken (ROW_NUMBER,
  LAG, LEAD over a non-unique order): Spark and DuckDB may break ties
  differently, so the oracle would not be one bag. The window models here
  order by a unique id wherever one row is picked among others.

To add a case: add its query to EXTRA_QUERIES, naming its sources as
{src}, {dim}, {tag}, {hist} or {events}; the property test picks it up.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ivm_compiler import TableName
from tests.functional.ivm_project import (
    BAND_JOIN_QUERIES,
    JOIN_QUERIES,
    NODE_QUERIES,
    OUTER_JOIN_QUERIES,
    QUERIES,
    SEMI_JOIN_QUERIES,
    SUBQUERY_NODE_QUERIES,
)


@dataclass(frozen=True)
class Column:
    """A source column: its Spark type and the few values changes draw from (None is NULL).

    Small domains make duplicates, NULL keys and join partners common. A
    `serial` column is a unique id: every inserted row gets a fresh one, and
    updates never change it.
    """

    name: str
    data_type: str
    values: tuple[object, ...]
    serial: bool = False


@dataclass(frozen=True)
class Source:
    name: TableName
    columns: tuple[Column, ...]
    # An SCD2 dimension's (key, valid_from, valid_to) columns: its changes also
    # close a key's rows and open its next one in one commit (engine.Supersede).
    scd2: tuple[str, str, str] | None = None

    @property
    def schema(self) -> tuple[tuple[str, str], ...]:
        return tuple((c.name, c.data_type) for c in self.columns)


KEYS = (None, 0, 1, 2, 3)
GROUPS = (None, "a", "b", "c")
NAMES = (None, "x", "y")
VALUES = (None, -2, -1, 0, 1, 2)
AMOUNTS = (None, Decimal("0.00"), Decimal("1.50"), Decimal("-2.25"))
IDS = tuple(range(1, 13))

# The functional project's sources (ivm_project.SOURCE_DDL, DIM_DDL, TAG_DDL).
SRC = Source(
    TableName(db="raw", name="src"),
    (
        Column("k", "int", KEYS),
        Column("g", "string", GROUPS),
        Column("v", "int", VALUES),
        Column("d", "decimal(10,2)", AMOUNTS),
    ),
)
DIM = Source(
    TableName(db="raw", name="dim"),
    (Column("k", "int", KEYS), Column("name", "string", NAMES), Column("w", "int", VALUES)),
)
TAG = Source(
    TableName(db="raw", name="tag"),
    (Column("name", "string", NAMES), Column("label", "string", (None, "X", "X2", "N"))),
)
# Rows with a unique id for the window models (test_random_windows.py's source).
EVENTS = Source(
    TableName(db="raw", name="events"),
    (
        Column("id", "int", IDS, serial=True),
        Column("k", "int", (None, 0, 1, 2)),
        Column("g", "string", (None, "a", "b")),
        Column("ts", "int", (None, 0, 1, 2, 3)),
        Column("v", "decimal(10,2)", AMOUNTS),
    ),
)
# An SCD2 dimension: a key's versions, each valid from valid_from up to
# valid_to (NULL for the current one). The random changes do not keep a key's
# ranges apart, so a fact may fall in several versions or in none: the
# lookups must be exact either way.
HIST = Source(
    TableName(db="raw", name="hist"),
    (
        Column("k", "int", KEYS),
        Column("name", "string", NAMES),
        Column("valid_from", "int", (None, -2, 0, 1)),
        Column("valid_to", "int", (None, 0, 1, 2)),
    ),
    scd2=("k", "valid_from", "valid_to"),
)
SOURCES = {source.name.name: source for source in (SRC, DIM, TAG, EVENTS, HIST)}


@dataclass(frozen=True)
class Model:
    name: str
    sql: str
    sources: tuple[Source, ...]


def _model(name: str, query: str) -> Model:
    """A model over the sources its query names as {src}, {dim}, {tag} or {events}."""
    used = tuple(s for key, s in SOURCES.items() if f"{{{key}}}" in query)
    return Model(name, query.format(**{key: str(s.name) for key, s in SOURCES.items()}), used)


EXTRA_QUERIES = {
    # INTERSECT ALL: a row as often as the operand with the fewest copies has it.
    "set_intersect_all": "select k, g from {src} intersect all select k, name from {dim}",
    # EXCEPT (distinct): a value of the first operand that no other operand has.
    "set_except": "select g from {src} where v > 0 except select name from {dim}",
    # Three inputs joined directly, grouped by the last one's column.
    "three_way_grouped": (
        "select t.label, count(*) as n, sum(s.v) as sv, avg(s.d) as ad from {src} s "
        "join {dim} d on s.k = d.k join {tag} t on d.name = t.name group by t.label"
    ),
    # A self-join projection: every pair of rows sharing a key (duplicates square).
    "self_pairs": "select a.k, a.v, b.g from {src} a join {src} b on a.k = b.k where a.v < 2",
    # NOT EXISTS without correlation on the outer row's columns beyond the key.
    "not_exists_grouped": (
        "select s.g, count(*) as n, min(s.d) as mn from {src} s where not exists "
        "(select 1 from {dim} d where d.k = s.k) group by s.g"
    ),
    # Aggregates inside expressions and over CASE, COUNT(DISTINCT) beside SUM and AVG.
    "aggregate_expressions": (
        "select g, sum(case when v > 0 then d else 0 end) as pos, count(distinct k) as nk, "
        "max(d) - min(d) as spread, avg(v) as av from {src} where k is not null "
        "group by g having count(*) > 1"
    ),
    # A computed group key; GROUP BY ALL; HAVING without GROUP BY.
    "computed_key": (
        "select coalesce(g, 'none') as g2, count(*) as n, min(v) as mn from {src} "
        "group by coalesce(g, 'none')"
    ),
    "group_by_all": "select g, k, count(*) as n, sum(d) as sd from {src} group by all",
    "global_having": "select count(*) as n, sum(v) as sv from {src} having count(*) > 2",
    # Top-k over rows, ordered by every column (equal rows are one bag either way).
    "top_rows": "select k, g, v from {src} where v is not null order by v desc, k, g limit 3",
    # Top-k over distinct rows, NULLs of its first ordering first.
    "top_distinct": "select distinct g, v from {src} order by v desc nulls first, g limit 2",
    # DISTINCT over a join; UNION ALL of two joins.
    "distinct_join": "select distinct s.g, d.w from {src} s join {dim} d on s.k = d.k",
    "union_all_joins": (
        "select s.k, d.name from {src} s join {dim} d on s.k = d.k "
        "union all select d2.k, t.label from {tag} t join {dim} d2 on t.name = d2.name"
    ),
    # A global aggregate over an outer join, and one over an anti join.
    "left_global": (
        "select count(*) as n, count(d.name) as nn, max(d.w) as mw, sum(s.v) as sv "
        "from {src} s left join {dim} d on s.k = d.k"
    ),
    "anti_global": (
        "select count(*) as n, sum(s.d) as sd from {src} s "
        "where not exists (select 1 from {dim} d where d.k = s.k)"
    ),
    # Key relations over inputs aliased as the change query's own subqueries
    # once were (`c`, `p`: reads.key_changes).
    "aliases_of_key_relations": (
        "select p.k, p.g, c.name from {src} p left join {dim} c on p.k = c.k "
        "where exists (select 1 from {tag} c where c.name = p.g)"
    ),
    # A FULL JOIN grouped by the merged key, with extremes of the padded side.
    "full_grouped": (
        "select coalesce(s.k, d.k) as k, count(s.g) as ng, count(d.name) as nn, "
        "min(d.w) as mw from {src} s full join {dim} d on s.k = d.k group by coalesce(s.k, d.k)"
    ),
    # One table three times.
    "self_three": (
        "select a.g, count(*) as n from {src} a join {src} b on a.k = b.k "
        "join {src} c on b.g = c.g group by a.g"
    ),
    # Three operands of UNION, one a NULL key; string extremes.
    "three_unions": (
        "select k, g from {src} union select k, name from {dim} union select null, label from {tag}"
    ),
    "string_extremes": (
        "select k, min(g) as mn, max(g) as mx, count(distinct g) as n from {src} group by k"
    ),
    # STDDEV/VARIANCE of integral and decimal values (moments), grouped and global ...
    "moments_grouped": (
        "select g, stddev(v) as sd, var_pop(v) as vp, stddev_pop(d) as sdp, variance(d) as vs, "
        "count(*) as n from {src} group by g"
    ),
    "moments_global": (
        "select stddev_samp(v) as sd, var_samp(d) as vs, avg(v) as av, count(*) as n from {src}"
    ),
    # COVAR_POP/COVAR_SAMP/CORR (a co-moment beside the moments; CORR's MIN/MAX), grouped
    # and global, over integral, decimal and DOUBLE arguments ...
    "co_moments_grouped": (
        "select g, covar_pop(v, d) as cp, corr(v, d) as r, covar_samp(cast(v as double) / 3, k) "
        "as cs, count(*) as n from {src} group by g"
    ),
    "co_moments_global": "select covar_samp(d, v) as cs, corr(k, v) as r from {src}",
    # ... and SUM/AVG/STDDEV of DOUBLE values that round (a compensated sum).
    "floating_sums": (
        "select k, sum(cast(v as double) / 3) as s, avg(cast(d as double) * 10) as a, "
        "stddev(cast(v as double) / 3) as sd from {src} group by k"
    ),
    # Windows: ranks over a WHERE that updates cross (ties share a rank) ...
    "window_ranked": (
        "select id, g, v, rank() over (partition by g order by v desc) as r, "
        "dense_rank() over (partition by g order by v desc) as dr from {events} "
        "where v is null or v >= 0"
    ),
    # ... whole-partition aggregates over partitions that differ (k is common to all) ...
    "window_totals": (
        "select id, g, count(*) over (partition by g, k) as n, sum(v) over (partition by k, g) "
        "as total, avg(v) over (partition by k) as mean, max(ts) over (partition by k) "
        "as last_ts from {events}"
    ),
    # ... and running values in a unique order (id breaks ties on ts).
    "window_running": (
        "select id, k, ts, lead(ts) over (partition by k order by ts, id) as next_ts, "
        "sum(v) over (partition by k order by ts, id rows between unbounded preceding and "
        "current row) as running from {events}"
    ),
    # ... distributions over each partition's whole rows: NTILE's buckets (id breaks
    # ties on v, as the buckets split tied rows by position), PERCENT_RANK and
    # CUME_DIST (ties share a value), NTH_VALUE of a running frame; g is common.
    "window_distribution": (
        "select id, g, ntile(3) over (partition by g order by v, id) as tercile, "
        "percent_rank() over (partition by g order by v) as pr, cume_dist() over "
        "(partition by g, k order by ts) as cd, nth_value(v, 2) over (partition by g "
        "order by ts, id) as second_v from {events}"
    ),
    # A filter over windows, folded into them as QUALIFY (window_filters.py): the
    # latest row per key, filtered before and after the ranking ...
    "window_latest": (
        "select id, k, v from (select id, k, v, row_number() over (partition by k "
        "order by ts desc, id desc) as rn from {events} where v is null or v >= 0) as ranked "
        "where rn = 1 and id <> 3"
    ),
    # ... and the two best ranks per group with the rank shown, from a CTE.
    "window_top_two": (
        "with ranked as (select id, g, v, dense_rank() over (partition by g order by v desc) "
        "as dr from {events}) select id, g, dr * 10 as place from ranked where dr <= 2"
    ),
}

MODELS: tuple[Model, ...] = tuple(
    _model(name, query)
    for name, query in {
        **QUERIES,
        **JOIN_QUERIES,
        **OUTER_JOIN_QUERIES,
        **SEMI_JOIN_QUERIES,
        **BAND_JOIN_QUERIES,
        **SUBQUERY_NODE_QUERIES,
        **NODE_QUERIES,
        **EXTRA_QUERIES,
    }.items()
)
