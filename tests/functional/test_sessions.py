"""A Spark session of its own per embedded connection (runtime/sessions.py), on real Spark.

What the refresh counts on: a conf set on one connection (a commit's
metadata, the version of its last commit) is seen by no other connection and
by no other code of the process, and a connection's session outlives it
only when nothing failed on it.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from dbt_common.exceptions import DbtRuntimeError

from dbt.adapters.spark_ivm.delta.confs import (
    LAST_COMMIT_CONF,
    conf_value,
    read_conf,
    reset_commit_metadata,
    set_commit_metadata,
    set_conf,
)
from dbt.adapters.spark_ivm.runtime import sessions
from dbt.adapters.spark_ivm.runtime.embedded import session_configs
from tests.conftest import ANSI_CONF, RUNTIME_DIR, SPEED_CONF

pytestmark = pytest.mark.spark

SCHEMA = "own_sessions"
TABLE = f"{SCHEMA}.t"
MARK = "spark.ivm.test.mark"


@pytest.fixture(scope="module")
def table(spark):
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    spark.sql(f"CREATE OR REPLACE TABLE {TABLE} (k INT) USING delta")
    yield TABLE
    spark.sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def connect() -> sessions.OwnSessionConnection:
    # The parameters a session profile of the tests gives (dbt-spark adds ANSI_CONF).
    parameters = {**session_configs(RUNTIME_DIR), **ANSI_CONF, **SPEED_CONF}
    return sessions.OwnSessionConnection(server_side_parameters=parameters)


def run(connection: sessions.OwnSessionConnection, sql: str) -> list:
    cursor = connection.cursor()
    cursor.execute(sql)
    return cursor.fetchall() or []


def conf(connection: sessions.OwnSessionConnection, key: str) -> str | None:
    return conf_value(["key", "value"], [list(run(connection, read_conf(key))[0])])


def test_a_conf_set_on_one_connection_reaches_no_other_session(spark, table):
    first, second = connect(), connect()
    try:
        run(first, set_conf(MARK, "first"))
        assert conf(first, MARK) == "first"
        assert conf(second, MARK) is None
        assert spark.conf.get(MARK, None) is None
        # A commit's metadata set on a connection is written into that
        # connection's commits only, not into a commit made meanwhile by other
        # code of the process (here the tests' own session).
        run(first, set_commit_metadata({"refresh": "on first"}))
        spark.sql(f"INSERT INTO {table} VALUES (1)")
        run(first, f"INSERT INTO {table} VALUES (2)")
        run(first, reset_commit_metadata())
        history = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 2").collect()
        by_version = {row["version"]: row["userMetadata"] for row in history}
        newest = max(by_version)
        assert by_version[newest] is not None and "on first" in by_version[newest]
        assert by_version[newest - 1] is None
        # ... and the version of a connection's last commit is that commit's.
        assert conf(first, LAST_COMMIT_CONF) == str(newest)
        assert conf(second, LAST_COMMIT_CONF) is None
    finally:
        first.close()
        second.close()


def test_commits_of_two_connections_at_once_each_carry_their_own_metadata(spark, table):
    """What lets a refresh commit without delta.confs.COMMIT_LOCK on a session of its own.

    Two threads each set their commit's metadata, write and read back their
    commit's version on their own connection, at the same time: every
    version either read back carries its own thread's metadata.
    """
    connections = {"left": connect(), "right": connect()}
    written: dict[str, list[tuple[int, int]]] = {name: [] for name in connections}
    start = threading.Barrier(len(connections))

    def commit_several(name: str) -> None:
        connection = connections[name]
        start.wait()
        for attempt in range(4):
            run(connection, set_commit_metadata({"writer": name, "attempt": attempt}))
            run(connection, f"INSERT INTO {table} VALUES ({attempt})")
            version = conf(connection, LAST_COMMIT_CONF)
            run(connection, reset_commit_metadata())
            assert version is not None
            written[name].append((int(version), attempt))

    try:
        with ThreadPoolExecutor(max_workers=len(connections)) as pool:
            for done in [pool.submit(commit_several, name) for name in connections]:
                done.result()
    finally:
        for connection in connections.values():
            connection.close()
    history = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 20").collect()
    metadata = {row["version"]: row["userMetadata"] for row in history}
    for name, commits in written.items():
        assert len(commits) == 4
        for version, attempt in commits:
            assert json.loads(metadata[version]) == {"attempt": attempt, "writer": name}


def test_a_closed_connections_session_is_reused_unless_a_statement_failed(table):
    first = connect()
    session = first.session
    first.close()
    reused = connect()
    assert reused.session is session
    with pytest.raises(DbtRuntimeError, match="TABLE_OR_VIEW_NOT_FOUND"):
        run(reused, f"SELECT * FROM {SCHEMA}.no_such_table")
    reused.close()
    after_failure = connect()
    try:
        assert after_failure.session is not session
        assert run(after_failure, f"SELECT count(*) AS n FROM {table}")[0]["n"] >= 0
    finally:
        after_failure.close()


def test_a_reused_session_has_no_temporary_view_of_the_connection_before(table):
    first = connect()
    session = first.session
    run(first, f"CREATE TEMPORARY VIEW left_behind AS SELECT * FROM {table}")
    run(first, f"CACHE TABLE cached_behind AS SELECT * FROM {table}")
    assert session.catalog.isCached(table)  # the view's cached plan is the table's
    first.close()
    reused = connect()
    try:
        assert reused.session is session
        names = [row["tableName"] for row in run(reused, f"SHOW TABLES IN {SCHEMA}")]
        assert names == ["t"]
        # The cached view's data is uncached with it, not left in the shared cache.
        assert not session.catalog.isCached(table)
    finally:
        reused.close()


def test_each_connections_jobs_share_the_cores_in_a_pool_of_their_own(spark):
    """The runtime's fair scheduler, a pool per session (sessions.SCHEDULER_POOL).

    One connection runs a job of twelve one-second tasks on the two cores;
    another submits a one-task job meanwhile. Under Spark's FIFO scheduler
    that task would wait until the twelve had all started (five seconds in,
    room for a loaded machine); in a pool of its own it takes the next free
    core, so the long job still has tasks that have not started when the
    short one is done.
    """
    assert spark.sparkContext._jsc.sc().getSchedulingMode().toString() == "FAIR"
    long_running, short = connect(), connect()
    assert long_running.pool != short.pool
    sleep = "reflect('java.lang.Thread', 'sleep', CAST(1000 AS BIGINT))"
    tracker = spark.sparkContext.statusTracker()

    def long_stage():
        stages = (tracker.getStageInfo(i) for i in tracker.getActiveStageIds())
        return next((s for s in stages if s is not None and s.numTasks == 12), None)

    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            done = pool.submit(run, long_running, f"SELECT id, {sleep} FROM range(0, 12, 1, 12)")
            while long_stage() is None:
                assert not done.done(), done.result()
            assert run(short, "SELECT COUNT(*) AS n FROM range(0, 10, 1, 1)")[0]["n"] == 10
            stage = long_stage()
            assert stage is not None and not done.done()
            started = stage.numActiveTasks + stage.numCompletedTasks
            assert started < stage.numTasks, "the short job waited for every task of the long one"
            assert len(done.result()) == 12
        context = spark.sparkContext._jsc.sc()
        for connection in (long_running, short):
            assert context.getPoolForName(connection.pool).isDefined()
    finally:
        long_running.close()
        short.close()
