"""The scaling report (scaling.py), without Spark: its reading of the driver's
results, its growth figures and its verdict against issue 54's 1.5x."""

from __future__ import annotations

import doctest
import json

import scaling
from scaling import BatchTimes, markdown, read_batch


def test_doctests() -> None:
    result = doctest.testmod(scaling, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0


def _steps(refresh: dict[str, float], rebuild: dict[str, float]) -> list[dict]:
    batch = {"name": "batch 1 (17 source commits)", "table_models": rebuild}
    batch["models"] = [{"model": m, "seconds": s} for m, s in refresh.items()]
    return [{"name": "first build", "models": [], "table_models": {}}, batch]


def test_growth_within_target_is_met_and_models_sorted_by_large_refresh() -> None:
    small = read_batch(1500, _steps({"a": 10.0, "b": 2.0}, {"a": 20.0, "b": 10.0}))
    large = read_batch(6000, json.loads(json.dumps(_steps({"a": 12.0, "b": 4.0}, {"a": 80.0}))))
    report = markdown(small, large)
    assert "| batch refresh (models' sum) | 12.0 | 16.0 | 1.33x |" in report
    assert "| `table` rebuild (models' sum) | 30.0 | 80.0 | 2.67x |" in report
    assert "met (1.33x)" in report
    rows = [line for line in report.splitlines() if line.startswith(("| a |", "| b |"))]
    assert rows == ["| a | 10.0 / 20.0 | 12.0 / 80.0 | 1.20x |", "| b | 2.0 / 10.0 | 4.0 | 2.00x |"]


def test_growth_past_target_is_reported_missed() -> None:
    report = markdown(
        BatchTimes(1500, {"a": 1.0}, {"a": 4.0}), BatchTimes(6000, {"a": 2.0}, {"a": 16.0})
    )
    assert "missed (2.00x)" in report
