"""The oracle itself: bag equality through EXCEPT ALL both ways, one model or many at once.

Every property test trusts these counts, so they are checked here against
bags whose differences are known: a duplicate missing, an extra row, a NULL
row, and equal bags in another order.
"""

from __future__ import annotations

import pytest

from dbt.adapters.spark_ivm.operations import comparison
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


# -- ivm_matches_query's comparison with floating-point tolerances (comparison.py) --

FLOATS = (
    "SELECT * FROM VALUES (1, 0.3D), (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), (3, NULL) AS t(k, x)"
)


def _compared(spark, model_rows: str, tolerance: comparison.Tolerance) -> list[tuple]:
    """The comparison's answer (no row: equal) for a model whose rows are `model_rows`."""
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW compared_model AS {model_rows}")
    sql = comparison.query("compared_model", FLOATS, [("k", "int"), ("x", "double")], tolerance)
    return [tuple(row) for row in spark.sql(sql).collect()]


@pytest.mark.parametrize(
    ("model_rows", "tolerance", "expected"),
    [
        # 0.1 + 0.2 is not 0.3 in binary: equal within 1e-9, not exactly.
        pytest.param(
            "SELECT * FROM VALUES (1, 0.1D + 0.2D), (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), "
            "(3, NULL) AS t(k, x)",
            comparison.Tolerance(relative=1e-9),
            [],
            id="rounding_within_tolerance",
        ),
        pytest.param(
            "SELECT * FROM VALUES (1, 0.1D + 0.2D), (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), "
            "(3, NULL) AS t(k, x)",
            comparison.Tolerance(),
            [(1, 1, 4, 4)],
            id="rounding_compared_exactly",
        ),
        pytest.param(
            "SELECT * FROM VALUES (1, 0.3001D), (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), "
            "(3, NULL) AS t(k, x)",
            comparison.Tolerance(relative=1e-9),
            [(1, 1, 4, 4)],
            id="beyond_the_tolerance",
        ),
        pytest.param(
            "SELECT * FROM VALUES (1, 0.3001D), (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), "
            "(3, NULL) AS t(k, x)",
            comparison.Tolerance(absolute=0.001),
            [],
            id="within_an_absolute_tolerance",
        ),
        # A duplicate lost is a bag difference whatever the tolerance.
        pytest.param(
            "SELECT * FROM VALUES (1, 0.3D), (2, CAST('NaN' AS DOUBLE)), (3, NULL) AS t(k, x)",
            comparison.Tolerance(relative=1e-9),
            [(1, 0, 3, 4)],
            id="lost_duplicate",
        ),
        # NaN equals NaN; NaN is not NULL, and a row under another exact key is another row.
        pytest.param(
            "SELECT * FROM VALUES (1, 0.3D), (1, 0.3D), (2, NULL), (3, NULL) AS t(k, x)",
            comparison.Tolerance(relative=1e-9),
            [(1, 1, 4, 4)],
            id="nan_is_not_null",
        ),
        pytest.param(
            "SELECT * FROM VALUES (1, 0.3D), (4, 0.3D), (2, CAST('NaN' AS DOUBLE)), "
            "(3, NULL) AS t(k, x)",
            comparison.Tolerance(relative=1e-9),
            [(1, 1, 4, 4)],
            id="other_exact_key",
        ),
    ],
)
def test_floating_point_columns_compare_within_the_tolerance(
    spark, model_rows, tolerance, expected
):
    assert _compared(spark, model_rows, tolerance) == expected
