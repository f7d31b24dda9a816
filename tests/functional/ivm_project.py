"""A dbt project of ivm models over one Delta source, for the integration tests."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

SOURCES_YML = """
version: 2
sources:
  - name: raw
    schema: "{{ target.schema }}"
    tables:
      - name: src
      - name: dim
      - name: tag
      - name: hist
"""

# Source rows: a nullable key, a small nullable group, nullable values of two
# numeric kinds, so NULL keys, NULL values and duplicates all occur.
SOURCE_DDL = (
    "CREATE TABLE {table} (k INT, g STRING, v INT, d DECIMAL(10,2)) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)

# One query per view class; `{src}` is the source (dbt's source() in the model,
# the source at a pinned version in the oracle).
QUERIES = {
    "keeps_key": "select k, g, v * 2 as v2 from {src} where v is null or v >= 0",
    "drops_key": "select g, v from {src}",
    "distinct_pairs": "select distinct g, d from {src}",
    "grouped": (
        "select g, count(*) as n, count(v) as nv, sum(v) as sv, avg(v) as av, "
        "sum(d) as sd, avg(d) as ad, sum(v) / count(*) as ratio, bool_or(v < 0) as any_neg, "
        "some(d is null) as some_null from {src} group by g"
    ),
    "global": (
        "select count(*) as n, sum(v) as sv, avg(d) as ad, count(d) as nd, "
        "bool_and(v >= 0) as all_pos, every(d > 0) as every_pos from {src} where k is not null"
    ),
    "having": (
        "select g, k % 3 as bucket, sum(v) as sv, count(*) as n from {src} "
        "group by g, k % 3 having count(*) >= 2"
    ),
    # UNION ALL of two filters of one table: a row in both is there twice.
    "stacked": (
        "select k, g from {src} where v > 0 union all select k, g from {src} where d is not null"
    ),
    # Top-k over groups: every group is kept, the view shows the first two. The
    # ORDER BY is total (g is unique per group), so the query's choice is the view's.
    "top_groups": (
        "select g, count(*) as n, sum(v) as sv from {src} group by g order by n desc, g limit 2"
    ),
}


# Two more sources for joins: `dim` maps src.k to a name (keys may repeat or be
# NULL, so a fact row can have zero, one or several partners), `tag` maps names
# to labels.
DIM_DDL = (
    "CREATE TABLE {table} (k INT, name STRING, w INT) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)
TAG_DDL = (
    "CREATE TABLE {table} (name STRING, label STRING) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)

# Models over several sources and the pre-aggregated aggregates; `{src}`,
# `{dim}`, `{tag}` are the sources, as in QUERIES.
JOIN_QUERIES = {
    # A bag projection over an equi-join; the residual filter sits in a subquery in FROM.
    "joined_rows": (
        "select s.k, s.v, d.name from {src} s "
        "join (select k, name from {dim} where w is null or w > 0) d on s.k = d.k"
    ),
    # Grouped over a join with a non-equi condition in ON; MIN/MAX/COUNT(DISTINCT).
    "joined_groups": (
        "select d.name, count(*) as n, sum(s.v) as sv, min(s.v) as mn, max(s.d) as mx, "
        "count(distinct s.g) as ng from {src} s join {dim} d on s.k = d.k and s.v <= d.w "
        "group by d.name"
    ),
    # The same table twice.
    "self_joined": (
        "select a.g, b.g as g2, count(*) as n, sum(b.v) as sv from {src} a "
        "join {src} b on a.k = b.k group by a.g, b.g"
    ),
    # Three inputs through a CTE, DISTINCT over the result, a USING join.
    "three_way": (
        "with named as (select s.g, d.name from {src} s join {dim} d on s.k = d.k) "
        "select distinct n.g, t.label from named n join {tag} t using (name)"
    ),
    # Pre-aggregation on one source: extremes of two types, HAVING over MAX.
    "extremes": (
        "select g, min(v) as mn, max(v) as mx, min(d) as mnd, count(distinct v) as cdv, "
        "count(*) as n from {src} group by g having max(v) > -2 or max(v) is null"
    ),
    # Set operations through one count per operand: rows appear and vanish as
    # their counts in each operand cross zero.
    "set_union": "select k, name from {dim} union select k, g from {src}",
    "set_except_all": (
        "select s.k, s.g from {src} s join {dim} d on s.k = d.k "
        "except all select k, g from {src} where v = 1"
    ),
    "set_intersect": "select g, v from {src} intersect select name, w from {dim}",
    # Extremes without GROUP BY: one row even when the source is empty.
    "global_extremes": (
        "select min(v) as mn, max(d) as mx, count(distinct g) as ng, count(*) as n from {src}"
    ),
}

# Outer joins over the same sources: padded rows appear and vanish as keys
# gain their first or lose their last partner, on either side of the join.
OUTER_JOIN_QUERIES = {
    # A condition on the padded side in ON (not WHERE): failing it pads the row.
    "left_rows": (
        "select s.k, s.v, d.name from {src} s left join {dim} d on s.k = d.k and d.w > 0"
    ),
    # A condition on the preserved side in ON; MIN over the join; COUNT of a padded column.
    "left_groups": (
        "select d.name, count(*) as n, sum(s.v) as sv, min(s.v) as mn, count(d.k) as nd "
        "from {src} s left join {dim} d on s.k = d.k and s.v > 0 group by d.name"
    ),
    # Two key columns: a row matches only when both are equal and neither is NULL.
    "left_composite": (
        "select s.k, d.name, count(*) as n from {src} s "
        "left join {dim} d on s.k = d.k and s.v = d.w group by s.k, d.name"
    ),
    # Both sides padded; the USING column is COALESCE(s.k, d.k).
    "full_using": "select k, s.g, d.name from {src} s full join {dim} d using (k)",
    # A RIGHT JOIN, then a LEFT JOIN on a column of its preserved side.
    "right_chain": (
        "select d.name, t.label, count(*) as n from {src} s right join {dim} d on s.k = d.k "
        "left join {tag} t on d.name = t.name group by d.name, t.label"
    ),
    # A chain through the padded side: tag joins dim's name, NULL when dim is padded.
    "snowflake": (
        "select s.g, t.label, count(*) as n, max(s.v) as mx from {src} s "
        "left join {dim} d on s.k = d.k left join {tag} t on d.name = t.name "
        "group by s.g, t.label"
    ),
    # The anti-join idiom: the rows without a partner.
    "unmatched": ("select s.k, s.g from {src} s left join {dim} d on s.k = d.k where d.k is null"),
    # One table on both sides of an outer join.
    "self_left": (
        "select a.g, count(b.v) as nb, count(*) as n from {src} a "
        "left join {src} b on a.k = b.k and b.g = 'a' group by a.g"
    ),
    # An inner join, then an outer one; DISTINCT over the result.
    "inner_then_left": (
        "select distinct d.name, t.label from {src} s join {dim} d on s.k = d.k "
        "left join {tag} t on d.name = t.name"
    ),
}

# Semi and anti joins over the same sources: a row appears when its first
# partner arrives and vanishes when its last one goes; NOT IN also follows
# Spark's NULL rules (a NULL in the subquery hides every row, an empty
# subquery shows every row, NULL tested values included).
SEMI_JOIN_QUERIES = {
    # Correlated EXISTS with a condition on the subquery's table; a filter beside it.
    "exists_rows": (
        "select s.k, s.g, s.v from {src} s where exists "
        "(select 1 from {dim} d where d.k = s.k and d.w > 0) and s.g is not null"
    ),
    # NOT EXISTS with a condition on the outer row inside the subquery: a row
    # failing it has an empty subquery and stays.
    "not_exists_rows": (
        "select s.k, s.g from {src} s where not exists "
        "(select 1 from {dim} d where d.k = s.k and s.v > 0)"
    ),
    # NOT IN with NULLs on both sides (src.k and dim.w are nullable).
    "not_in_nulls": (
        "select k, g, v from {src} where k not in (select w from {dim} where name = 'x')"
    ),
    # IN over the model's own source (the subquery's table takes another
    # alias), grouped.
    "in_self_grouped": (
        "select g, count(*) as n, sum(v) as sv from {src} "
        "where k in (select v from {src} where g = 'a') group by g"
    ),
    # LEFT SEMI JOIN under a grouped aggregate with MAX.
    "semi_join_grouped": (
        "select s.g, count(*) as n, max(s.v) as mx from {src} s "
        "left semi join {dim} d on s.k = d.k and d.w is not null group by s.g"
    ),
    # LEFT ANTI JOIN correlated on two columns.
    "anti_join_two_keys": (
        "select s.k, s.v, s.g from {src} s left anti join {dim} d on s.k = d.k and s.v = d.w"
    ),
    # An uncorrelated EXISTS (all rows or none) and an IN over two columns.
    "exists_uncorrelated": (
        "select s.k, s.v from {src} s where exists (select 1 from {tag} t where t.label = 'X') "
        "and (s.k, s.v) in (select d.k, d.w from {dim} d)"
    ),
    # NOT IN of a column an outer join pads with NULL.
    "left_join_not_in": (
        "select s.k, d.name from {src} s left join {dim} d on s.k = d.k "
        "where d.name not in (select t.name from {tag} t where t.label = 'X')"
    ),
}

# An SCD2 dimension over src's keys: each version of a key valid from
# valid_from up to valid_to, NULL for the current one; src's v is a fact's time.
HIST_DDL = (
    "CREATE TABLE {table} (k INT, name STRING, valid_from INT, valid_to INT) USING DELTA "
    "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
)

# Joins whose conditions compare the two sides other than by equality: a
# padded row appears and vanishes as the rows its own values fall between
# arrive and go (not as its key gains or loses partners), and a semi or anti
# join keeps a row by its own values likewise.
BAND_JOIN_QUERIES = {
    # The SCD2 point-in-time lookup, BETWEEN with the current version open-ended.
    "scd2_between": (
        "select s.k, s.v, h.name from {src} s left join {hist} h "
        "on s.k = h.k and s.v between h.valid_from and coalesce(h.valid_to, 99)"
    ),
    # The half-open form with a NULL valid_to for the current version, grouped.
    "scd2_half_open": (
        "select h.name, count(*) as n, count(h.k) as matched, sum(s.d) as sd, max(s.v) as mx "
        "from {src} s left join {hist} h on s.k = h.k and s.v >= h.valid_from "
        "and (s.v < h.valid_to or h.valid_to is null) group by h.name"
    ),
    # The lookup, then a LEFT JOIN through its padded side.
    "scd2_chain": (
        "select s.g, h.name, t.label from {src} s left join {hist} h "
        "on s.k = h.k and s.v between h.valid_from and coalesce(h.valid_to, 99) "
        "left join {tag} t on h.name = t.name"
    ),
    # An inner band join with no equality.
    "band_inner": (
        "select s.k, s.g, h.name from {src} s join {hist} h "
        "on s.v between h.valid_from and h.valid_to"
    ),
    # A LEFT JOIN on a band alone, with a condition on the null-supplying side.
    "band_left_no_key": (
        "select s.k, s.v, h.k as hk from {src} s left join {hist} h "
        "on s.v >= h.valid_from and s.v < h.valid_to and h.name is not null"
    ),
    # A FULL JOIN comparing the sides beside its key: both sides padded.
    "band_full": (
        "select h.name, s.g, s.v from {hist} h full join {src} s "
        "on h.k = s.k and s.v > h.valid_from"
    ),
    # A RIGHT JOIN with a comparison and a condition on the preserved side.
    "band_right_grouped": (
        "select d.name, count(s.k) as n, sum(s.v) as sv from {src} s right join {dim} d "
        "on s.k = d.k and s.v < d.w and d.name is not null group by d.name"
    ),
    # One table on both sides: each row with the later rows of its key.
    "self_band": (
        "select a.k, a.v, b.v as later from {src} a left join {src} b on a.k = b.k and b.v > a.v"
    ),
    # NOT EXISTS by the SCD2 range: the facts no version of their key covers.
    "scd2_not_exists": (
        "select s.k, s.v, s.g from {src} s where not exists (select 1 from {hist} h "
        "where h.k = s.k and s.v >= h.valid_from and (h.valid_to is null or s.v < h.valid_to))"
    ),
    # EXISTS by an inequality alone, grouped.
    "exists_band_grouped": (
        "select s.g, count(*) as n, sum(s.d) as sd from {src} s where exists "
        "(select 1 from {hist} h where s.v > h.valid_from and h.name = 'x') group by s.g"
    ),
    # LEFT SEMI JOIN on a comparison beside the key.
    "semi_join_comparison": (
        "select s.k, s.v from {src} s left semi join {dim} d on s.k = d.k and s.v <> d.w"
    ),
    # NOT IN correlated by an inequality: Spark's NULL rules within each row's subquery.
    "not_in_correlated_band": (
        "select s.k, s.v from {src} s where s.v not in "
        "(select h.valid_from from {hist} h where h.k <> s.k)"
    ),
    # NOT EXISTS comparing the subquery with an outer join's padded side.
    "left_then_not_exists_band": (
        "select s.k, d.name from {src} s left join {dim} d on s.k = d.k "
        "where not exists (select 1 from {hist} h where h.name = d.name and d.w >= h.valid_from)"
    ),
}

# EXISTS, NOT EXISTS, IN and NOT IN over subqueries that are not one table's
# rows: each subquery is kept as a plan node (its correlation taken out into
# the outer test), whose distinct keys' change drives the semi or anti join.
SUBQUERY_NODE_QUERIES = {
    # NOT EXISTS over a join, correlated by the key.
    "not_exists_join": (
        "select s.k, s.g from {src} s where not exists (select 1 from {dim} d "
        "join {tag} t on d.name = t.name where d.k = s.k and t.label = 'X')"
    ),
    # EXISTS over a CTE that joins (merged into the subquery, which becomes the node).
    "exists_cte_join": (
        "with labelled as (select d.k, d.w, t.label from {dim} d join {tag} t "
        "on d.name = t.name) select s.k, s.v from {src} s where exists "
        "(select 1 from labelled l where l.k = s.k and l.label is not null)"
    ),
    # IN over an aggregating CTE (a node of its own), correlated.
    "in_cte_aggregate": (
        "with tops as (select k, max(w) as mw from {dim} group by k) "
        "select s.k, s.v from {src} s where s.v in (select mw from tops where tops.k = s.k)"
    ),
    # NOT IN over an aggregate: a group of only NULLs has a NULL maximum, which hides every row.
    "not_in_aggregate": (
        "select s.k, s.v from {src} s where s.v not in (select max(w) from {dim} group by name)"
    ),
    # IN over an aggregate correlated by an equality (it joins the GROUP BY), grouped outside.
    "in_correlated_aggregate": (
        "select s.g, count(*) as n, sum(s.d) as sd from {src} s where s.v in "
        "(select min(d.w) from {dim} d where d.k = s.k group by d.name) group by s.g"
    ),
    # NOT EXISTS over the groups that pass HAVING.
    "not_exists_having": (
        "select s.k, s.g from {src} s where not exists "
        "(select 1 from {dim} d where d.k = s.k group by d.k having count(*) > 1)"
    ),
    # EXISTS over a derived table that filters, correlated by a comparison.
    "exists_derived_band": (
        "select s.k, s.v from {src} s where exists (select 1 from "
        "(select k, w from {dim} where name is not null) x where x.k = s.k and x.w > s.v)"
    ),
    # IN over a subquery that nests another.
    "in_nested": (
        "select s.k, s.v from {src} s where s.k in (select d.k from {dim} d "
        "where d.name in (select t.name from {tag} t where t.label = 'X'))"
    ),
    # An uncorrelated EXISTS over a join: every row or none.
    "exists_uncorrelated_join": (
        "select s.k, s.g from {src} s where exists "
        "(select 1 from {dim} d join {tag} t on d.name = t.name where d.w > 0)"
    ),
}

# CTEs and FROM-subqueries that aggregate, remove duplicates or are set
# operations: each is kept as a plan node (an ivm model of its own beside the
# model) that the model reads through its change feed.
NODE_QUERIES = {
    # An aggregating CTE joined to a dimension.
    "cte_totals": (
        "with totals as (select k, sum(v) as sv, count(*) as n from {src} group by k) "
        "select d.name, t.sv, t.n from {dim} d join totals t on d.k = t.k"
    ),
    # The rows holding their group's maximum: src is read by the node and by the
    # model, which must see it at one version.
    "group_max_rows": (
        "select s.k, s.g, s.v from {src} s "
        "join (select g, max(v) as mx from {src} group by g) m on s.g = m.g and s.v = m.mx"
    ),
    # A mixed chain of set operations in a CTE, then a join and a grouping: the
    # CTE's node keeps its UNION ALL operand as a node of its own.
    "union_names": (
        "with names as (select name from {dim} union all select name from {tag} "
        "except all select label from {tag}) "
        "select t.label, count(*) as n from names x join {tag} t on x.name = t.name "
        "group by t.label"
    ),
    # Two nodes, the second aggregating over the first.
    "chained": (
        "with a as (select k, max(v) as mx from {src} group by k), "
        "b as (select mx, count(*) as n from a group by mx) select b.mx, b.n from b"
    ),
}

SOURCE_NAMES = ("src", "dim", "tag")
BAND_SOURCE_NAMES = (*SOURCE_NAMES, "hist")


def model_files(
    names: list[str] | None = None, queries: dict[str, str] = QUERIES
) -> dict[str, str]:
    files = {"sources.yml": SOURCES_YML}
    sources = {name: f"{{{{ source('raw', '{name}') }}}}" for name in BAND_SOURCE_NAMES}
    for name, query in queries.items():
        if names is None or name in names:
            files[f"{name}.sql"] = query.format(**sources)
    return files


# Rows every test source starts with: duplicates and an all-NULL row.
SEED_ROWS = "(1, 'a', 1, 1.50), (1, 'a', 1, 1.50), (NULL, NULL, NULL, NULL)"


def create_join_sources(project) -> dict[str, str]:
    """Create `dim` and `tag` beside `src`, with NULL keys and keys that repeat."""
    dim = f"{project.test_schema}.dim"
    tag = f"{project.test_schema}.tag"
    project.run_sql(DIM_DDL.format(table=dim))
    project.run_sql(f"INSERT INTO {dim} VALUES (1, 'x', 1), (1, 'y', NULL), (NULL, 'x', 2)")
    project.run_sql(TAG_DDL.format(table=tag))
    project.run_sql(f"INSERT INTO {tag} VALUES ('x', 'X'), ('x', 'X2'), (NULL, 'N')")
    return {"src": create_source(project), "dim": dim, "tag": tag}


def create_source(project, rows: str = SEED_ROWS) -> str:
    """Create the test schema's Delta source `src` (change data feed on) with some rows."""
    table = f"{project.test_schema}.src"
    project.run_sql(SOURCE_DDL.format(table=table))
    project.run_sql(f"INSERT INTO {table} VALUES {rows}")
    return table


class IvmProject:
    """Base of the Spark test classes: every model of the project is materialized as ivm."""

    @pytest.fixture(scope="class")
    def project_config_update(self):
        return {"models": {"+materialized": "ivm"}}


class OneSourceProject(IvmProject):
    """Models named in `model_names` (keys of QUERIES) over the one source `src`."""

    model_names: tuple[str, ...] = ()

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(list(self.model_names))

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project)


def random_change_settings(default_examples: int) -> settings:
    """Hypothesis settings of the property tests.

    CI replays a fixed set of examples (derandomize) so a red run is
    reproducible; IVM_PROPERTY_EXAMPLES=<n> IVM_PROPERTY_RANDOM=1 explores.
    Each example runs dbt several times, so the defaults are small.
    """
    return settings(
        max_examples=int(os.environ.get("IVM_PROPERTY_EXAMPLES", str(default_examples))),
        deadline=None,
        derandomize=os.environ.get("IVM_PROPERTY_RANDOM", "") != "1",
        database=None,
        # differing_executors: one property runs in several test classes (each
        # with its own models); with no example database there is nothing to
        # replay across them, which is what the check guards.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )


def sql_literal(value: object) -> str:
    """A Python value as a Spark SQL literal, for the change statements the tests write."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)
