"""Exactly once: a refresh stopped after any of its statements, then re-run, ends correct.

The crash is simulated in-process: after the n-th statement of the refresh,
every further statement fails, as if the process had died there. The next
`dbt run` must apply each change exactly once (nothing twice, nothing lost),
which the oracle checks at the version the model records.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from dbt.tests.util import run_dbt

from dbt.adapters.spark_ivm.delta.confs import reset_commit_metadata
from dbt.adapters.spark_ivm.impl import _AdapterRunner
from tests.conftest import THRIFT
from tests.functional.ivm_checks import assert_model_matches_query, latest_version
from tests.functional.ivm_project import QUERIES, IvmProject, create_source, model_files

# One aggregate and one projection; each crash point costs two dbt runs.
MODELS = ["grouped", "drops_key"]

# Statements that leave something behind when the process dies after them.
# A crash after any other statement (DESCRIBE, SHOW, SELECT, or a SET of a
# session conf, which dies with the session) leaves exactly what a crash
# right after the last writing statement before it leaves, so the tests stop
# a refresh at the start and after each writing statement: every state a
# crash can leave, without two dbt runs per read.
WRITING_STATEMENTS = ("CREATE", "REPLACE", "MERGE", "INSERT", "UPDATE", "DELETE", "ALTER", "DROP")


def crash_points(statements: list[str]) -> list[int]:
    """The crash points (statements let run) that leave distinct persistent states."""
    writes = [
        index + 1
        for index, sql in enumerate(statements)
        if sql.lstrip().split(None, 1)[0].upper() in WRITING_STATEMENTS
    ]
    return [0, *(after for after in writes if after < len(statements))]


class InjectedCrash(Exception):
    pass


@contextmanager
def crash_after(statements: int | None) -> Iterator[list[str]]:
    """Let `statements` refresh statements run, then fail every later one (None: never fail)."""
    ran: list[str] = []
    originals = {"query": _AdapterRunner.query, "execute": _AdapterRunner.execute}

    def wrap(original):
        def run(self, sql):
            if statements is not None and len(ran) >= statements:
                raise InjectedCrash(f"injected crash after statement {statements}")
            result = original(self, sql)
            ran.append(sql)
            return result

        return run

    _AdapterRunner.query = wrap(originals["query"])
    _AdapterRunner.execute = wrap(originals["execute"])
    try:
        yield ran
    finally:
        _AdapterRunner.query = originals["query"]
        _AdapterRunner.execute = originals["execute"]


class TestInterruptedRefresh(IvmProject):
    # Over Thrift only in the README's test command (both in the extended one):
    # a crash between SET and RESET of the commit metadata in a server session
    # is the case only Thrift has, and the crash points are the same in both.
    thrift_slice = THRIFT

    @pytest.fixture(scope="class")
    def models(self):
        return model_files(MODELS)

    @pytest.fixture(scope="class")
    def source_table(self, project):
        return create_source(project, "(1, 'a', 1, 1.50), (1, 'a', 1, 1.50), (2, NULL, NULL, NULL)")

    def _write_batch(self, spark, table: str, round_: int) -> None:
        spark.sql(
            f"INSERT INTO {table} VALUES ({round_ % 4}, 'b', {round_}, 2.25), (NULL, NULL, 1, NULL)"
        )
        spark.sql(f"UPDATE {table} SET v = v + 1, g = 'c' WHERE k = {round_ % 3}")
        spark.sql(f"DELETE FROM {table} WHERE k = {(round_ + 1) % 4} AND g = 'b'")

    def _interrupted_then_rerun(
        self, project, spark, table: str, model: str, args: list[str], after: int
    ) -> bool:
        """Returns whether the crash point was reached (False once the refresh has fewer statements)."""
        with crash_after(after) as ran:
            results = run_dbt([*args, "--select", model], expect_pass=False)
        crashed = any("injected crash" in str(r.message) for r in results)
        # A real crash loses the session; in the shared test session, clear the
        # commit-metadata conf the dead refresh may have left set.
        spark.sql(reset_commit_metadata())
        run_dbt(["run", "--select", model])
        version = assert_model_matches_query(
            spark, project.test_schema, model, QUERIES[model], "src"
        )
        assert version == latest_version(spark, table)
        assert crashed or len(ran) == after
        return crashed

    def test_incremental_refresh_stopped_after_each_statement(self, project, spark, source_table):
        model = "grouped"
        run_dbt(["run", "--select", model])
        self._write_batch(spark, source_table, 0)
        with crash_after(None) as ran:
            run_dbt(["run", "--select", model])
        assert len(ran) >= 5, f"expected a refresh of several statements, saw {ran}"
        points = crash_points(ran)
        assert len(points) >= 2, f"expected writing statements in the refresh, saw {ran}"
        for after in points:
            self._write_batch(spark, source_table, after + 1)
            assert self._interrupted_then_rerun(project, spark, source_table, model, ["run"], after)

    # In the extended command only (CONTRIBUTING.md, "Suite time"): a full refresh
    # replaces the state in one Delta commit; the incremental crashes above are the
    # ones whose statements depend on each other.
    @pytest.mark.extended
    def test_full_refresh_stopped_after_each_statement(self, project, spark, source_table):
        model = "drops_key"
        run_dbt(["run", "--select", model])
        with crash_after(None) as ran:
            run_dbt(["run", "--full-refresh", "--select", model])
        for after in crash_points(ran):
            self._write_batch(spark, source_table, 100 + after)
            assert self._interrupted_then_rerun(
                project, spark, source_table, model, ["run", "--full-refresh"], after
            )
