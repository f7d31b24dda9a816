"""Isolation between the adapter suite's classes, which all share one SparkSession.

A user's dbt invocation with ``method: session`` gets a fresh SparkSession per
process; here every class (and every dbt invocation in it) runs in the same
one, so session-scoped state outlives the class that made it. The only such
state dbt-spark leaves behind is temporary views: its incremental
materialization creates ``<model>__dbt_tmp`` as a temporary view on the merge
path and never drops it. Spark lists temporary views under every schema, with
no schema, so a later class's ``dbt docs generate --no-compile`` (which lists
relations without dbt's relation cache) gets a catalog row with schema None and
fails in dbt-core with "'NoneType' object has no attribute 'lower'".
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="class", autouse=True)
def drop_leftover_temporary_views(spark):
    """Start each class with no temporary views, as a fresh dbt process would."""
    for row in spark.sql("SHOW TABLES").collect():
        if row.isTemporary:
            spark.catalog.dropTempView(row.tableName)
    yield
