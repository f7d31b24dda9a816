"""The driver's report (driver.markdown), without Spark: a step whose tests were
skipped says so rather than showing 0 of 0 passed, and says how to skip them."""

from __future__ import annotations

from driver import ModelOutcome, Step, TestOutcome, markdown


def _step(name: str, tested: bool) -> Step:
    model = ModelOutcome("brz_orders", "bronze", "incremental", "", 2.0)
    tests = [TestOutcome("ivm_matches_query_brz_orders", "pass", "")] if tested else []
    return Step(name, models=[model], tests=tests, wall_seconds=2.0, tested=tested)


def test_skipped_first_build_tests_are_reported_not_run() -> None:
    report = markdown([_step("first build", tested=False), _step("batch 1", tested=True)], 4)
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert rows["| first build"].endswith("| not run |")
    assert rows["| batch 1"].endswith("| 1/1 |")
    assert "`scripts/warehouse --threads 4 --skip-first-build-tests` reproduces it." in report
    assert "The first build's `dbt test` was skipped; each batch's ran." in report


def test_tested_first_build_counts_its_tests() -> None:
    report = markdown([_step("first build", tested=True)], 1)
    assert "skip-first-build-tests" not in report
    assert any(line.endswith("| 1/1 |") for line in report.splitlines())
