"""The warehouse's raw sources: their tables, a first load and change batches.

Deterministic (one seeded Random), so a run is repeatable; `scale` multiplies
every count of rows generated (the first load's and, unless `batch_scale`
says otherwise, each batch's), so the same warehouse can be measured where
rebuilding it takes minutes. `batch_scale` sizes the batches on their own: a
warehouse of years of data loads a day's changes, a small share of each table,
where batches at the data's scale change a few percent of every table. The batches are
what operational systems send a warehouse: new versions of customers,
products and orders appended (each key's `updated_at` strictly increasing,
so the dedupe and SCD2 windows never tie), new orders with their lines and
payments, lines corrected and removed in place, refunds flagged, bad records
and GDPR-erased customers deleted, reference data edited. Every statement is
one Delta commit, so a refresh reads many commits per source.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

TABLES = {
    "customers": (
        "customer_id INT, full_name STRING, email STRING, country_code STRING, "
        "segment STRING, updated_at TIMESTAMP"
    ),
    "products": (
        "product_id INT, product_name STRING, category STRING, list_price DECIMAL(10,2), "
        "updated_at TIMESTAMP"
    ),
    "orders": "order_id INT, customer_id INT, status STRING, order_ts TIMESTAMP, updated_at TIMESTAMP",
    "order_items": (
        "order_id INT, line_no INT, product_id INT, quantity INT, unit_price DECIMAL(10,2), "
        "discount DECIMAL(4,2)"
    ),
    "payments": (
        "payment_id INT, order_id INT, method STRING, amount DECIMAL(12,2), paid_at TIMESTAMP, "
        "is_refund BOOLEAN"
    ),
    "countries": "country_code STRING, country_name STRING, region STRING",
}

COUNTRIES = [
    ("de", "Germany", "EMEA"),
    ("fr", "France", "EMEA"),
    ("us", "United States", "AMER"),
    ("ca", "Canada", "AMER"),
    ("br", "Brazil", "AMER"),
    ("jp", "Japan", "APAC"),
    ("in", "India", "APAC"),
]
# Customers may live where the reference data has no row yet ("xx" arrives in
# batch 1), so the customer dimension's LEFT JOIN pads.
CUSTOMER_COUNTRIES = [code for code, _, _ in COUNTRIES] + ["xx", "au"]
SEGMENTS = ["retail", "smb", "enterprise", None]
CATEGORIES = ["Books", "games", "Garden", "kitchen", "toys"]
METHODS = ["card", "PayPal", "invoice"]
STATUS_FLOW = ["placed", "shipped", "delivered"]

START = datetime(2026, 1, 1)


def csv_field(value: object) -> str:
    """A generated value as Spark's CSV reader takes it back (an empty field is NULL)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return f"{value:%Y-%m-%d %H:%M:%S}"
    return str(value)


def literal(value: object) -> str:
    """A Spark SQL literal for a generated value (all generated here, none user input)."""
    if value is None:
        return "NULL"
    if isinstance(value, datetime):
        return f"TIMESTAMP'{csv_field(value)}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return csv_field(value)


def insert(table: str, rows: list[tuple]) -> str:
    values = ", ".join("(" + ", ".join(literal(v) for v in row) + ")" for row in rows)
    return f"INSERT INTO {table} VALUES {values}"


@dataclass(frozen=True)
class Insert:
    """Generated rows appended to one raw table: one Delta commit.

    `statement()` is its SQL. The driver loads a large one from a CSV file
    instead: at a large `scale`, SQL text of a million literal rows is more
    than Spark's parser takes in good time.
    """

    schema: str
    name: str  # the raw table, a key of TABLES
    rows: list[tuple]

    @property
    def table(self) -> str:
        return f"{self.schema}.{self.name}"

    def statement(self) -> str:
        return insert(self.table, self.rows)


@dataclass
class RawData:
    """The raw tables' contents as the generator knows them, and its clock."""

    schema: str
    # Multiplies every generated count; 1 is the size the tests and the
    # committed report use.
    scale: int = 1
    # Multiplies every count of a batch's rows (the rows appended, and the rows
    # an in-place update or delete touches); None: `scale`. It must divide
    # `scale`.
    batch_scale: int | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(2026))
    clock: datetime = START
    customers: int = 0
    products: int = 0
    orders: int = 0
    payments: int = 0
    # order id -> index of its latest status in STATUS_FLOW (or -1: cancelled)
    order_status: dict[int, int] = field(default_factory=dict)
    # order id -> (customer id, order time): every new version repeats them
    order_header: dict[int, tuple[int | None, datetime]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_rows_scale < 1 or self.scale % self.batch_rows_scale:
            raise ValueError(
                f"batch_scale {self.batch_scale} must be a positive divisor of scale {self.scale}"
            )

    @property
    def batch_rows_scale(self) -> int:
        return self.scale if self.batch_scale is None else self.batch_scale

    def table(self, name: str) -> str:
        return f"{self.schema}.{name}"

    def _every(self, modulus: int) -> int:
        """The modulus that picks one row in `modulus` at batch scale.

        An in-place update or delete picks its rows by `key % m = batch number`:
        one row in m of the table at the data's scale. With smaller batches, m
        grows by scale / batch_scale, so it touches as many rows as it would on
        a table of batch_scale's size.
        """
        return modulus * (self.scale // self.batch_rows_scale)

    def tick(self) -> datetime:
        """A timestamp later than every one handed out before."""
        self.clock += timedelta(seconds=self.rng.randint(1, 600))
        return self.clock

    def create_statements(self) -> Iterator[str]:
        yield f"CREATE DATABASE IF NOT EXISTS {self.schema}"
        for name, columns in TABLES.items():
            yield f"DROP TABLE IF EXISTS {self.table(name)}"
            yield (
                f"CREATE TABLE {self.table(name)} ({columns}) USING DELTA "
                "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )

    def first_load(self) -> Iterator[str | Insert]:
        yield self._insert("countries", [(c.upper(), n, r) for c, n, r in COUNTRIES])
        yield self._insert(
            "customers",
            [self._customer_version(self._new_id("customers")) for _ in range(300 * self.scale)],
        )
        yield self._insert(
            "products",
            [self._product_version(self._new_id("products")) for _ in range(60 * self.scale)],
        )
        yield from self._new_orders(1200 * self.scale, pay_share=0.8)
        yield self._status_changes(900 * self.scale)

    def batch(self, number: int) -> Iterator[str | Insert]:
        """Batch `number` (1, 2, ...): about 15 commits over all six sources."""
        rng, scale = self.rng, self.batch_rows_scale
        customers = self.table("customers")
        # New versions (segment or country moves) and new customers.
        moved = rng.sample(range(1, self.customers + 1), 25 * scale)
        yield self._insert("customers", [self._customer_version(c) for c in moved])
        yield self._insert(
            "customers",
            [self._customer_version(self._new_id("customers")) for _ in range(5 * scale)],
        )
        # An in-place correction that bronze normalises away (no change downstream).
        yield f"UPDATE {customers} SET email = upper(email) WHERE customer_id % {self._every(17)} = {number}"
        # GDPR erasure: every version of two customers (per unit of scale).
        erased = rng.sample(range(1, self.customers + 1), 2 * scale)
        yield f"DELETE FROM {customers} WHERE customer_id IN ({', '.join(map(str, erased))})"
        # Price changes and a new product.
        repriced = rng.sample(range(1, self.products + 1), 4 * scale)
        yield self._insert("products", [self._product_version(p) for p in repriced])
        yield self._insert(
            "products",
            [self._product_version(self._new_id("products")) for _ in range(scale)],
        )
        # New orders with lines and payments, status progress, erroneous orders removed.
        yield from self._new_orders(60 * scale, pay_share=0.5)
        yield self._status_changes(80 * scale)
        wrong = rng.sample(sorted(self.order_status), 3 * scale)
        yield f"DELETE FROM {self.table('orders')} WHERE order_id IN ({', '.join(map(str, wrong))})"
        for order_id in wrong:
            self.order_status.pop(order_id)
        # Lines corrected and removed in place; refunds flagged; bad payments deleted.
        items = self.table("order_items")
        line = "(order_id * 7 + line_no)"
        yield f"UPDATE {items} SET quantity = quantity + 1 WHERE {line} % {self._every(50)} = {number}"
        yield f"UPDATE {items} SET discount = NULL WHERE order_id % {self._every(61)} = {number}"
        yield f"DELETE FROM {items} WHERE order_id % {self._every(97)} = {number}"
        payments = self.table("payments")
        yield f"UPDATE {payments} SET is_refund = true WHERE payment_id % {self._every(41)} = {number}"
        yield f"DELETE FROM {payments} WHERE payment_id % {self._every(53)} = {number}"
        # Reference data: a new country, a region renamed, a country removed.
        countries = self.table("countries")
        if number == 1:
            yield self._insert("countries", [("XX", "Elsewhere", "OTHER")])
        elif number == 2:
            yield f"UPDATE {countries} SET region = 'EUROPE' WHERE region = 'EMEA'"
        else:
            yield f"DELETE FROM {countries} WHERE country_code = 'BR'"

    def _insert(self, name: str, rows: list[tuple]) -> Insert:
        return Insert(self.schema, name, rows)

    def _new_id(self, kind: str) -> int:
        setattr(self, kind, getattr(self, kind) + 1)
        return getattr(self, kind)

    def _customer_version(self, customer_id: int) -> tuple:
        rng = self.rng
        name = f" Customer {customer_id} "
        email = f"Customer.{customer_id}@Example.com"
        return (
            customer_id,
            name,
            email,
            rng.choice(CUSTOMER_COUNTRIES),
            rng.choice(SEGMENTS),
            self.tick(),
        )

    def _product_version(self, product_id: int) -> tuple:
        rng = self.rng
        price = rng.randint(300, 25000) / 100
        return (product_id, f"Product {product_id}", rng.choice(CATEGORIES), price, self.tick())

    def _new_orders(self, count: int, pay_share: float) -> Iterator[Insert]:
        rng = self.rng
        orders, items, payments = [], [], []
        # No product id reaches 999 per unit of scale: lines naming it name a
        # product that does not exist.
        missing = 999 * self.scale
        for _ in range(count):
            order_id = self._new_id("orders")
            # Some orders arrive without a customer (a guest checkout): joins drop them.
            customer = None if rng.random() < 0.03 else rng.randint(1, self.customers)
            placed = self.tick()
            orders.append((order_id, customer, "placed", placed, placed))
            self.order_status[order_id] = 0
            self.order_header[order_id] = (customer, placed)
            for line_no in range(1, rng.randint(1, 4) + 1):
                # A few lines name a product that does not exist, or have no quantity.
                product = missing if rng.random() < 0.02 else rng.randint(1, self.products)
                quantity = 0 if rng.random() < 0.03 else rng.randint(1, 5)
                discount = None if rng.random() < 0.6 else rng.choice([0.05, 0.1, 0.25])
                items.append(
                    (order_id, line_no, product, quantity, rng.randint(200, 20000) / 100, discount)
                )
            if rng.random() < pay_share:
                payment = self._new_id("payments")
                refund = rng.random() < 0.05
                amount = rng.randint(500, 60000) / 100
                payments.append(
                    (payment, order_id, rng.choice(METHODS), amount, self.tick(), refund)
                )
        yield self._insert("orders", orders)
        yield self._insert("order_items", items)
        if payments:
            yield self._insert("payments", payments)

    def _status_changes(self, count: int) -> Insert:
        """New status versions for `count` open orders (some cancelled)."""
        rng = self.rng
        open_orders = [o for o, s in self.order_status.items() if 0 <= s < len(STATUS_FLOW) - 1]
        rows = []
        for order_id in rng.sample(open_orders, min(count, len(open_orders))):
            if rng.random() < 0.08:
                self.order_status[order_id] = -1
                status = "cancelled"
            else:
                self.order_status[order_id] += 1
                status = STATUS_FLOW[self.order_status[order_id]]
            # A version repeats the order's header; only status and updated_at move.
            customer, placed = self.order_header[order_id]
            rows.append((order_id, customer, status, placed, self.tick()))
        return self._insert("orders", rows)
