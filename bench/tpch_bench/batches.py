"""Change batches applied to the Delta sources between refreshes.

Kinds (``size`` is a percentage of the changed table's rows):

- ``rf``: the TPC-H refresh functions. RF1 inserts new orders with their
  lineitems, RF2 deletes as many existing orders with theirs. One part of
  tpchgen-cli's ``--parts 1000`` is one refresh function's batch (SF * 1,500 orders,
  0.1 % of lineitem), so a batch of ``size`` % uses ``size * 10`` parts for each.
- ``lineitem_updates``: ``size`` % of lineitem rows get a new discount and ship
  date, chosen to cross the queries' filters both ways (Q6's discount band, Q1's
  ship-date cutoff, Q3/Q6/Q12/Q14's date ranges).
- ``customer_updates``: ``size`` % of customers switch market segment, into or out
  of Q3's 'BUILDING'.
- ``mixed``: all of the above in one batch (the smoke test's batch: it exercises
  inserts, deletes and updates of three sources at once).

TPC-H has no updates; the spec's RF1 draws new order keys from the unused slots
of its sparse key space. tpchgen-cli's order keys use residues 0-7 modulo 32,
so RF1 inserts copies of a part's rows with their keys shifted by 8: new orders,
same value distributions.

RF1 copies parts from the bottom (1, 2, ...) and RF2 deletes parts from the top
(1000, 999, ...), so no batch deletes the very rows whose copies it inserts.
That matters: a batch inserting copies of the rows it deletes would leave every
aggregate that ignores the order key (Q1, Q6, Q14, the MIN/MAX and DISTINCT
models) unchanged, and a refresh that lost the batch would still look right.
Each batch draws fresh parts and a fresh hash salt, so no batch repeats an
earlier one's rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tpch_bench import sql_names
from tpch_bench.generate import PART_COUNT, GeneratedData

if TYPE_CHECKING:
    from tpch_bench.settings import BenchSettings

# Residues 0-7 modulo 32 hold tpchgen-cli's order keys; 8-15 are free. Each part
# is copied at most once (see BatchPlanner), so one shift is enough.
ORDER_KEY_SHIFT = 8
# Updates pick rows by a hash of their key below a threshold out of this many.
HASH_BUCKETS = 1_000_000
RF2_KEYS_VIEW = "tpch_bench_rf2_keys"

BATCH_TABLES = {
    "rf": ("orders", "lineitem"),
    "lineitem_updates": ("lineitem",),
    "customer_updates": ("customer",),
    "mixed": ("orders", "lineitem", "customer"),
}


@dataclass(frozen=True)
class ChangeBatch:
    """One batch to apply: which parts to insert and delete, and the updates' salt."""

    kind: str
    size: float
    sequence: int
    repetition: int = 0
    insert_parts: tuple[int, ...] = ()
    insert_key_shift: int = 0
    delete_parts: tuple[int, ...] = ()
    update_salt: int = 0

    @property
    def update_threshold(self) -> int:
        return round(self.size / 100 * HASH_BUCKETS)


@dataclass
class AppliedBatch:
    kind: str
    size: float
    sequence: int
    seconds: float
    # Per table: source versions before and after the batch, and its change rows
    # by Delta change type (insert, delete, update_preimage, update_postimage).
    versions: dict[str, list[int]] = field(default_factory=dict)
    changes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def changed_rows(self) -> int:
        """Rows inserted, deleted or updated (an update counted once), all tables."""
        return sum(
            count
            for by_type in self.changes.values()
            for change_type, count in by_type.items()
            if change_type != "update_preimage"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "kind": self.kind,
            "size": self.size,
            "seconds": round(self.seconds, 3),
            "changed_rows": self.changed_rows,
            "versions": self.versions,
            "changes": self.changes,
        }


class BatchPlanner:
    """Hands out batches whose rows never collide with earlier batches' of the same run.

    RF batches use ``size * 10`` parts each for inserts and for deletes: inserts
    from the bottom of the 1,000 parts, deletes from the top, so the two never
    share a part while the run's RF batches use at most 500 parts in all (the
    defaults use 333).
    """

    def __init__(self) -> None:
        self._sequence = 0
        self._parts_used = 0  # by inserts, and as many by deletes

    def next_batch(self, kind: str, size: float, repetition: int = 0) -> ChangeBatch:
        if kind not in BATCH_TABLES:
            raise ValueError(f"unknown batch kind {kind!r}; known: {', '.join(BATCH_TABLES)}")
        self._sequence += 1
        inserts: tuple[int, ...] = ()
        deletes: tuple[int, ...] = ()
        if kind in ("rf", "mixed"):
            count = max(1, round(size / 100 * PART_COUNT))
            used = self._parts_used
            if 2 * (used + count) > PART_COUNT:
                raise ValueError(
                    f"the run's RF batches need {2 * (used + count)} of the {PART_COUNT} "
                    "parts (inserts and deletes draw different parts): use fewer or smaller "
                    "batches"
                )
            inserts = tuple(range(used + 1, used + count + 1))
            deletes = tuple(range(PART_COUNT - used, PART_COUNT - used - count, -1))
            self._parts_used += count
        return ChangeBatch(
            kind=kind,
            size=size,
            sequence=self._sequence,
            repetition=repetition,
            insert_parts=inserts,
            insert_key_shift=ORDER_KEY_SHIFT if inserts else 0,
            delete_parts=deletes,
            update_salt=self._sequence,
        )


@dataclass(frozen=True)
class RunPlan:
    """Every batch one scale factor of a run applies, drawn from one planner."""

    batches: list[ChangeBatch]
    group_overhead: list[tuple[ChangeBatch, ChangeBatch]]


def plan_run(settings: BenchSettings) -> RunPlan:
    """The run's batches, then the group-overhead phase's; raises if they do not fit."""
    planner = BatchPlanner()
    batches = plan_batches(
        settings.batch_kinds, settings.change_sizes, settings.repetitions, planner
    )
    overhead = (
        plan_group_overhead(planner, settings.group_overhead_size, settings.group_overhead_pairs)
        if settings.group_overhead_pairs
        else []
    )
    return RunPlan(batches=batches, group_overhead=overhead)


def plan_batches(
    kinds: tuple[str, ...],
    sizes: tuple[float, ...],
    repetitions: int,
    planner: BatchPlanner | None = None,
) -> list[ChangeBatch]:
    """Every batch of a run, in order; raises before anything runs if they do not fit.

    Kind by kind, size by size, ``repetitions`` fresh batches each. Pass the run's
    ``planner`` to draw more batches after these (the group-overhead phase's).
    """
    planner = planner or BatchPlanner()
    return [
        planner.next_batch(kind, size, repetition)
        for kind in kinds
        for size in sizes
        for repetition in range(repetitions)
    ]


def plan_group_overhead(
    planner: BatchPlanner, size: float, pairs: int
) -> list[tuple[ChangeBatch, ChangeBatch]]:
    """The group-overhead phase's ``rf`` batches: per pair, one for each mode's run.

    Drawn from the run's planner after its other batches, so they touch parts no
    other batch of the run touched and every measurement refreshes a change.
    """
    return [
        (planner.next_batch("rf", size, pair), planner.next_batch("rf", size, pair))
        for pair in range(pairs)
    ]


def apply_batch(
    spark: SparkSession, data: GeneratedData, schema: str, batch: ChangeBatch
) -> AppliedBatch:
    tables = BATCH_TABLES[batch.kind]
    before = {name: latest_version(spark, schema, name) for name in tables}
    started = time.monotonic()
    if batch.insert_parts:
        _refresh_function_1(spark, data, schema, batch)
    if batch.delete_parts:
        _refresh_function_2(spark, data, schema, batch)
    if batch.kind in ("lineitem_updates", "mixed"):
        _update_lineitems(spark, schema, batch)
    if batch.kind in ("customer_updates", "mixed"):
        _update_customers(spark, schema, batch)
    seconds = time.monotonic() - started
    applied = AppliedBatch(
        kind=batch.kind, size=batch.size, sequence=batch.sequence, seconds=seconds
    )
    for name in tables:
        after = latest_version(spark, schema, name)
        applied.versions[name] = [before[name], after]
        applied.changes[name] = change_counts(spark, schema, name, before[name], after)
    return applied


def _refresh_function_1(
    spark: SparkSession, data: GeneratedData, schema: str, batch: ChangeBatch
) -> None:
    """RF1: the parts' orders, then their lineitems, under keys in unused slots."""
    for name, key in (("orders", "o_orderkey"), ("lineitem", "l_orderkey")):
        files = [str(data.part_file(name, part)) for part in batch.insert_parts]
        rows = spark.read.parquet(*files).withColumn(key, F.col(key) + batch.insert_key_shift)
        # writeTo(...).append() matches columns by name, and is one Delta commit.
        rows.writeTo(sql_names.table(schema, name)).append()


def _refresh_function_2(
    spark: SparkSession, data: GeneratedData, schema: str, batch: ChangeBatch
) -> None:
    """RF2: the parts' original orders deleted, their lineitems first (as the spec does)."""
    files = [str(data.part_file("orders", part)) for part in batch.delete_parts]
    spark.read.parquet(*files).select("o_orderkey").distinct().createOrReplaceTempView(
        RF2_KEYS_VIEW
    )
    try:
        for name, key in (("lineitem", "l_orderkey"), ("orders", "o_orderkey")):
            # MERGE ... DELETE rather than DELETE ... IN (subquery): a join, one commit.
            spark.sql(
                f"MERGE INTO {sql_names.table(schema, name)} AS target "
                f"USING {RF2_KEYS_VIEW} AS doomed ON target.{key} = doomed.o_orderkey "
                "WHEN MATCHED THEN DELETE"
            )
    finally:
        spark.catalog.dropTempView(RF2_KEYS_VIEW)


def _update_lineitems(spark: SparkSession, schema: str, batch: ChangeBatch) -> None:
    """New discount and ship date for ``size`` % of lineitems, crossing the queries' filters.

    A discount inside Q6's band [0.05, 0.07] moves out of it (+0.03, at most 0.10 as
    in TPC-H) and any other moves in (0.06). Ship dates move 100 days forward or back
    (by line number parity), across Q1's cutoff and the date ranges of Q3, Q6, Q12, Q14.
    """
    spark.sql(
        f"UPDATE {sql_names.table(schema, 'lineitem')} SET "
        "l_discount = CAST(CASE WHEN l_discount BETWEEN 0.05 AND 0.07 THEN l_discount + 0.03 "
        "ELSE 0.06 END AS DECIMAL(15, 2)), "
        "l_shipdate = date_add(l_shipdate, CASE WHEN l_linenumber % 2 = 0 THEN 100 ELSE -100 END) "
        f"WHERE pmod(xxhash64(l_orderkey, l_linenumber, {batch.update_salt}), {HASH_BUCKETS}) "
        f"< {batch.update_threshold}"
    )


def _update_customers(spark: SparkSession, schema: str, batch: ChangeBatch) -> None:
    """``size`` % of customers switch segment: into Q3's 'BUILDING', or out of it."""
    spark.sql(
        f"UPDATE {sql_names.table(schema, 'customer')} SET "
        "c_mktsegment = CASE WHEN c_mktsegment = 'BUILDING' THEN 'AUTOMOBILE' ELSE 'BUILDING' END "
        f"WHERE pmod(xxhash64(c_custkey, {batch.update_salt}), {HASH_BUCKETS}) "
        f"< {batch.update_threshold}"
    )


def latest_version(spark: SparkSession, schema: str, name: str) -> int:
    history = spark.sql(f"DESCRIBE HISTORY {sql_names.table(schema, name)} LIMIT 1").collect()
    return int(history[0]["version"])


def change_counts(
    spark: SparkSession, schema: str, name: str, before: int, after: int
) -> dict[str, int]:
    """Change rows between two versions, by change type (what an ivm refresh reads)."""
    if after <= before:
        return {}
    rows = spark.sql(
        "SELECT _change_type, count(*) AS n FROM table_changes("
        f"'{sql_names.table(schema, name)}', {before + 1}, {after}) GROUP BY _change_type"
    ).collect()
    return {str(row["_change_type"]): int(row["n"]) for row in rows}
