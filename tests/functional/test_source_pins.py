"""A pin read from SHOW TBLPROPERTIES and DESCRIBE HISTORY, against Delta itself.

refresh/pins.py no longer reads DESCRIBE DETAIL for every source: it tells the
recorded table from a re-created or replaced one by the history's commit
times and operations, and carries the size forward with the commits' byte
metrics. Both rest on what this Delta runtime writes, so they are checked
here on real tables: every write form's bytes against DETAIL's size, and
each way a table can be swapped under its name.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from dbt.adapters.spark_ivm.delta.history import commit_rows, describe_history
from dbt.adapters.spark_ivm.delta.records import commit_metadata
from dbt.adapters.spark_ivm.delta.tables import (
    CHANGE_FEED_PROPERTY,
    DELTA_PROTOCOL_PROPERTY,
    SourceSnapshot,
    describe_detail,
    show_properties,
)
from ivm_compiler import TableName

pytestmark = pytest.mark.spark

SCHEMA = "source_pins"
_names = itertools.count()


@pytest.fixture(scope="module")
def schema(spark):
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    yield SCHEMA
    spark.sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


@pytest.fixture
def table(spark, schema) -> TableName:
    name = TableName(db=schema, name=f"t{next(_names)}")
    spark.sql(
        f"CREATE TABLE {name.sql()} (k INT, v STRING) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    return name


def pinned(spark, table: TableName) -> SourceSnapshot:
    """The snapshot Pins.describe reads: the newest commits, no DETAIL."""
    history = spark.sql(describe_history(table, limit=20))
    rows = [list(row) for row in history.collect()]
    commits = commit_rows(history.columns, rows)
    return SourceSnapshot(
        table,
        None,
        max(c.version for c in commits),
        recent_commits=commits,
        history_from=min(c.version for c in commits),
    )


def detail_size(spark, table: TableName) -> int:
    return int(spark.sql(describe_detail(table)).collect()[0]["sizeInBytes"])


def recorded(snapshot: SourceSnapshot, size: int) -> dict:
    """A state's entry for a pinned source as a refresh commit records it, with its size."""
    sized = dataclasses.replace(snapshot, size_bytes=size)
    metadata = commit_metadata("r", TableName("x", "y"), "f", [sized])
    return metadata["sources"][str(snapshot.table)]


WRITES = {
    "insert": "INSERT INTO {t} SELECT id, repeat('x', 50) FROM range(1000)",
    "insert overwrite": "INSERT OVERWRITE {t} SELECT id, repeat('y', 20) FROM range(500)",
    "replace where": "INSERT INTO {t} REPLACE WHERE k >= 600 SELECT id, 'r' FROM range(600, 650)",
    "delete": "DELETE FROM {t} WHERE k < 100",
    "merge": (
        "MERGE INTO {t} t USING (SELECT id AS k, 'w' AS v FROM range(150, 700)) s "
        "ON t.k = s.k WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
    ),
    "optimize": "OPTIMIZE {t}",
    "add column": "ALTER TABLE {t} ADD COLUMNS (c INT)",
    "properties": "ALTER TABLE {t} SET TBLPROPERTIES ('x' = 'y')",
    "create or replace as select": (
        "CREATE OR REPLACE TABLE {t} USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true) AS SELECT id AS k, 'n' AS v FROM range(9)"
    ),
}


def test_the_history_carries_the_size_through_every_write_form(spark, table):
    spark.sql(f"INSERT INTO {table.sql()} SELECT id, 'a' FROM range(10)")
    # A first build sizes a table with a short history from its creation on.
    assert pinned(spark, table).size_from_creation() == detail_size(spark, table)
    entry = recorded(pinned(spark, table), detail_size(spark, table))
    for name, statement in WRITES.items():
        spark.sql(statement.format(t=table.sql()))
        snapshot, size = pinned(spark, table), detail_size(spark, table)
        assert snapshot.size_after(entry) == size, name
        entry = recorded(snapshot, size)
    assert pinned(spark, table).size_from_creation() == size


def test_an_update_is_taken_to_keep_the_size_and_is_off_by_little(spark, table):
    spark.sql(f"INSERT INTO {table.sql()} SELECT id, repeat('x', 20) FROM range(1000)")
    entry = recorded(pinned(spark, table), detail_size(spark, table))
    spark.sql(f"UPDATE {table.sql()} SET v = repeat('z', 20) WHERE k < 100")
    carried = pinned(spark, table).size_after(entry)
    assert carried == entry["size_bytes"]
    # The rows rewritten in place: within a tenth of what DETAIL says.
    assert abs(carried - detail_size(spark, table)) < detail_size(spark, table) / 10


def test_a_pin_tells_the_recorded_table_from_a_swapped_one(spark, table):
    spark.sql(f"INSERT INTO {table.sql()} VALUES (1, 'a')")
    entry = recorded(pinned(spark, table), 0)
    assert entry["version"] == 1 and "committed_at" in entry
    spark.sql(f"INSERT INTO {table.sql()} VALUES (2, 'b')")
    assert pinned(spark, table).same_table(entry) is True

    # Dropped and created again, then brought back to the recorded version.
    spark.sql(f"DROP TABLE {table.sql()}")
    spark.sql(
        f"CREATE TABLE {table.sql()} (k INT, v STRING) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(f"INSERT INTO {table.sql()} VALUES (1, 'a')")
    assert pinned(spark, table).version == entry["version"]
    assert pinned(spark, table).same_table(entry) is False

    # Replaced in its own log, as dbt rebuilds a table model.
    entry = recorded(pinned(spark, table), 0)
    spark.sql(
        f"CREATE OR REPLACE TABLE {table.sql()} USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true) AS SELECT 1 AS k, 'a' AS v"
    )
    assert pinned(spark, table).same_table(entry) is False


def test_show_tblproperties_tells_a_delta_table_and_its_change_feed(spark, schema, table):
    properties = dict(spark.sql(show_properties(table)).collect())
    assert DELTA_PROTOCOL_PROPERTY in properties
    assert properties[CHANGE_FEED_PROPERTY] == "true"
    parquet = TableName(db=schema, name=f"p{next(_names)}")
    spark.sql(f"CREATE TABLE {parquet.sql()} (k INT) USING parquet")
    assert DELTA_PROTOCOL_PROPERTY not in dict(spark.sql(show_properties(parquet)).collect())
