"""Soak: refreshes loop while a writer thread keeps committing to the sources (issue 6).

The writer commits random INSERTs (NULLs and duplicates), UPDATEs, DELETEs,
MERGEs and OPTIMIZEs to two sources, without pause, for as long as the
refreshes run. After every `dbt run` each model must equal its query at the
source versions it records, whatever the writer did meanwhile. The run is
bounded by a count of refreshes and a time budget, and reports what it
survived. Then, with the writer stopped, a compaction of both sources (a
commit that rewrites files, not rows) must refresh as "no changes".
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter

import pytest
from dbt.tests.util import run_dbt

from tests.functional.ivm_checks import assert_model_matches_sources, latest_version
from tests.functional.ivm_project import (
    JOIN_QUERIES,
    QUERIES,
    IvmProject,
    create_join_sources,
    model_files,
)

# A minute and more of writer and refreshes: the extended command runs it
# (scripts/test-extended), the README's test command does not.
pytestmark = pytest.mark.extended

SOAK_QUERIES = {
    "grouped": QUERIES["grouped"],
    "distinct_pairs": QUERIES["distinct_pairs"],
    # MIN/MAX/COUNT(DISTINCT) over a join with a non-equi condition.
    "joined_groups": JOIN_QUERIES["joined_groups"],
}
SOURCES = ["src", "dim", "tag"]

# Bounds: whichever comes first, after at least MIN_REFRESHES. The test
# command keeps them small; IVM_SOAK_SECONDS and IVM_SOAK_REFRESHES soak longer.
MAX_REFRESHES = int(os.environ.get("IVM_SOAK_REFRESHES", "4"))
MIN_REFRESHES = 2
TIME_BUDGET_SECONDS = float(os.environ.get("IVM_SOAK_SECONDS", "60"))
# The writer's pause between commits: without one it takes a whole core of the
# two, and the refreshes it races crawl.
WRITER_PAUSE_SECONDS = 0.3


def _value(rng: random.Random, values: list[str]) -> str:
    return rng.choice(["NULL", *values])


class SourceWriter:
    """Random commits to `src` and `dim`, counted by kind, until stopped."""

    def __init__(self, spark, tables: dict[str, str], seed: int) -> None:
        self.spark = spark
        self.tables = tables
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.stop = threading.Event()

    def _src_row(self) -> str:
        rng = self.rng
        k = _value(rng, [str(rng.randint(0, 4))])
        g = _value(rng, ["'a'", "'b'", "'c'"])
        v = _value(rng, [str(rng.randint(-2, 9))])
        d = _value(rng, [f"{rng.randint(0, 99)}.{rng.randint(0, 99):02d}"])
        return f"({k}, {g}, {v}, {d})"

    def step(self) -> None:
        rng, src, dim = self.rng, self.tables["src"], self.tables["dim"]
        kind = rng.choice(["insert", "insert", "update", "delete", "merge", "dim", "optimize"])
        k = rng.randint(0, 4)
        if kind == "insert":
            rows = [self._src_row() for _ in range(rng.randint(1, 3))]
            rows += rows[:1] if rng.random() < 0.3 else []  # a duplicate
            statement = f"INSERT INTO {src} VALUES {', '.join(rows)}"
        elif kind == "update":
            statement = f"UPDATE {src} SET v = v + 1, g = 'b' WHERE k = {k}"
        elif kind == "delete":
            statement = f"DELETE FROM {src} WHERE k = {k} AND v > {rng.randint(-2, 9)}"
        elif kind == "merge":
            rows = ", ".join(self._src_row() for _ in range(2))
            statement = (
                f"MERGE INTO {src} t USING (SELECT * FROM VALUES {rows} AS c(k, g, v, d)) c "
                "ON t.k = c.k AND t.g <=> c.g "
                "WHEN MATCHED AND c.v IS NULL THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET t.v = c.v, t.d = c.d "
                "WHEN NOT MATCHED THEN INSERT *"
            )
        elif kind == "dim":
            statement = rng.choice(
                [
                    f"INSERT INTO {dim} VALUES ({k}, '{rng.choice('xyz')}', {rng.randint(-1, 9)})",
                    f"UPDATE {dim} SET w = w + 3 WHERE k = {k}",
                    f"DELETE FROM {dim} WHERE k = {k} AND name = '{rng.choice('xyz')}'",
                ]
            )
        else:
            statement = f"OPTIMIZE {rng.choice([src, dim])}"
        self.spark.sql(statement)
        self.counts[kind] += 1

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as error:  # noqa: BLE001 - reported by the test, not swallowed
                self.errors.append(str(error).splitlines()[0][:300])
                return
            self.stop.wait(WRITER_PAUSE_SECONDS)


class TestSoak(IvmProject):
    @pytest.fixture(scope="class")
    def models(self):
        return model_files(queries=SOAK_QUERIES)

    @pytest.fixture(scope="class")
    def sources(self, project):
        return create_join_sources(project)

    def test_refreshes_stay_exact_while_a_writer_never_stops(
        self, project, spark, sources, record_property
    ):
        schema = project.test_schema
        run_dbt(["run"])
        writer = SourceWriter(spark, sources, seed=20261127)
        thread = threading.Thread(target=writer.run)
        started = time.monotonic()
        refreshes = 0
        thread.start()
        try:
            while refreshes < MAX_REFRESHES and (
                refreshes < MIN_REFRESHES or time.monotonic() - started < TIME_BUDGET_SECONDS
            ):
                results = run_dbt(["run"])
                refreshes += 1
                for result in results:
                    name = result.node.name
                    assert_model_matches_sources(spark, schema, name, SOAK_QUERIES[name], SOURCES)
        finally:
            writer.stop.set()
            thread.join()
        assert writer.errors == [], writer.errors
        survived = {
            "refreshes": refreshes,
            "models": len(SOAK_QUERIES),
            "seconds": round(time.monotonic() - started, 1),
            "commits": dict(sorted(writer.counts.items())),
        }
        print(f"soak survived: {json.dumps(survived)}")
        record_property("soak", survived)
        # The writer must really have raced the refreshes, with every kind of commit.
        assert sum(writer.counts.values()) >= 2 * refreshes, survived
        assert {"insert", "update", "delete", "merge"} <= set(writer.counts), survived

        # A compaction rewrites files but no rows: nothing to apply. (Two more
        # commits first, so that each source has files to compact.)
        for table, row in ((sources["src"], "(1, 'a', 1, 1.00)"), (sources["dim"], "(1, 'x', 1)")):
            spark.sql(f"INSERT INTO {table} VALUES {row}")
            spark.sql(f"INSERT INTO {table} VALUES {row}")
        run_dbt(["run"])
        for table in (sources["src"], sources["dim"]):
            before = latest_version(spark, table)
            spark.sql(f"OPTIMIZE {table}")
            assert latest_version(spark, table) == before + 1, f"OPTIMIZE of {table} did nothing"
        for result in run_dbt(["run"]):
            response = result.adapter_response or {}
            assert str(response.get("code")) == "NO_CHANGE", response
            assert "keep the rows as they were" in str(response.get("_message")), response
            name = result.node.name
            assert_model_matches_sources(spark, schema, name, SOAK_QUERIES[name], SOURCES)
