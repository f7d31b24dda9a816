"""Server mode end to end: the standalone Thrift server and the worked example over it.

`python -m dbt.adapters.spark_ivm.server`'s start() launches a server of its
own (its own JVM, runtime directory and port); dbt runs the worked example
(integration_tests/, target `server`) in this process through dbtRunner,
talking to it only over Thrift. The sources are written over Thrift too, by
the example's own loader: that server's metastore is not this process's.
The example's schema.yml tests every model with ivm_matches_query, the oracle.
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

from dbt.adapters.spark_ivm import server

pytestmark = pytest.mark.spark

PROJECT_DIR = Path(__file__).resolve().parents[2] / "integration_tests"


def _example():
    """integration_tests/scripts/example.py (a script, not a package), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "spark_ivm_example", PROJECT_DIR / "scripts" / "example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
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

    def close(self) -> None:
        self._connection.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((server.DEFAULT_HOST, 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def thrift_port(tmp_path_factory):
    runtime = tmp_path_factory.mktemp("thrift-server")
    port = _free_port()
    server.start(runtime, port)
    try:
        yield port
    finally:
        server.stop(runtime)


def _example_args(run_dir: Path) -> list[str]:
    """dbt's options for the example over the server, with `run_dir` for its files."""
    return [
        "--project-dir",
        str(PROJECT_DIR),
        "--profiles-dir",
        str(PROJECT_DIR),
        "--target",
        "server",
        "--target-path",
        str(run_dir / "target"),
        "--log-path",
        str(run_dir / "logs"),
    ]


def _build(tmp_path: Path) -> list:
    try:
        result = dbtRunner().invoke(["build", *_example_args(tmp_path)])
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


def test_worked_example_refreshes_incrementally_over_thrift(thrift_port, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_IVM_THRIFT_HOST", server.DEFAULT_HOST)
    monkeypatch.setenv("SPARK_IVM_THRIFT_PORT", str(thrift_port))
    example, rng = _example(), random.Random(7)
    sql = ThriftSql(thrift_port)
    try:
        example.create_sources(sql, rng)
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


def test_two_dbt_invocations_refreshing_one_model_at_once(thrift_port, tmp_path, monkeypatch):
    """Two `dbt run`s of the same model started together: one applies the change,
    the other finds nothing left to apply or fails cleanly; the model has the
    change exactly once."""
    monkeypatch.setenv("SPARK_IVM_THRIFT_HOST", server.DEFAULT_HOST)
    monkeypatch.setenv("SPARK_IVM_THRIFT_PORT", str(thrift_port))
    example, rng = _example(), random.Random(11)
    sql = ThriftSql(thrift_port)
    try:
        example.apply_batch(sql, rng)
    finally:
        sql.close()
    model = "revenue_by_customer"
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
