"""A real multi-JVM Spark cluster: a standalone master, two workers and the Thrift server as driver.

runtime/cluster.py starts each part as a JVM of its own from the installed pyspark,
so every statement dbt sends runs its tasks in executors inside the workers'
JVMs: Delta's classes reach them through `spark.jars`, and every delta
statement, change feed read and guard is serialized to another JVM.

The extended command (marker `extended`, the whole module) runs the
cluster's start, a Delta change feed over it and its stop, with the master's
own account of where the tasks ran, and the worked example through dbt over
it (build, a batch, an incremental refresh, every `ivm_matches_query`
passing) and the loss of a worker during its consistency group's publish and
during a refresh. The randomized classes run over a cluster too, with the
test process as its driver: scripts/test-cluster (IVM_TEST_SPARK in
tests/conftest.py).
"""

from __future__ import annotations

import os
import random
import re
import socket
import time

import pytest
from dbt.adapters.factory import reset_adapters

from dbt.adapters.spark_ivm.consistency.publish import COMMIT_LOG_NAME
from dbt.adapters.spark_ivm.runtime import cluster, server
from tests.functional.test_server_mode import (
    ThriftSql,
    _build,
    _codes,
    _dbt_process,
    _example,
    _failed_tests,
)

# All of it in scripts/test-extended, with scripts/test-cluster: the
# cluster's start, first change feed and stop took 181 s of one worker in the
# README's command (2026-11-29), and its four JVMs slowed the other worker's
# tests beside it.
pytestmark = [pytest.mark.spark, pytest.mark.extended]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((server.DEFAULT_HOST, 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def spec() -> cluster.ClusterSpec:
    # Free ports: a cluster a developer keeps up on the defaults is left alone.
    return cluster.ClusterSpec(
        master_port=_free_port(), master_ui_port=_free_port(), thrift_port=_free_port()
    )


@pytest.fixture(scope="module")
def running(tmp_path_factory, spec):
    """The cluster, up for the module's tests; down (every part stopped) afterwards."""
    runtime = tmp_path_factory.mktemp("cluster")
    started = cluster.up(runtime, spec)
    try:
        yield runtime, started
    finally:
        cluster.down(runtime)
        assert cluster.parts(runtime) == []


def test_every_part_is_a_jvm_of_its_own_and_the_driver_runs_on_the_workers(running, spec):
    runtime, started = running
    assert sorted(p.name for p in started) == ["master", "thrift-server", "worker-1", "worker-2"]
    assert len({p.pid for p in started}) == 4
    # What `status` reads (the pid files under the runtime) is what was started.
    assert cluster.parts(runtime) == started
    assert os.getpid() not in {p.pid for p in started}
    state = cluster.master_state(spec)
    assert cluster.alive_workers(spec) == 2
    # The Thrift server registered as the cluster's one application, holding a
    # core on each worker: its executors are the workers' JVMs.
    (app,) = state["activeapps"]
    assert app["name"] == "dbt-spark-ivm thrift server"
    assert app["cores"] == 2


def test_a_delta_change_feed_is_read_over_the_cluster(running, spec):
    sql = ThriftSql(spec.thrift_port)
    try:
        sql.sql(
            "CREATE TABLE cluster_check (k INT) USING DELTA "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
        sql.sql("INSERT INTO cluster_check SELECT id FROM range(1000)")
        sql.sql("DELETE FROM cluster_check WHERE k % 10 = 0")
        rows = sql.query(
            "SELECT _change_type, count(*) FROM table_changes('cluster_check', 1) GROUP BY 1"
        )
    finally:
        sql.close()
    assert sorted(rows) == [("delete", 100), ("insert", 1000)]
    # The executors wrote the files: every worker ran tasks of the application.
    (app,) = cluster.master_state(spec)["activeapps"]
    assert app["state"] == "RUNNING"


@pytest.fixture(scope="module")
def example_over_cluster(running, spec):
    """The example's `server` target pointed at the cluster's Thrift server."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_IVM_THRIFT_HOST", server.DEFAULT_HOST)
        patch.setenv("SPARK_IVM_THRIFT_PORT", str(spec.thrift_port))
        sql = ThriftSql(spec.thrift_port)
        try:
            _example().create_sources(sql, random.Random(7))
            yield sql
        finally:
            sql.close()
            reset_adapters()


def test_the_worked_example_refreshes_incrementally_over_the_cluster(
    example_over_cluster, tmp_path
):
    first = _build(tmp_path)
    assert set(_codes(first).values()) == {"BUILD"}, _codes(first)
    assert not _failed_tests(first)
    _example().apply_batch(example_over_cluster, random.Random(8))
    second = _build(tmp_path)
    assert set(_codes(second).values()) == {"INCREMENTAL"}, _codes(second)
    assert not _failed_tests(second)


def _text(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _run_and_kill_a_worker(runtime, tmp_path, number: int, when) -> tuple[cluster.Part, int]:
    """`dbt run` of the example as a process; worker `number` SIGKILLed once its debug log
    satisfies `when` (the statement is sent). The killed part and dbt's exit code."""
    run = _dbt_process(tmp_path, "lossy", "run", "--log-level-file", "debug")
    log = tmp_path / "lossy" / "logs" / "dbt.log"
    deadline = time.monotonic() + 600
    while not when(_text(log)):
        assert run.poll() is None, "dbt ended before the statement: " + _text(log)[-2000:]
        assert time.monotonic() < deadline, "no such statement within 600 s"
        time.sleep(0.1)
    killed = cluster.kill_worker(runtime, number)
    output = run.communicate(timeout=900)[0]
    if run.returncode != 0:
        assert "Error" in output, output[-3000:]
    return killed, run.returncode


def _example_group_commits(sql: ThriftSql) -> dict[str, set[str]]:
    """The example group's commit log: each commit id and the kinds of its rows."""
    kinds: dict[str, set[str]] = {}
    for commit_id, kind in sql.query(f"SELECT commit_id, kind FROM ivm_example.{COMMIT_LOG_NAME}"):
        kinds.setdefault(commit_id, set()).add(kind)
    return kinds


def test_losing_a_worker_during_a_group_publish_loses_nothing(
    running, spec, example_over_cluster, tmp_path
):
    """Worker 2 SIGKILLed once dbt sends the group's commit row (step 2 of consistency/publish.py).

    The example's ten models are one consistency group. Whether the commit
    row's write completes on the other worker or the run fails, the next
    build finishes or redoes the publication: every commit the log holds is
    published, and every model equals its query. Worker 2 is started again
    afterwards (a machine back), so the test below has two workers.
    """
    runtime, _ = running
    assert not _failed_tests(_build(tmp_path / "before"))
    _example().apply_batch(example_over_cluster, random.Random(10))
    killed, code = _run_and_kill_a_worker(
        runtime,
        tmp_path,
        2,
        lambda log: re.search(rf"INSERT INTO [`\w.]*{COMMIT_LOG_NAME}", log) is not None,
    )
    print(
        f"worker-2 (pid {killed.pid}) killed during a group publish: dbt run "
        + ("completed" if code == 0 else f"failed (exit {code})")
    )
    cluster.start_worker(runtime, spec, 2)
    after = _build(tmp_path / "after")
    assert not _failed_tests(after), _failed_tests(after)
    assert set(_codes(after).values()) <= {"INCREMENTAL", "NO_CHANGE"}, _codes(after)
    commits = _example_group_commits(example_over_cluster)
    assert commits and all("published" in kinds for kinds in commits.values()), commits


# Last in the module: it leaves the cluster one worker short.
def test_losing_a_worker_during_a_refresh_loses_nothing(
    running, spec, example_over_cluster, tmp_path
):
    """Worker 1 (and its executor) SIGKILLed once the refresh's first MERGE is sent.

    Spark reruns the lost tasks on the other worker, so the refresh either
    completes or fails with an error; either way the next build leaves every
    model equal to its query (its ivm_matches_query tests pass) and nothing
    half-applied.
    """
    runtime, _ = running
    assert not _failed_tests(_build(tmp_path / "before"))
    _example().apply_batch(example_over_cluster, random.Random(9))
    killed, code = _run_and_kill_a_worker(runtime, tmp_path, 1, lambda log: "MERGE INTO" in log)
    print(
        f"worker-1 (pid {killed.pid}) killed during a MERGE: dbt run "
        + ("completed" if code == 0 else f"failed (exit {code})")
    )
    after = _build(tmp_path / "after")
    assert not _failed_tests(after), _failed_tests(after)
    assert set(_codes(after).values()) <= {"INCREMENTAL", "NO_CHANGE"}, _codes(after)
