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

# Sources are written in files of at most this many rows, in the generated
# (key) order, as a table that receives its rows in batches over time is:
# lineitem at SF 1 is 24 files and orders 6, so Delta's file statistics can
# skip the files outside a change's key range (a join's partner reads are
# narrowed to it, ivm_compiler/key_bounds.py). One file per table, the CTAS
# default here, would make every read a full scan whatever the predicate.
ROWS_PER_FILE = 250_000


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
        previous = spark.conf.get("spark.sql.files.maxRecordsPerFile", "0")
        spark.conf.set("spark.sql.files.maxRecordsPerFile", str(ROWS_PER_FILE))
        try:
            spark.sql(
                f"CREATE TABLE {target} USING DELTA "
                "TBLPROPERTIES (delta.enableChangeDataFeed = true) "
                f"AS SELECT * FROM {source}"
            )
        finally:
            spark.conf.set("spark.sql.files.maxRecordsPerFile", previous)
        rows[name] = int(spark.table(target).count())
        table_seconds[name] = round(time.monotonic() - table_started, 3)
    return LoadedSources(
        schema=schema, rows=rows, seconds=time.monotonic() - started, table_seconds=table_seconds
    )


def drop_schemas(spark: SparkSession, *schemas: str) -> None:
    for name in schemas:
        spark.sql(f"DROP SCHEMA IF EXISTS {sql_names.schema(name)} CASCADE")
