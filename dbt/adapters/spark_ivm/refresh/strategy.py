"""ivm_strategy: apply the change, or recompute the state, whichever is estimated cheaper.

An incremental refresh costs a floor (planning, the MERGE's fixed work) plus
an amount that grows with the change; recomputing costs about the same per
source byte every time. So for each refresh with changes, `auto` estimates
both from the model's own history of refreshes:

- recompute: seconds per source byte of its past recomputes, times the
  sources' size now; before any, of its builds, times HANDOFF_FACTOR where
  ivm models read it (a recompute also hands them its change; a build does
  not);
- incremental: a line through its past incremental refreshes' (changed rows,
  seconds); while their sizes lie within a factor of two of each other (too
  close for a slope), the cheapest refresh of a change at least as large,
  or past the largest seen, its seconds plus a default cost per row beyond
  it (below).

A change under MIN_RECOMPUTE_ROWS is applied (its estimates are noise),
unless the model's cheapest incremental refresh seen took FLOOR_MARGIN
times the recompute estimate and no ivm model reads it: then its floor, not
its change, is the cost.

The change's size is the number of change-feed rows the window holds, read
from the sources' commit metrics (DESCRIBE HISTORY's operationMetrics): no
data is read to estimate it. Each refresh appends (way, changed rows, source
bytes, seconds) to the history, which the model's view carries as a property,
so the estimate corrects itself as the model runs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dbt.adapters.spark_ivm.delta.confs import SMALL_SOURCE_BYTES
from dbt.adapters.spark_ivm.settings import Strategy

AUTO, INCREMENTAL, RECOMPUTE = Strategy.AUTO, Strategy.INCREMENTAL, Strategy.RECOMPUTE
# A refresh history's way for a first build or a rebuild: the state computed
# whole, as a recompute computes it, but with no change to hand on.
BUILD = "build"
STRATEGIES = tuple(Strategy)

HISTORY_PROPERTY = "spark_ivm.refresh_history"
# Enough points for a line through recent refreshes; old ones stop counting,
# so the estimate follows the data as it grows.
HISTORY_LENGTH = 12

# Before a model has a history of incremental refreshes: an incremental refresh
# costs as much per changed row as recomputing costs for this many rows of
# source. TPC-H refreshes on this machine (bench/, SF 1) read about 10 bytes of
# state and sources per byte of change for aggregates and far more for joins, so
# 10 makes `auto` recompute once the change reaches about a tenth of the
# sources, and the history takes over after two refreshes.
DEFAULT_ROW_COST_FACTOR = 10.0
# Below this many changed rows an incremental refresh runs at its floor on
# this machine (bench/: the 0.1 % TPC-H batches at SF 1, 15k change rows, cost
# about what a no-op MERGE does), and on small tables fixed costs make both
# ways' estimates noise: such changes are applied, unless the floor itself
# is known to be dearer (FLOOR_MARGIN).
MIN_RECOMPUTE_ROWS = 10_000
# A change under MIN_RECOMPUTE_ROWS is recomputed where the model's own
# cheapest incremental refresh took this many times the recompute estimate
# (sources past FLOOR_WEIGHED_BYTES): its fixed work, not the change, is
# then what a refresh costs. The worked example at 2 M order lines
# (2026-12-05): customers_to_chase refreshed 5,000 changed lines in 5.4-6.2 s
# and was built in 2.3-2.6 s, every run. A margin, not 1: the seconds come
# from different runs, and one refresh seen dearer by a tenth is within
# their spread. Not where ivm models read the state: its recompute then
# hands them its change (refresh/handoff.py: the difference merged by key,
# or an overwrite each reader sums), which its builds, the estimate's
# measure, never paid. On the warehouse at scale 1500 (2026-12-05, f647a6e,
# a second day's batch) the rule recomputed six silver models with readers:
# four took 23.7-39.0 s against estimates of 3.8-16.0 s and incremental
# refreshes of 18.1-31.4 s.
FLOOR_MARGIN = 1.5
# Over sources of at most this many bytes (the small sources of
# delta.confs) both ways cost a few statements' fixed work, and which is
# dearer in one run is chance: the floor rule weighs only larger sources.
FLOOR_WEIGHED_BYTES = SMALL_SOURCE_BYTES
# A line needs changes of clearly different sizes: through refreshes of about
# the same size (a benchmark's batches, a daily load) the least-squares slope
# is run-to-run noise. Measured (bench/, SF 1): two batches of about 15k rows
# that took 3.6 s and 2.4 s made a slope that put 12k rows at 64 s, and `auto`
# recomputed a model whose refresh was the cheaper way.
LINE_MIN_SPREAD = 2.0
# Bytes per source row when no commit in the window says (Parquet, TPC-H-like rows).
DEFAULT_BYTES_PER_ROW = 40.0
# Sources under this many bytes (MIN_RECOMPUTE_ROWS rows of DEFAULT_BYTES_PER_ROW)
# are too small for estimates in seconds: every way costs about its floor, and
# a history's seconds per byte, taken from such floors, says nothing of the
# next write (refresh/handoff.py, decision.weigh_replaced).
MIN_WEIGHED_BYTES = MIN_RECOMPUTE_ROWS * int(DEFAULT_BYTES_PER_ROW)
# A recompute of a state ivm models read costs this many times its build
# before the model has recomputed once: it computes the state whole, as the
# build did, then hands its change on (refresh/handoff.py: the old and new
# states read to find the rows that differ, merged in; or an overwrite its
# readers sum). On the warehouse at scale 1500 (2026-12-05, f647a6e) four
# silver models with readers, recomputed on their builds' estimates of
# 3.8-16.0 s, took 23.7-39.0 s (slv_orders 39.0 against 16.0, slv_customers
# 23.7 against 5.6); at scale 6000 (2026-12-07, 3f5e202, a batch run under
# a compilation recording) fct_payments took 59.0 s against 11.3. Once the
# model has recomputed, its recomputes' own seconds are the estimate. Not
# tuned.
HANDOFF_FACTOR = 3.0


@dataclass(frozen=True)
class RefreshRecord:
    """One past refresh of the model, as the history keeps it."""

    # INCREMENTAL, RECOMPUTE or BUILD (histories written before BUILD count
    # their builds as recomputes)
    way: str
    changed_rows: int
    source_bytes: int
    seconds: float
    # Its bounded MIN/MAX values ran out in a group and were refilled from the
    # sources (refilled_last).
    refilled: bool = False


@dataclass(frozen=True)
class ChangeSize:
    """How big a refresh's change is, from the sources' commit metrics."""

    rows: int
    source_bytes: int
    # Bytes per source row as the window's own writes show it (None: unknown).
    bytes_per_row: float | None = None
    # Whether `rows` counts an upstream recompute's overwrite by the change it
    # estimated (delta.history.ESTIMATED_ROWS_KEY) rather than by its rows.
    estimated: bool = False


@dataclass(frozen=True)
class Estimate:
    incremental_seconds: float
    recompute_seconds: float
    # "history" when both come from the model's own refreshes, else what was assumed.
    basis: str


@dataclass(frozen=True)
class Choice:
    way: str
    estimate: Estimate | None
    reason: str


def parse_history(text: str | None) -> list[RefreshRecord]:
    """The view property's records, oldest first; unreadable text counts as no history."""
    if not text:
        return []
    try:
        loaded = json.loads(text)
        return [RefreshRecord(**item) for item in loaded]
    except (ValueError, TypeError):
        return []


def refilled_last(history: Sequence[RefreshRecord]) -> bool:
    """Whether the newest refresh refilled bounded MIN/MAX values from the sources.

    Then this one refills at once: the MERGE that finds a group's kept
    values gone fails having written nothing, and is run again refilling.
    A change that removes a group's extremes every day, as the warehouse's
    `mart_quartile_summary` does (its quartile floors move), spent a third
    of its refresh on that failing MERGE (about 12 of 35 s at scale 1500,
    2026-12-08). A refill at once cannot tell whether a group ran out, so
    it records none, and the refresh after it tries the plain MERGE again:
    such a model skips the failing MERGE every other refresh, and one whose
    values ran out once reads its sources for a refill at most once more.

    >>> refilled_last([RefreshRecord(INCREMENTAL, 5, 10, 1.0, refilled=True)])
    True
    >>> refilled_last([]), refilled_last([RefreshRecord(INCREMENTAL, 5, 10, 1.0)])
    (False, False)
    """
    return bool(history) and history[-1].refilled


def history_with(history: Sequence[RefreshRecord], record: RefreshRecord | None) -> str:
    """The property value after `record` (if any): the newest HISTORY_LENGTH records as JSON."""
    kept = [*history, *([record] if record else [])][-HISTORY_LENGTH:]
    return json.dumps([asdict(r) for r in kept], separators=(",", ":"))


def estimate(
    history: Sequence[RefreshRecord], change: ChangeSize, read_by_ivm_models: bool = False
) -> Estimate | None:
    """Seconds to apply `change` and to recompute; None without any recompute or build to scale from.

    A recompute costs its past seconds per source byte (recompute_rate;
    fixed costs included: on small tables that overstates it, and the
    default per-row cost, scaled from the builds' rate, overstates an
    incremental refresh as much); `read_by_ivm_models`: other ivm models
    read the state, so a recompute estimated from builds costs
    HANDOFF_FACTOR times theirs. An incremental refresh costs what the line
    through the history says, or without one what a refresh of as large a
    change cost (_seen_seconds).
    """
    computing = _computation_rate(history)
    recomputing = recompute_rate(history, read_by_ivm_models)
    if computing is None or recomputing is None:
        return None
    incrementals = [r for r in history if r.way == INCREMENTAL]
    bytes_per_row = change.bytes_per_row or DEFAULT_BYTES_PER_ROW
    default_per_row = computing * bytes_per_row * DEFAULT_ROW_COST_FACTOR
    line = _line(incrementals)
    if line is None:
        seconds, basis = _seen_seconds(incrementals, change.rows, default_per_row)
    else:
        floor, per_row = line
        basis = "history"
        if change.rows > 2 * max(r.changed_rows for r in incrementals):
            # Far beyond any change seen: a line through small changes says
            # little about the slope, and underestimating it is the costly
            # mistake (a huge change applied row by row), so never assume
            # less than the default.
            per_row = max(per_row, default_per_row)
            basis = "history, extrapolated"
        seconds = floor + per_row * change.rows
    return Estimate(
        incremental_seconds=seconds,
        recompute_seconds=recomputing * change.source_bytes,
        basis=basis,
    )


def recompute_rate(
    history: Sequence[RefreshRecord], read_by_ivm_models: bool = False
) -> float | None:
    """Seconds per source byte of a recompute: its own recomputes', else its builds' (scaled).

    >>> built = [RefreshRecord(BUILD, 0, 1000, 2.0)]
    >>> recompute_rate(built), recompute_rate(built, read_by_ivm_models=True)
    (0.002, 0.006)
    >>> recompute_rate([*built, RefreshRecord(RECOMPUTE, 50_000, 1000, 5.0)], True)
    0.005
    """
    recomputes = rate(history, RECOMPUTE)
    if recomputes is not None:
        return recomputes
    builds = rate(history, BUILD)
    if builds is None:
        return None
    return builds * (HANDOFF_FACTOR if read_by_ivm_models else 1.0)


def _computation_rate(history: Sequence[RefreshRecord]) -> float | None:
    """Seconds per source byte of computing the state alone: its builds', else its recomputes'.

    A changed row's default cost (DEFAULT_ROW_COST_FACTOR) is scaled from
    it: applying a change computes rows, and hands on nothing a recompute
    would.
    """
    builds = rate(history, BUILD)
    return builds if builds is not None else rate(history, RECOMPUTE)


def rate(history: Sequence[RefreshRecord], *ways: str) -> float | None:
    """The median seconds per source byte of the history's records of `ways` (None: none)."""
    rates = [r.seconds / r.source_bytes for r in history if r.way in ways and r.source_bytes > 0]
    return statistics.median(rates) if rates else None


def _seen_seconds(
    incrementals: Sequence[RefreshRecord], rows: int, default_per_row: float
) -> tuple[float, str]:
    """An incremental refresh of `rows` from refreshes too alike in size for a line, and its basis.

    A refresh costs at least as much for a larger change, so the cheapest one
    of a change at least as large bounds it; past the largest change seen,
    that refresh's seconds plus the default per row beyond it. (Its seconds
    already hold the cost of its own rows: the floor plus a default for
    every row counted them twice, and on the warehouse put a second day's
    fct_order_regions at 134 s where the first day's took 30 s.) Without any
    refresh seen: the default per row.

    >>> seen = [RefreshRecord(INCREMENTAL, 15_000, 10**9, 3.6), RefreshRecord(INCREMENTAL, 14_000, 10**9, 2.4)]
    >>> _seen_seconds(seen, 12_000, 0.001)[0], _seen_seconds(seen, 14_500, 0.001)[0]
    (2.4, 3.6)
    >>> _seen_seconds(seen, 16_000, 0.001)[0], _seen_seconds([], 1_000, 0.001)[0]
    (4.6, 1.0)
    """
    covering = [r.seconds for r in incrementals if r.changed_rows >= rows]
    if covering:
        return min(covering), "history of as large a change"
    if not incrementals:
        return default_per_row * rows, "history for recompute; default cost per changed row"
    largest = min(incrementals, key=lambda r: (-r.changed_rows, r.seconds))
    return (
        largest.seconds + default_per_row * (rows - largest.changed_rows),
        "history; default cost per row past the largest change seen",
    )


def choose(
    strategy: str,
    history: Sequence[RefreshRecord],
    change: ChangeSize | None,
    read_by_ivm_models: bool = False,
) -> Choice:
    """Which way to refresh `change`; `read_by_ivm_models`: other ivm models read the state."""
    if strategy == RECOMPUTE:
        return Choice(RECOMPUTE, None, "ivm_strategy is 'recompute'")
    if strategy == INCREMENTAL:
        return Choice(INCREMENTAL, None, "ivm_strategy is 'incremental'")
    if change is None:
        return Choice(
            INCREMENTAL, None, "the change's size is unknown (a commit without row metrics)"
        )
    found = estimate(history, change, read_by_ivm_models)
    if found is None:
        return Choice(INCREMENTAL, None, "no recompute in the model's history to compare with")
    cheaper = found.incremental_seconds > found.recompute_seconds
    under = change.rows < MIN_RECOMPUTE_ROWS
    weighed = under and not read_by_ivm_models
    dear_floor = _dear_floor(history, found, change) if weighed else None
    small = under and dear_floor is None
    way = RECOMPUTE if cheaper and not small else INCREMENTAL
    counted = (
        "changed rows (an upstream's recompute as it estimated)"
        if change.estimated
        else "changed rows"
    )
    reason = (
        f"{change.rows:,} {counted}: estimated {found.incremental_seconds:.1f}s incremental "
        f"vs {found.recompute_seconds:.1f}s recompute ({found.basis})"
    )
    if cheaper and small:
        # Otherwise the log would show a cheaper recompute and an incremental refresh.
        reason += f"; a change under {MIN_RECOMPUTE_ROWS:,} rows is applied" + (
            " where ivm models read the state (a recompute would hand them its change)"
            if read_by_ivm_models
            else f" unless its cheapest incremental refresh took {FLOOR_MARGIN:g} times the recompute"
        )
    elif dear_floor is not None:
        reason += (
            f"; its cheapest incremental refresh took {dear_floor:.1f}s, over "
            f"{FLOOR_MARGIN:g} times the recompute"
        )
    return Choice(way, found, reason)


def _dear_floor(
    history: Sequence[RefreshRecord], found: Estimate, change: ChangeSize
) -> float | None:
    """The cheapest incremental refresh's seconds, where FLOOR_MARGIN times the recompute's.

    None where the model ran no incremental refresh, or its sources are at
    most FLOOR_WEIGHED_BYTES (both ways cost a few statements there).

    >>> history = [RefreshRecord(RECOMPUTE, 0, 10**8, 2.0), RefreshRecord(INCREMENTAL, 9, 10**8, 5.0)]
    >>> found = Estimate(incremental_seconds=5.0, recompute_seconds=2.0, basis="history")
    >>> _dear_floor(history, found, ChangeSize(rows=9, source_bytes=10**8))
    5.0
    >>> _dear_floor(history, found, ChangeSize(rows=9, source_bytes=10**6)) is None
    True
    """
    if change.source_bytes <= FLOOR_WEIGHED_BYTES:
        return None
    floor = _cheapest_incremental(history)
    if floor is None or floor <= FLOOR_MARGIN * found.recompute_seconds:
        return None
    return floor


def _cheapest_incremental(history: Sequence[RefreshRecord]) -> float | None:
    """The seconds of the model's cheapest incremental refresh kept in its history (None: none)."""
    return min((r.seconds for r in history if r.way == INCREMENTAL), default=None)


def _line(records: Sequence[RefreshRecord]) -> tuple[float, float] | None:
    """(floor, seconds per changed row) by least squares, both kept non-negative.

    None unless the largest change is LINE_MIN_SPREAD times the smallest.
    """
    points = [(float(r.changed_rows), r.seconds) for r in records]
    sizes = [x for x, _ in points]
    if len(set(sizes)) < 2 or max(sizes) < LINE_MIN_SPREAD * min(sizes):
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread)
    floor = max(0.0, mean_y - slope * mean_x)
    return floor, slope
