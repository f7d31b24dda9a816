"""How a state computed whole hands its change on to the ivm models that read it.

A recompute (ivm_strategy), a rebuild written in place (recipe.py: the
state keeps its meaning) and an ivm_fallback table all compute a model's
rows whole. Its readers go on incrementally only if they can read what
changed, and there are two ways to write so that they can:

- MERGE: the new rows merged into the old by key (for a fallback table, by
  whole row), so only the rows that differ are written. The difference is
  computed once, by the writer; its change feed holds just those rows and
  the commit's metrics count them, and every reader reads them as it reads
  any change. It costs a join of the new rows with the state.
- OVERWRITE: an INSERT OVERWRITE, the cheapest write. Its change feed is
  every old row deleted and every new row inserted; the commit records the
  change that made the model recompute, which readers take as their
  change's size. A reader that would recompute anyway reads nothing of it;
  one that applies it first sums the overwrite per row
  (reads.stage_net_change), each reader on its own.

`choose` weighs the MERGE's extra cost against what the readers would spend
on an overwrite (summing it, or recomputing where the exact change would
have been cheaper to apply), from the writer's and the readers' refresh
histories (strategy.py), and says why, with the estimates, in the refresh's
result. Pure: every branch is unit-tested without Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dbt.adapters.spark_ivm.refresh import strategy

MERGE = "merge"
OVERWRITE = "overwrite"

# A MERGE of the recomputed rows by key against an INSERT OVERWRITE of the
# same rows, both rewriting every file: 8.5 s against 3.3 s for the order
# lines' 600,000-row state at 200 times the layered warehouse's data
# (2026-12-01, docs/how-a-refresh-works.md).
MERGE_OVER_OVERWRITE = 2.5
# A reader summing an overwrite per row against the overwrite itself: the
# same 1.2 M change rows of that state summed in 6.4-10.3 s (refresh/writes.py,
# staged_net_changes) against its 3.3 s overwrite.
SUM_OVER_OVERWRITE = 2.5
# A change under this many rows is merged: every reader applies it, as
# strategy.py applies any change under its recompute threshold.
MERGED_CHANGE_ROWS = strategy.MIN_RECOMPUTE_ROWS


@dataclass(frozen=True)
class Reader:
    """An ivm model reading the state, with its refresh history (strategy.py)."""

    name: str
    history: Sequence[strategy.RefreshRecord] = ()


@dataclass(frozen=True)
class HandOff:
    """How the state's rows are written, and why (the refresh's result says it)."""

    way: str  # MERGE or OVERWRITE
    reason: str
    # The MERGE's estimated extra seconds over an overwrite, and what the
    # readers would spend on an overwrite that they save with a MERGE.
    merge_extra_seconds: float | None = None
    readers_seconds: float | None = None

    @property
    def merges(self) -> bool:
        return self.way == MERGE

    def describe(self) -> str:
        """The phrase the refresh's message carries."""
        way = "as the rows that differ (a MERGE)" if self.merges else "as an overwrite"
        return f"its change handed on {way}: {self.reason}"


def write_seconds(history: Sequence[strategy.RefreshRecord], source_bytes: int) -> float | None:
    """The writer's recompute, estimated from its past builds and recomputes (None: none yet).

    >>> write_seconds([strategy.RefreshRecord("recompute", 0, 1000, 2.0)], 3000)
    6.0
    >>> write_seconds([strategy.RefreshRecord("build", 0, 1000, 2.0)], 3000)
    6.0
    """
    # The state computed whole, as a build computes it too: what an overwrite costs.
    seconds_per_byte = strategy.rate(history, strategy.RECOMPUTE, strategy.BUILD)
    if seconds_per_byte is None or source_bytes <= 0:
        return None
    return seconds_per_byte * source_bytes


def reader_saving(reader: Reader, change_rows: int | None, sum_seconds: float) -> tuple[float, str]:
    """What a reader spends on an overwrite beyond what it spends on the merged difference.

    Given the exact change it applies it, at its incremental estimate I, or
    recomputes, at R, whichever is cheaper; given an overwrite it recomputes,
    or sums the overwrite (`sum_seconds`) and applies: so it saves
    min(R, sum + I) - min(R, I). A reader with no history (built in this run,
    or never recomputed) is taken to apply the change, saving the sum.
    """
    last = next((r for r in reversed(reader.history) if r.source_bytes > 0), None)
    if last is None:
        return sum_seconds, "no history"
    rows = change_rows if change_rows is not None else 0
    found = strategy.estimate(
        reader.history, strategy.ChangeSize(rows=rows, source_bytes=last.source_bytes)
    )
    if found is None:
        return sum_seconds, "never recomputed"
    incremental, recompute = found.incremental_seconds, found.recompute_seconds
    saving = min(recompute, sum_seconds + incremental) - min(recompute, incremental)
    return max(0.0, saving), f"{incremental:.1f}s incremental, {recompute:.1f}s recompute"


def choose(
    readers: Sequence[str],
    histories: Callable[[], Sequence[Reader]],
    change_rows: int | None,
    write: float | None,
    *,
    log_state: bool = False,
    guard: str | None = "guard",
    source_bytes: int | None = None,
    deletion_vectors: bool = False,
) -> HandOff:
    """MERGE or OVERWRITE for a state computed whole; see the module docstring.

    `readers`: the ivm models reading the state; `histories`: them with their
    refresh histories, read only where those decide (a SHOW TBLPROPERTIES
    each); `change_rows`: the change that made the model recompute (None: a
    rebuild or a fallback, whose change is not known before it is
    computed); `write`: the writer's recompute, estimated (write_seconds);
    `guard`: what the state's guard row holds, which a MERGE by key checks
    (None: the state cannot be merged into); `source_bytes`: the writer's
    sources, under strategy.MIN_WEIGHED_BYTES too small to weigh;
    `deletion_vectors`: the rows that differ are known (a fallback table's
    staged difference) and the table has deletion vectors, so a MERGE
    writes those rows alone (DIFFERENCE_WITH_VECTORS).

    >>> choose([], lambda: [], 50, 3.0).way
    'overwrite'
    >>> choose(["m.r"], lambda: [], 50, 3.0).reason
    'a change under 10,000 rows, which every reader applies'
    """
    if not readers:
        return HandOff(OVERWRITE, "no ivm model reads it")
    if log_state:
        return HandOff(OVERWRITE, "a log has no key to merge by; its readers sum the overwrite")
    if guard is None:
        return HandOff(OVERWRITE, "the state's guard row is not known, so a MERGE cannot check it")
    if change_rows is not None and change_rows < MERGED_CHANGE_ROWS:
        return HandOff(
            MERGE, f"a change under {MERGED_CHANGE_ROWS:,} rows, which every reader applies"
        )
    if deletion_vectors and change_rows is not None:
        return HandOff(
            MERGE,
            f"{change_rows:,} changed rows into a table with deletion vectors: the MERGE marks "
            "the old copies deleted and appends the new, where an overwrite writes every row "
            "and each reader sums it",
        )
    if source_bytes is not None and source_bytes < strategy.MIN_WEIGHED_BYTES:
        return HandOff(
            MERGE,
            f"sources under {strategy.MIN_WEIGHED_BYTES:,} bytes, where every way costs about "
            "its floor: the difference computed once, for every reader",
        )
    if write is None:
        if change_rows is None:
            return HandOff(
                MERGE,
                "its change is not known before it is computed, and no history says what a "
                "MERGE costs: computed once, for every reader",
            )
        return HandOff(
            OVERWRITE,
            f"{change_rows:,} changed rows, and no history says what a MERGE costs "
            "(its readers size the change by them)",
        )
    extra = (MERGE_OVER_OVERWRITE - 1) * write
    summed = SUM_OVER_OVERWRITE * write
    found = histories()
    savings = [reader_saving(r, change_rows, summed) for r in found]
    saved = sum(s for s, _ in savings)
    counted = f"{len(found)} reader{'s' if len(found) != 1 else ''}"
    estimates = (
        f"a MERGE estimated {extra:.1f}s more than an overwrite, against {saved:.1f}s "
        f"its {counted} would spend summing an overwrite or recomputing"
    )
    if change_rows is not None:
        estimates = f"{change_rows:,} changed rows: {estimates}"
    way = MERGE if saved > extra else OVERWRITE
    return HandOff(way, estimates, merge_extra_seconds=extra, readers_seconds=saved)
