"""refresh/handoff.py: how a state computed whole hands its change on, without Spark.

Each case is what the refresh knows when it recomputes a state (or rebuilds
it in place): the readers and their refresh histories, the change that made
it recompute, the writer's own history; and the way it must choose.
"""

from __future__ import annotations

import pytest

from dbt.adapters.spark_ivm.refresh import handoff
from dbt.adapters.spark_ivm.refresh.handoff import MERGE, OVERWRITE, Reader, choose
from dbt.adapters.spark_ivm.refresh.strategy import RefreshRecord


def built(seconds: float, source_bytes: int = 1_000_000) -> RefreshRecord:
    return RefreshRecord("recompute", 0, source_bytes, seconds)


def applied(rows: int, seconds: float, source_bytes: int = 1_000_000) -> RefreshRecord:
    return RefreshRecord("incremental", rows, source_bytes, seconds)


# A reader whose recompute takes 10 s and whose incremental refreshes cost
# 1 s plus a millisecond per thousand rows (a line through two sizes).
CHEAP_TO_APPLY = Reader("m.cheap", [built(10.0), applied(1_000, 1.0), applied(100_000, 1.1)])
# One whose incremental refreshes cost far more than its recompute.
CHEAP_TO_RECOMPUTE = Reader("m.small", [built(0.5), applied(1_000, 4.0), applied(100_000, 40.0)])


def never(name: str):
    def fail():
        raise AssertionError(f"{name} should not be asked for")

    return fail


@pytest.mark.parametrize(
    ("readers", "kwargs", "way", "says"),
    [
        ([], {}, OVERWRITE, "no ivm model reads it"),
        ([CHEAP_TO_APPLY], {"log_state": True}, OVERWRITE, "a log has no key"),
        ([CHEAP_TO_APPLY], {"guard": None}, OVERWRITE, "guard row is not known"),
    ],
)
def test_a_state_that_cannot_or_need_not_be_merged_is_overwritten(readers, kwargs, way, says):
    found = choose([r.name for r in readers], lambda: readers, 50_000, 3.0, **kwargs)
    assert found.way == way and says in found.reason


def test_a_small_change_is_merged_without_asking_the_readers():
    # Every reader applies a change under 10,000 rows: the difference once, for all.
    found = choose(["m.r"], never("histories"), 9_999, 3.0)
    assert found.merges and "under 10,000 rows" in found.reason


def test_without_the_writers_history_an_unknown_change_is_merged_and_a_large_one_overwritten():
    assert choose(["m.cheap"], never("histories"), None, None).merges
    found = choose(["m.cheap"], never("histories"), 50_000, None)
    assert found.way == OVERWRITE and "50,000 changed rows" in found.reason


def test_readers_that_would_apply_the_change_are_worth_the_merge():
    # MERGE's extra: 1.5 x 2 s = 3 s. The reader applies 50,000 rows in about
    # 1.05 s, or, given an overwrite, sums it first (2.5 x 2 s = 5 s): it saves 5 s.
    found = choose(["m.cheap"], lambda: [CHEAP_TO_APPLY], 50_000, 2.0)
    assert found.merges, found.reason
    assert found.merge_extra_seconds == pytest.approx(3.0)
    assert found.readers_seconds == pytest.approx(5.0)
    assert "a MERGE estimated 3.0s more than an overwrite, against 5.0s" in found.reason


def test_readers_that_would_recompute_anyway_are_not_worth_the_merge():
    readers = [CHEAP_TO_RECOMPUTE, CHEAP_TO_RECOMPUTE]
    found = choose(["m.a", "m.b"], lambda: readers, 50_000, 2.0)
    assert found.way == OVERWRITE and found.readers_seconds == pytest.approx(0.0)


def test_a_large_write_outweighs_one_reader_and_not_three():
    # A 20 s recompute: the MERGE costs 30 s more. A reader with no history
    # is taken to save the sum an overwrite would cost it (50 s).
    assert not choose(["m.cheap"], lambda: [CHEAP_TO_APPLY], 50_000, 20.0).merges
    readers = [Reader(f"m.r{i}") for i in range(3)]
    assert choose([r.name for r in readers], lambda: readers, None, 20.0).merges


def test_sources_too_small_to_weigh_are_merged():
    # On a few thousand rows a history's seconds per byte are floors: no estimate holds.
    found = choose(["m.r"], never("histories"), 50_000, 20.0, source_bytes=399_999)
    assert found.merges and "where every way costs about its floor" in found.reason
    assert not choose(
        ["m.cheap"], lambda: [CHEAP_TO_APPLY], 50_000, 20.0, source_bytes=10**9
    ).merges


def test_the_readers_histories_are_read_only_where_they_decide():
    with pytest.raises(AssertionError, match="histories should not be asked for"):
        choose(["m.r"], never("histories"), 50_000, 1.0)


def test_the_writers_estimate_is_its_recomputes_seconds_per_byte():
    history = [built(2.0, 1_000), built(4.0, 1_000), applied(10, 0.5)]
    assert handoff.write_seconds(history, 3_000) == pytest.approx(9.0)
    assert handoff.write_seconds([applied(10, 0.5)], 3_000) is None


def test_describe_says_how_and_why():
    merged = choose(["m.r"], never("histories"), 10, 1.0).describe()
    assert merged.startswith("its change handed on as the rows that differ (a MERGE): ")
    overwritten = choose([], never("histories"), 10, 1.0).describe()
    assert overwritten == "its change handed on as an overwrite: no ivm model reads it"


def test_a_known_difference_into_a_table_with_deletion_vectors_is_merged_however_large():
    # Without vectors and a writer's history a large difference is overwritten.
    assert choose(["m.r"], never("histories"), 21_541, None).way == OVERWRITE
    chosen = choose(["m.r"], never("histories"), 21_541, None, deletion_vectors=True)
    assert chosen.way == MERGE
    assert "21,541 changed rows into a table with deletion vectors" in chosen.reason
    # Nothing reads it: the cheapest write still wins.
    assert choose([], never("histories"), 21_541, None, deletion_vectors=True).way == OVERWRITE
