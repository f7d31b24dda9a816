"""Server mode end to end: the standalone Thrift server, and the worked example over Thrift.

`python -m dbt.adapters.spark_ivm.runtime.server`'s start() launches a server of its
own (its own JVM, runtime directory and port): the first test starts it,
writes a Delta source with a change feed and reads the feed over Thrift,
and stops it.

The worked example (integration_tests/, target `server`) then runs over the
suite's Thrift server (tests/conftest.py, inside this worker's JVM), so no
third JVM competes with the two test workers for the machine's two cores:
dbt runs in this process through dbtRunner, and as separate `dbt` processes
for two simultaneous invocations, talking to the server only over Thrift.
The sources are written over Thrift too, by the example's own loader. The
example's schema.yml tests every model with ivm_matches_query, the oracle.
"""

from __future__ import annotations

import importlib.util
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dbt.adapters.factory import reset_adapters
from dbt.cli.main import dbtRunner

from dbt.adapters.spark_ivm.runtime import server

pytestmark = pytest.mark.spark

PROJECT_DIR = Path(__file__).resolve().parents[2] / "integration_tests"


def _example():
    """integration_tests/scripts/example.py (a script, not a package), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "spark_ivm_example", PROJECT_DIR / "scripts" / "example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class ThriftSql:
    """The example loader's `spark.sql`, sent over one Thrift connection."""

    def __init__(self, port: int) -> None:
        from pyhive import hive

        self._connection = hive.connect(host=server.DEFAULT_HOST, port=port, username="dbt")

    def sql(self, statement: str, /) -> None:
        cursor = self._connection.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()

    def query(self, statement: str, /) -> list[tuple]:
        cursor = self._connection.cursor()
        try:
            cursor.execute(statement)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def close(self) -> None:
        self._connection.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((server.DEFAULT_HOST, 0))
        return int(probe.getsockname()[1])


# In scripts/test-extended only: the README's command ran 29 minutes (2026-12-03, fresh clone, 75 s here); the Thrift slice keeps dbt over a real Thrift server, the one started in the worker's JVM.
@pytest.mark.extended
def test_the_standalone_server_starts_serves_delta_and_stops(tmp_path):
    """The local server of docs/server-mode.md: Delta Lake with change feeds, over Thrift only."""
    from pyhive import hive

    runtime = tmp_path / "thrift-server"
    port = _free_port()
    process = server.start(runtime, port)
    try:
        connection = hive.connect(host=server.DEFAULT_HOST, port=port, username="dbt")
        cursor = connection.cursor()
        try:
            cursor.execute(
                "CREATE TABLE standalone_check (k INT) USING DELTA "
                "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )
            cursor.execute("INSERT INTO standalone_check VALUES (1), (2)")
            cursor.execute("DELETE FROM standalone_check WHERE k = 1")
            cursor.execute("SELECT k, _change_type FROM table_changes('standalone_check', 1)")
            assert sorted(cursor.fetchall()) == [(1, "delete"), (1, "insert"), (2, "insert")]
        finally:
            cursor.close()
            connection.close()
    finally:
        stopped = server.stop(runtime)
    assert stopped == process.pid
    # Raises TimeoutExpired if the JVM outlived the stop.
    process.wait(timeout=60)
    with pytest.raises(OSError):
        socket.create_connection((server.DEFAULT_HOST, port), timeout=2).close()
    # Everything it wrote stays under its runtime directory.
    assert (runtime / "warehouse" / "standalone_check" / "_delta_log").is_dir()


@pytest.fixture(scope="module")
def thrift_port(thrift_server, monkeypatch_module):
    """The suite's Thrift server, named to the example's `server` target through its env vars."""
    monkeypatch_module.setenv("SPARK_IVM_THRIFT_HOST", "127.0.0.1")
    monkeypatch_module.setenv("SPARK_IVM_THRIFT_PORT", str(thrift_server))
    return thrift_server


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def example_schemas(spark):
    """The example's schemas live in the worker's shared warehouse: dropped afterwards."""
    yield
    for schema in ("ivm_example", "shop_raw"):
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="module")
def example_sources(thrift_port, example_schemas):
    """The example's sources, written over Thrift."""
    sql = ThriftSql(thrift_port)
    try:
        _example().create_sources(sql, random.Random(7))
    finally:
        sql.close()
    return thrift_port


def _example_args(run_dir: Path, target: str = "server") -> list[str]:
    """dbt's options for the example (over the server by default), with `run_dir` for its files."""
    return [
        "--project-dir",
        str(PROJECT_DIR),
        "--profiles-dir",
        str(PROJECT_DIR),
        "--target",
        target,
        "--target-path",
        str(run_dir / "target"),
        "--log-path",
        str(run_dir / "logs"),
    ]


def _build(tmp_path: Path, target: str = "server") -> list:
    try:
        result = dbtRunner().invoke(["build", *_example_args(tmp_path, target)])
    finally:
        # dbt keeps the adapter an invocation registered (here: the example's
        # `server` target) and registers no other of the same type after it:
        # left in place, the next test class's project would talk to this
        # module's server, stopped by then.
        reset_adapters()
    assert result.success, f"dbt build failed: {result.exception}"
    return list(result.result.results)


def _codes(results: list) -> dict[str, str]:
    """Each model's adapter response code (BUILD, INCREMENTAL, ...)."""
    return {
        r.node.name: str((r.adapter_response or {}).get("code"))
        for r in results
        if r.node.resource_type == "model"
    }


def _failed_tests(results: list) -> list[str]:
    return [r.node.name for r in results if r.node.resource_type == "test" and r.status != "pass"]


# In scripts/test-extended and scripts/test-matrix (issue 55: the worked
# example at both ends of the supported Spark range, in both modes): the
# example's `embedded` target in this worker's process, whose SparkSession
# dbt's session method shares (its warehouse is the suite's, whatever the
# target's runtime directory), loaded by the example's own functions.
@pytest.mark.extended
def test_worked_example_refreshes_incrementally_in_session_mode(spark, example_schemas, tmp_path):
    example, rng = _example(), random.Random(7)
    example.create_sources(spark, rng)
    first = _build(tmp_path, "embedded")
    assert set(_codes(first).values()) == {"BUILD"}, _codes(first)
    assert not _failed_tests(first)
    example.apply_batch(spark, random.Random(8))
    second = _build(tmp_path, "embedded")
    assert set(_codes(second).values()) == {"INCREMENTAL"}, _codes(second)
    assert not _failed_tests(second)


# In scripts/test-extended: the README's command runs the same example over a
# real cluster's Thrift server (test_cluster.py), which this one's in-process
# server stands in for.
@pytest.mark.extended
def test_worked_example_refreshes_incrementally_over_thrift(example_sources, tmp_path):
    example, rng = _example(), random.Random(8)
    sql = ThriftSql(example_sources)
    try:
        first = _build(tmp_path)
        assert set(_codes(first).values()) == {"BUILD"}, _codes(first)
        assert not _failed_tests(first)
        assert len([r for r in first if r.node.resource_type == "test"]) >= len(_codes(first))

        example.apply_batch(sql, rng)
        second = _build(tmp_path)
        assert set(_codes(second).values()) == {"INCREMENTAL"}, _codes(second)
        assert not _failed_tests(second)
    finally:
        sql.close()


def _dbt_process(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    """`dbt <args>` on the example as a process of its own: a second dbt invocation."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("dbt")), *args, *_example_args(tmp_path / name)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# In scripts/test-extended only: two refreshes of one model at once are
# tested in-process in the README's command (test_concurrent_refresh.py);
# this is the same race between two dbt processes over a server.
@pytest.mark.extended
def test_two_dbt_invocations_refreshing_one_model_at_once(example_sources, tmp_path):
    """Two `dbt run`s of the same model started together: one applies the change,
    the other finds nothing left to apply or fails cleanly; the model has the
    change exactly once."""
    model = "revenue_by_customer"
    # Built first (or already built by the test above): the race is between
    # two incremental refreshes, not two first builds.
    built = _dbt_process(tmp_path, "build", "run", "--select", model)
    output = built.communicate(timeout=600)[0]
    assert built.returncode == 0, output[-3000:]
    sql = ThriftSql(example_sources)
    try:
        _example().apply_batch(sql, random.Random(11))
    finally:
        sql.close()
    runs = [_dbt_process(tmp_path, f"run{i}", "run", "--select", model) for i in (1, 2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    outcomes = []
    for run, output in zip(runs, outputs):
        if run.returncode == 0:
            outcomes.append("no_change" if "IVM no changes" in output else "applied")
        else:
            assert "another refresh of this model" in output, output[-3000:]
            outcomes.append("refused")
    print(f"two simultaneous refreshes: {outcomes}")
    assert sorted(outcomes) in (["applied", "no_change"], ["applied", "refused"]), outcomes
    # The change is in the model once: its ivm_matches_query test recomputes the query.
    check = _dbt_process(tmp_path, "test", "test", "--select", model)
    output = check.communicate(timeout=600)[0]
    assert check.returncode == 0, output[-3000:]
