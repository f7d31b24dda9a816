"""The warehouse's raw data at a scale (raw_data.py), without Spark.

`scripts/warehouse --scale N` measures the same warehouse where rebuilding
it takes minutes; these check that a scale multiplies what is generated and
keeps what the models rely on: ids unique, updated_at strictly increasing
per key, lines that name a product that does not exist, and that scale 1
is the data the tests and the committed report use.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections import Counter
from datetime import datetime

import pytest
from raw_data import Insert, RawData, csv_field

BATCHES = 3
SCALE_ONE_SHA256 = "4cabb8412b0ddd5de0f5d5e6e984af6106ee408594f690d8ddc3ec3ed629ee9f"


def _inserts(statements) -> list[Insert]:
    return [s for s in statements if isinstance(s, Insert)]


def _rows(raw: RawData, name: str, batches: int = BATCHES) -> list[tuple]:
    statements = [*raw.first_load()]
    for number in range(1, batches + 1):
        statements += raw.batch(number)
    return [row for i in _inserts(statements) if i.name == name for row in i.rows]


def _first_load_sizes(scale: int) -> Counter:
    sizes: Counter = Counter()
    for statement in _inserts(RawData("raw", scale=scale).first_load()):
        sizes[statement.name] += len(statement.rows)
    return sizes


def test_scale_multiplies_the_first_loads_entities():
    one, four = _first_load_sizes(1), _first_load_sizes(4)
    # Customers, products and orders (with their status versions) are counted
    # out; lines and payments are drawn per order, so they grow about as much.
    assert one["customers"] == 300 and four["customers"] == 1200
    assert one["products"] == 60 and four["products"] == 240
    assert (one["orders"], four["orders"]) == (2100, 8400)
    for name in ("order_items", "payments"):
        assert 3.5 < four[name] / one[name] < 4.5, (name, one[name], four[name])
    assert four["countries"] == one["countries"] == 7


def test_a_batch_at_scale_changes_scale_times_the_rows():
    shapes = {}
    for scale in (1, 3):
        raw = RawData("raw", scale=scale)
        list(raw.first_load())
        statements = list(raw.batch(1))
        rows = Counter()
        for statement in _inserts(statements):
            rows[statement.name] += len(statement.rows)
        erased = next(s for s in statements if isinstance(s, str) and "DELETE FROM raw.cust" in s)
        shapes[scale] = (len(statements), rows, erased.count(",") + 1)
    # As many commits at any scale, each touching scale times the rows:
    # 25 customers moved and 5 new, 4 products repriced and 1 new, 2 erased.
    assert shapes[1][0] == shapes[3][0]
    assert (shapes[1][1]["customers"], shapes[3][1]["customers"]) == (30, 90)
    assert (shapes[1][1]["products"], shapes[3][1]["products"]) == (5, 15)
    assert (shapes[1][2], shapes[3][2]) == (2, 6)


def test_a_batch_scale_sizes_the_batch_alone():
    # Data at scale 6, batches at scale 2: the first load as at scale 6, each
    # batch's appended rows as at scale 2, and each in-place update or delete
    # picks one row in three times as many, so it touches a third of the rows.
    full, small = RawData("raw", scale=6), RawData("raw", scale=6, batch_scale=2)
    small_load: Counter = Counter()
    for statement in _inserts(small.first_load()):
        small_load[statement.name] += len(statement.rows)
    assert small_load == _first_load_sizes(6)
    list(full.first_load())
    full_batch, small_batch = list(full.batch(1)), list(small.batch(1))
    assert len(full_batch) == len(small_batch)
    # 25 customers moved and 5 new per unit of scale.
    appended = [
        sum(len(i.rows) for i in _inserts(batch) if i.name == "customers")
        for batch in (full_batch, small_batch)
    ]
    assert appended == [180, 60]
    updates = [s for s in small_batch if isinstance(s, str) and " % " in s]
    assert "order_id % 291 = 1" in updates[-3] and "payment_id % 159 = 1" in updates[-1]
    assert [s for s in full_batch if isinstance(s, str) and " % " in s][-1].endswith("% 53 = 1")
    with pytest.raises(ValueError, match="batch_scale 4 must be a positive divisor of scale 6"):
        RawData("raw", scale=6, batch_scale=4)


@pytest.mark.parametrize("scale", [1, 2])
def test_new_ids_are_unique_and_versions_move_forward(scale):
    raw = RawData("raw", scale=scale)
    orders = _rows(raw, "orders")
    first_versions = [row for row in orders if row[2] == "placed"]
    assert len({row[0] for row in first_versions}) == len(first_versions)
    payments = _rows(RawData("raw", scale=scale), "payments")
    assert len({row[0] for row in payments}) == len(payments)
    # Every key's updated_at is strictly increasing, so the dedupe and SCD2
    # windows never tie.
    for name, key, stamp in (("orders", 0, 4), ("customers", 0, 5), ("products", 0, 4)):
        seen: dict[int, datetime] = {}
        for row in _rows(RawData("raw", scale=scale), name):
            assert row[key] not in seen or seen[row[key]] < row[stamp], (name, row)
            seen[row[key]] = row[stamp]


@pytest.mark.parametrize("scale", [1, 2])
def test_some_lines_name_a_product_that_does_not_exist(scale):
    raw = RawData("raw", scale=scale)
    items = _rows(raw, "order_items")
    products = {row[0] for row in _rows(RawData("raw", scale=scale), "products")}
    missing = [row for row in items if row[2] not in products]
    assert missing and all(row[2] == 999 * scale for row in missing)


def test_scale_one_is_the_tests_data():
    # The extended warehouse test and the committed report ran this data: every
    # statement of the create, the first load and three batches, as SQL, hashed
    # as they were before the scale option (commit 0e95989's raw_data.py).
    raw = RawData("raw")
    statements = [*raw.create_statements(), *raw.first_load()]
    for number in range(1, BATCHES + 1):
        statements += raw.batch(number)
    text = "\n".join(s if isinstance(s, str) else s.statement() for s in statements)
    assert hashlib.sha256(text.encode()).hexdigest() == SCALE_ONE_SHA256


def test_csv_fields_read_back_as_the_sql_literals_say():
    row = (7, " padded ", None, True, datetime(2026, 1, 2, 3, 4, 5), 12.5)
    buffer = io.StringIO()
    csv.writer(buffer).writerow([csv_field(v) for v in row])
    # Spark's CSV reader: an empty field is NULL, spaces are kept, booleans and
    # timestamps (with the driver's timestampFormat) parse as written.
    assert buffer.getvalue() == "7, padded ,,true,2026-01-02 03:04:05,12.5\r\n"
