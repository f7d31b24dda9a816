"""The oracle itself: bag equality through EXCEPT ALL both ways, one model or many at once.

Every property test trusts these counts, so they are checked here against
bags whose differences are known: a duplicate missing, an extra row, a NULL
row, and equal bags in another order.
"""

from __future__ import annotations

import pytest

from tests.functional.ivm_checks import BagDifference, bag_difference, bag_differences

pytestmark = pytest.mark.spark

QUERY = "SELECT * FROM VALUES (1, 'a'), (1, 'a'), (2, NULL) AS t(k, g)"


def test_equal_bags_in_another_order_are_equal(spark):
    model = "SELECT * FROM VALUES (2, NULL), (1, 'a'), (1, 'a') AS t(k, g)"
    assert bag_difference(spark, model, QUERY) == BagDifference(0, 0, None, None)


def test_each_pair_is_counted_on_its_own_in_one_statement(spark):
    pairs = {
        "equal": ("SELECT * FROM VALUES (2, NULL), (1, 'a'), (1, 'a') AS t(k, g)", QUERY),
        # A set would call these equal: the bag misses one duplicate.
        "lost_duplicate": ("SELECT * FROM VALUES (1, 'a'), (2, NULL) AS t(k, g)", QUERY),
        # NULLs compare equal in EXCEPT ALL: only the extra row counts.
        "extra_row": (
            "SELECT * FROM VALUES (1, 'a'), (1, 'a'), (2, NULL), (3, NULL) AS t(k, g)",
            QUERY,
        ),
    }
    differences = bag_differences(spark, pairs)
    assert differences == {
        "equal": BagDifference(0, 0, None, None),
        "lost_duplicate": BagDifference(1, 0, 2, 3),
        "extra_row": BagDifference(0, 1, 4, 3),
    }
    assert [name for name, d in differences.items() if not d.equal] == [
        "lost_duplicate",
        "extra_row",
    ]
