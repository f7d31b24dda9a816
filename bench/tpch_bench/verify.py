"""The correctness guard: an ivm model must equal its table twin, or its timing means nothing.

Both models run the same query macro over the same source versions (the guard
runs after both were refreshed for a batch), so they must be equal as bags:
every distinct row the same number of times on both sides, NULLs included.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tpch_bench import sql_names


@dataclass(frozen=True)
class Comparison:
    ivm_rows: int
    table_rows: int
    # Rows of the table model the ivm model lacks, and rows the ivm model has in excess.
    missing_from_ivm: int
    extra_in_ivm: int

    @property
    def equal(self) -> bool:
        return self.missing_from_ivm == 0 and self.extra_in_ivm == 0


def compare(spark: SparkSession, schema: str, ivm_model: str, table_model: str) -> Comparison:
    """Bag comparison in one aggregation: each distinct row with its count on either side.

    Equivalent to ``EXCEPT ALL`` both ways (grouping matches NULLs with NULLs as
    set operations do) but one shuffle instead of four queries, which matters when
    the guard runs after every batch for every model.
    """
    ivm = spark.table(sql_names.table(schema, ivm_model))
    table = spark.table(sql_names.table(schema, table_model))
    columns = table.columns
    side = "bench_side"
    both = ivm.select(*columns, F.lit(1).alias(side)).unionByName(
        table.select(*columns, F.lit(0).alias(side))
    )
    per_row = both.groupBy(*columns).agg(
        F.sum(F.col(side)).alias("in_ivm"), F.sum(1 - F.col(side)).alias("in_table")
    )
    totals = per_row.agg(
        F.sum("in_ivm").alias("ivm_rows"),
        F.sum("in_table").alias("table_rows"),
        F.sum(F.greatest(F.col("in_table") - F.col("in_ivm"), F.lit(0))).alias("missing"),
        F.sum(F.greatest(F.col("in_ivm") - F.col("in_table"), F.lit(0))).alias("extra"),
    ).collect()[0]
    return Comparison(
        ivm_rows=int(totals["ivm_rows"] or 0),
        table_rows=int(totals["table_rows"] or 0),
        missing_from_ivm=int(totals["missing"] or 0),
        extra_in_ivm=int(totals["extra"] or 0),
    )
