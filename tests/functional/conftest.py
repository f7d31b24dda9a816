"""Fixtures of the integration tests that depend on the connection mode (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import THRIFT

# Over Thrift the property tests replay fewer of their examples: the compiled
# SQL of a refresh does not depend on the connection, only how it reaches
# Spark does, and every example over Thrift costs more than in-process (a
# status poll per statement). Example 0 is Hypothesis's simplest draw (often
# no change at all), so Thrift starts at example 1.
THRIFT_EXAMPLES = int(os.environ.get("IVM_PROPERTY_EXAMPLES_THRIFT", "1"))
# In session mode the README's test command also starts at example 1: example
# 0, the simplest draw, empties the sources and changes little more, and
# tests/rules draws far more sequences for every model without a JVM.
# scripts/test-extended sets 0 and so runs every example.
SESSION_FIRST_EXAMPLE = int(os.environ.get("IVM_PROPERTY_FIRST_EXAMPLE", "1"))
# ... and refresh once after all of the example's statements, instead of
# after each step: the same changes (several commits in one refresh window),
# one dbt run instead of up to three. IVM_PROPERTY_STEPS_THRIFT=all keeps
# the steps as drawn.
THRIFT_STEPS_JOINED = os.environ.get("IVM_PROPERTY_STEPS_THRIFT", "one") != "all"


class ExampleBudget:
    """Which of a property test's examples run: `admits_next()` is asked once per example."""

    def __init__(self, first: int, limit: int | None, join_steps: bool = False) -> None:
        self.first = first
        self.limit = limit
        self.join_steps = join_steps
        self.seen = 0
        self.admitted = 0

    def admits_next(self) -> bool:
        index = self.seen
        self.seen += 1
        admitted = index >= self.first and (self.limit is None or self.admitted < self.limit)
        self.admitted += admitted
        return admitted

    def steps(self, drawn: list[list]) -> list[list]:
        """The steps of an example: as drawn, or all its statements before one refresh."""
        if not self.join_steps:
            return drawn
        return [[statement for step in drawn for statement in step]]


@pytest.fixture
def example_budget(connection: str):
    """The examples a property test runs in this mode; fails the test if none ran."""
    budget = (
        ExampleBudget(first=1, limit=THRIFT_EXAMPLES, join_steps=THRIFT_STEPS_JOINED)
        if connection == THRIFT
        else ExampleBudget(first=SESSION_FIRST_EXAMPLE, limit=None)
    )
    yield budget
    assert budget.admitted > 0, (
        f"no example of {budget.seen} ran over {connection}: "
        "raise IVM_PROPERTY_EXAMPLES (Thrift skips example 0)"
    )


@pytest.fixture(scope="class", autouse=True)
def no_json_artifacts():
    """dbt runs here without writing manifest.json and run_results.json (DBT_WRITE_JSON).

    No test here reads them (dbt's own adapter suite, tests/adapter, does,
    and keeps them); writing them took about 0.4 s of every dbt invocation
    (a cProfile of test_no_change_shortcut.py, 2026-12-01). Partial parsing
    keeps its own file.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DBT_WRITE_JSON", "false")
        yield
