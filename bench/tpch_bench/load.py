"""The generated parquet loaded into Delta tables with the change data feed on.

The sources are rebuilt from the parquet on every run, so each run starts from
the same data at Delta version 0 whatever an earlier run changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from tpch_bench import sql_names
from tpch_bench.generate import LOADED_TABLES, GeneratedData


@dataclass(frozen=True)
class LoadedSources:
    schema: str
    rows: dict[str, int]
    seconds: float
    table_seconds: dict[str, float]


def load(spark: SparkSession, data: GeneratedData, schema: str) -> LoadedSources:
    started = time.monotonic()
    spark.sql(f"DROP SCHEMA IF EXISTS {sql_names.schema(schema)} CASCADE")
    spark.sql(f"CREATE SCHEMA {sql_names.schema(schema)}")
    rows: dict[str, int] = {}
    table_seconds: dict[str, float] = {}
    for name in LOADED_TABLES:
        table_started = time.monotonic()
        target = sql_names.table(schema, name)
        source = sql_names.parquet_file(data.base_file(name))
        # One commit (version 0) per table; the feed is on from the start, so every
        # later batch is readable through table_changes.
        spark.sql(
            f"CREATE TABLE {target} USING DELTA "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true) "
            f"AS SELECT * FROM {source}"
        )
        rows[name] = int(spark.table(target).count())
        table_seconds[name] = round(time.monotonic() - table_started, 3)
    return LoadedSources(
        schema=schema, rows=rows, seconds=time.monotonic() - started, table_seconds=table_seconds
    )


def drop_schemas(spark: SparkSession, *schemas: str) -> None:
    for name in schemas:
        spark.sql(f"DROP SCHEMA IF EXISTS {sql_names.schema(name)} CASCADE")
