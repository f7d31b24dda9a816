"""A dbt project of ivm models over one Delta source, for the integration tests."""

from __future__ import annotations

import pytest

SOURCES_YML = """
version: 2
sources:
  - name: raw
    schema: "{{ target.schema }}"
    tables:
      - name: src
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
        "sum(d) as sd, avg(d) as ad, sum(v) / count(*) as ratio from {src} group by g"
    ),
    "global": (
        "select count(*) as n, sum(v) as sv, avg(d) as ad, count(d) as nd "
        "from {src} where k is not null"
    ),
    "having": (
        "select g, k % 3 as bucket, sum(v) as sv, count(*) as n from {src} "
        "group by g, k % 3 having count(*) >= 2"
    ),
}


def model_files(names: list[str] | None = None) -> dict[str, str]:
    files = {"sources.yml": SOURCES_YML}
    for name, query in QUERIES.items():
        if names is None or name in names:
            files[f"{name}.sql"] = query.format(src="{{ source('raw', 'src') }}")
    return files


# Rows every test source starts with: duplicates and an all-NULL row.
SEED_ROWS = "(1, 'a', 1, 1.50), (1, 'a', 1, 1.50), (NULL, NULL, NULL, NULL)"


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
