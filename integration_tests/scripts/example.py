"""The worked example: sources -> ivm models -> a change batch -> an incremental refresh.

Run through `scripts/example` from the repository root. Everything runs in one
process: one local Spark session with Delta Lake (kept in
integration_tests/.spark_ivm/), shared by this script and by dbt, which is
driven in-process through dbtRunner.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Protocol

from dbt.cli.main import dbtRunner
from pyspark.sql import SparkSession

from dbt.adapters.spark_ivm.runtime.embedded import RUNTIME_DIR_NAME, session_configs

PROJECT_DIR = Path(__file__).resolve().parents[1]
SOURCE = "shop_raw.order_lines"
CUSTOMERS = "shop_raw.customers"
# The schemas of profiles.yml's targets (the ivm models, and the same as 'table').
MODEL_SCHEMAS = ("ivm_example", "ivm_example_table")
STATUSES = ["open", "paid", "paid", "paid", "cancelled"]
SEGMENTS = ["retail", "retail", "wholesale", "online"]


class Sql(Protocol):
    """What the loader writes through: a SparkSession here, or any object whose
    `sql` runs one statement (tests/functional/test_server_mode.py sends them
    over Thrift)."""

    def sql(self, statement: str, /) -> object: ...


def start_spark() -> SparkSession:
    started = time.monotonic()
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(PROJECT_DIR / RUNTIME_DIR_NAME).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"Spark session with Delta Lake started in {time.monotonic() - started:.1f}s")
    return spark


def line(line_id: int, rng: random.Random) -> str:
    customer = "NULL" if rng.random() < 0.05 else str(rng.randint(1, 40))
    discount = "NULL" if rng.random() < 0.6 else f"{rng.randint(0, 500) / 100:.2f}"
    return (
        f"({line_id}, {customer}, {rng.randint(1, 5)}, {rng.randint(100, 9999) / 100:.2f}, "
        f"{discount}, '{rng.choice(STATUSES)}')"
    )


def create_sources(spark: Sql, rng: random.Random) -> None:
    # Each run starts over. An earlier run's models read the sources dropped
    # below at versions the new tables do not have: their published views
    # cannot be read until the consistency group publishes again, which waits
    # for its last member, which `dbt build` skips when the tests of the
    # members before it fail on those views.
    for schema in MODEL_SCHEMAS:
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    spark.sql("CREATE DATABASE IF NOT EXISTS shop_raw")
    spark.sql(f"DROP TABLE IF EXISTS {SOURCE}")
    spark.sql(
        f"CREATE TABLE {SOURCE} (line_id INT, customer_id INT, quantity INT, "
        "unit_price DECIMAL(10,2), discount DECIMAL(10,2), status STRING) USING DELTA "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(f"INSERT INTO {SOURCE} VALUES " + ", ".join(line(i, rng) for i in range(1, 2001)))
    spark.sql(f"DROP TABLE IF EXISTS {CUSTOMERS}")
    spark.sql(
        f"CREATE TABLE {CUSTOMERS} (customer_id INT, name STRING, segment STRING) USING DELTA "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    customers = ", ".join(
        f"({i}, 'customer {i}', {'NULL' if i % 13 == 0 else repr(rng.choice(SEGMENTS))})"
        for i in range(1, 41)
    )
    spark.sql(f"INSERT INTO {CUSTOMERS} VALUES {customers}")
    print(f"Created {SOURCE} with 2000 order lines and {CUSTOMERS} with 40 (change data feed on)")


def apply_batch(spark: Sql, rng: random.Random) -> None:
    spark.sql(f"INSERT INTO {SOURCE} VALUES " + ", ".join(line(i, rng) for i in range(2001, 2051)))
    spark.sql(f"UPDATE {SOURCE} SET status = 'paid' WHERE status = 'open' AND line_id % 7 = 0")
    spark.sql(f"UPDATE {SOURCE} SET discount = NULL WHERE line_id % 11 = 0")
    spark.sql(f"DELETE FROM {SOURCE} WHERE status = 'cancelled' AND line_id % 3 = 0")
    spark.sql(f"UPDATE {CUSTOMERS} SET segment = 'wholesale' WHERE customer_id IN (3, 4)")
    spark.sql(f"DELETE FROM {CUSTOMERS} WHERE customer_id = 5")
    print(
        "Applied a batch: 50 inserts, two updates (status, discount), one delete on order "
        "lines; two customers change segment, one is deleted"
    )


def dbt_build(*extra: str, command: str = "build") -> list:
    result = dbtRunner().invoke(
        [command, "--project-dir", str(PROJECT_DIR), "--profiles-dir", str(PROJECT_DIR), *extra]
    )
    if not result.success:
        raise SystemExit(f"dbt {command} failed: {result.exception or 'see the log above'}")
    return list(result.result.results)


def rebuild_as_tables() -> dict[str, float]:
    """Every model built as a dbt 'table' in its own schema, on the sources as they are: seconds."""
    results = dbt_build(
        "--target", "table", "--vars", "{example_materialization: table}", command="run"
    )
    return {r.node.name: r.execution_time for r in results if r.node.resource_type == "model"}


def model_seconds(results: list) -> dict[str, float]:
    return {r.node.name: r.execution_time for r in results if r.node.resource_type == "model"}


def report(title: str, results: list) -> None:
    print(f"\n{title}")
    print(f"  {'model':<30} {'seconds':>8}  what happened")
    for result in results:
        if result.node.resource_type != "model":
            continue
        message = (result.adapter_response or {}).get("_message") or result.message
        print(f"  {result.node.name:<30} {result.execution_time:>8.2f}  {message}")
    tests = [r for r in results if r.node.resource_type == "test"]
    passed = sum(1 for r in tests if str(r.status) == "pass")
    print(f"  ivm_matches_query tests: {passed}/{len(tests)} passed")


def compare(built: dict[str, float], refreshed: dict[str, float], tables: dict[str, float]) -> None:
    """Each model's incremental refresh against its first build and a 'table' rebuild."""
    print("\nThe incremental refresh against the first build and a 'table' rebuild (seconds)")
    print(f"  {'model':<30} {'refresh':>8} {'build':>8} {'table':>8} {'table/refresh':>14}")
    for name, seconds in refreshed.items():
        ratio = tables[name] / seconds if seconds else float("inf")
        print(
            f"  {name:<30} {seconds:>8.2f} {built[name]:>8.2f} {tables[name]:>8.2f} {ratio:>13.2f}x"
        )
    total, table_total = sum(refreshed.values()), sum(tables[n] for n in refreshed)
    print(
        f"  {'all models':<30} {total:>8.2f} {sum(built.values()):>8.2f} {table_total:>8.2f} "
        f"{table_total / total:>13.2f}x"
    )


def main() -> int:
    rng = random.Random(7)
    spark = start_spark()
    create_sources(spark, rng)
    first = dbt_build("--full-refresh")
    report("First build (--full-refresh): state computed at pinned versions", first)
    apply_batch(spark, rng)
    refreshed = dbt_build()
    report("Incremental refresh: only the change feed is read", refreshed)
    # The same models as 'table', on the same data: what the refresh replaces.
    # Built twice, so the one timed replaces tables that exist, as every run of
    # a table model after its first does.
    rebuild_as_tables()
    compare(model_seconds(first), model_seconds(refreshed), rebuild_as_tables())
    report("Refresh with no new source commits", dbt_build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
