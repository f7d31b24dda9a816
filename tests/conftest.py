"""Shared fixtures: one embedded Spark session (with Delta) for the whole test run.

dbt runs in-process (dbt-tests-adapter's `project` fixture and `run_dbt`), and
dbt-spark's session method reuses the process's SparkSession, so the JVM starts
once. Every layer that needs Spark uses the same runtime directory.

Modes: every integration test class under tests/functional runs in session
mode, and the classes of the Thrift slice (`thrift_slice = True`) also over
Thrift, their tests' ids ending in `[session]` and `[thrift]`; a class with
`thrift_slice = THRIFT` runs over Thrift only (the extended command runs every
class in both; see TEST_CONNECTIONS). In `thrift` the class's
dbt profile is `method: thrift`: dbt talks to a Spark Thrift Server started
inside this process's JVM over the same SparkContext, so the server's sessions
share the catalog and the warehouse with the `spark` fixture (the tests' source
writes and oracle keep working) while every statement dbt runs goes over the
wire, each connection in its own server-side session, as against a cluster.
IVM_TEST_CONNECTION=session (or thrift) runs one mode only, `session,thrift`
every class in both; a class that needs one mode names it in `ivm_connection`.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
import time

import pytest

pytest_plugins = ["dbt.tests.fixtures.project"]

# The golden fixtures' shared check (golden.assert_emitted) shows pytest's
# diff of the statement that differs, as an assert in a test module would.
pytest.register_assert_rewrite("tests.unit.golden")

RUNTIME_DIR = os.environ.get("SPARK_IVM_TEST_RUNTIME_DIR") or tempfile.mkdtemp(
    prefix="spark-ivm-tests-"
)

SESSION = "session"
THRIFT = "thrift"
CONNECTIONS = (SESSION, THRIFT)
# The modes the integration tests run in. Unset (the README's test command):
# every class in session mode, and the classes of the Thrift slice
# (`thrift_slice = True`) in both, or over Thrift only (`thrift_slice = THRIFT`,
# for a slow class whose session run repeats what other classes' session runs
# prove: the schema-change matrix). IVM_TEST_CONNECTION=session,thrift (the
# extended command, scripts/test-extended) runs every class in both;
# `session` or `thrift` runs one mode only.
_ASKED = os.environ.get("IVM_TEST_CONNECTION")
TEST_CONNECTIONS = tuple(mode.strip() for mode in (_ASKED or ",".join(CONNECTIONS)).split(","))
if not TEST_CONNECTIONS or any(mode not in CONNECTIONS for mode in TEST_CONNECTIONS):
    raise ValueError(
        f"IVM_TEST_CONNECTION={_ASKED!r}: expected {' or '.join(CONNECTIONS)}, or both comma "
        "separated"
    )
FUNCTIONAL_TESTS = os.path.join(os.path.dirname(__file__), "functional")

# Where the tests' Spark tasks run. `local` (the default): local[2], driver
# and executors in this process's JVM. `cluster` (scripts/test-cluster): a
# standalone master and two workers started from the installed pyspark
# (runtime/cluster.py), with this process's session as the cluster's driver, so every
# statement of the tests, of dbt in session mode and of the in-process Thrift
# server runs its tasks in executors in the workers' JVMs, while the sources'
# writes, the oracle and Spark's status store stay in process.
LOCAL = "local"
CLUSTER = "cluster"
SPARK_MASTER = os.environ.get("IVM_TEST_SPARK", LOCAL)
if SPARK_MASTER not in (LOCAL, CLUSTER):
    raise ValueError(f"IVM_TEST_SPARK={SPARK_MASTER!r}: expected {LOCAL} or {CLUSTER}")


def modes(thrift_slice: bool | str) -> tuple[str, ...]:
    """The connection modes of a test class (or module): out of the Thrift slice (False),
    in it (True), or in it over Thrift only (THRIFT)."""
    if _ASKED is not None:
        return TEST_CONNECTIONS
    if thrift_slice == THRIFT:
        return (THRIFT,)
    return CONNECTIONS if thrift_slice else (SESSION,)


def class_modes(cls: type | None) -> tuple[str, ...]:
    """The connection modes a test class runs in (see TEST_CONNECTIONS)."""
    pinned = getattr(cls, "ivm_connection", None)
    if pinned:
        return (pinned,)
    return modes(getattr(cls, "thrift_slice", False))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every dbt-driven test class under tests/functional in its modes (class_modes)."""
    if "dbt_profile_target" not in metafunc.fixturenames:
        return
    if not str(metafunc.definition.path).startswith(FUNCTIONAL_TESTS):
        return
    metafunc.parametrize("connection", class_modes(metafunc.cls), indirect=True, scope="class")


@pytest.fixture(scope="class")
def connection(request: pytest.FixtureRequest) -> str:
    """The connection mode of the class's dbt runs (`session` outside tests/functional)."""
    mode = getattr(request, "param", SESSION)
    if mode not in CONNECTIONS:
        raise ValueError(f"connection {mode!r}: expected one of {', '.join(CONNECTIONS)}")
    return mode


# The longest test scopes of the README's test command, longest first (its
# --durations=0 on 2026-11-29's machine; those of the extended command only
# among them). With --no-loadscope-reorder (scripts/test) xdist hands scopes
# to its workers in collection order, one at a time, so a long scope
# collected last would run alone at the end while the other worker idles;
# these are collected first instead, longest first.
LONGEST_FIRST = (
    "tests/functional/test_ivm_dag.py",
    "tests/functional/test_ivm_materialization.py::TestIvmMaterialization",
    "tests/functional/test_schema_changes.py",
    "tests/functional/test_random_joins.py::TestRandomJoinChanges",
    "tests/functional/test_random_outer_joins.py",
    "tests/functional/test_random_semi_joins.py",
    "tests/functional/test_join_states.py",
    "tests/functional/test_consistency_groups.py::TestGroupUnderConcurrentWriter",
    "tests/rules/test_delta_rules.py",
    "tests/functional/test_random_windows.py",
    "tests/functional/test_random_statistics.py",
    "tests/functional/test_consistency_groups.py::TestGroupAllOrNothing",
    "tests/functional/test_interrupted_refresh.py",
    "tests/functional/test_random_changes.py",
    "tests/functional/test_log_state.py",
    "tests/rules/test_log_rules.py",
    "tests/functional/test_server_mode.py",
    "tests/functional/test_join_key_bounds.py",
    "tests/functional/test_strategy.py",
    "tests/functional/test_random_joins.py::TestRandomNodeChanges",
    "tests/functional/test_cluster.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Collect the longest scopes first (LONGEST_FIRST); the rest keep their order."""

    def rank(item: pytest.Item) -> int:
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: the tests of a scope stay in their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadscope, with each mode of a class its own scope.

    loadscope keeps a class on one worker (its tests build on each other);
    a class's two modes are two independent projects, so they may run on
    different workers, which halves the longest scope.
    """
    from xdist.scheduler import LoadScopeScheduling

    if config.getoption("dist") != "loadscope":
        return None

    class LoadScopeAndModeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            params = nodeid.rpartition("[")[2].rstrip("]").split("-") if "[" in nodeid else []
            modes = [p for p in params if p in CONNECTIONS]
            return f"{scope}[{modes[0]}]" if modes else scope

    return LoadScopeAndModeScheduling(config, log)


# dbt-spark sets this on every connection it opens (both methods); the oracle
# session must evaluate queries the same way, whichever connection dbt uses.
ANSI_CONF = {"spark.sql.ansi.enabled": "false"}
# Test-only: the tests' tables hold a few rows, and generating and compiling
# Java for every new query shape costs more than running it interpreted.
# Whole-stage codegen off took the window and strategy tests from 200 s to
# 181 s; the expression-level codegen that remained (projections, orderings)
# was still 31 % of the JVM's sampled CPU on the random-changes test (a JFR
# profile: GenerateUnsafeProjection and Janino), and NO_CODEGEN (Spark's own
# test suites run in this mode) took that test from 118-127 s to 96 s and
# scripts/test from 27.5 to 22.6 minutes. Results do not depend on either;
# the benchmark (bench/), which checks its results at SF 1 and 5, keeps
# codegen on.
SPEED_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

# Test-only JVM options of each worker's Spark driver. A test JVM runs
# Spark's planner over hundreds of small, different queries, so HotSpot keeps
# finding new warm methods: on test_ivm_dag.py alone (2026-12-01, `jstat
# -compiler`) JIT compilation took 136-154 s of the JVM's 192-226 s of CPU.
# The C2 thresholds at ten times their defaults leave lukewarm methods in C1
# code and compile only the hot ones: compile time 136 -> 90 s at twice the
# defaults. The parallel collector (now the embedded runtime's own,
# runtime/embedded.py) drops G1's concurrent work; this heap holds
# little (GC took 3-4 s of that run either way). Three test files on two
# workers, as scripts/test runs them: 375-385 s as before, 342-365 s with the
# parallel collector, 330 s adding twice the thresholds, 299 s with ten
# times; C1 alone (TieredStopAtLevel=1) 443 s. The larger code cache gives
# the longer-profiled methods room: in a whole run their code reached 145 MB,
# past the 120 MB the default code cache keeps for it.
JIT_AND_GC_OPTIONS = (
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=10000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
    "-XX:ReservedCodeCacheSize=512m",
)


# dbt-tests-adapter's own `prefix` (of the test schema) and `project_root`
# do not depend on `connection`, so pytest would keep them for a class's
# second mode: that mode would reuse the first one's project directory, with
# the model files its tests renamed or edited. Depending on `connection`
# gives each mode its own.
@pytest.fixture(scope="class")
def prefix(connection: str) -> str:
    return f"test{time.time_ns() // 1000}{random.randint(0, 9999):04}_{connection}"


@pytest.fixture(scope="class")
def project_root(tmpdir_factory, connection: str):
    return tmpdir_factory.mktemp(f"project_{connection}")


def profile_target(connection: str, schema: str, thrift_port: int | None = None) -> dict:
    """A dbt target of `type: spark_ivm` for one connection mode (the Thrift one needs the port)."""
    if connection == THRIFT:
        return {
            "type": "spark_ivm",
            "method": "thrift",
            "host": "127.0.0.1",
            "port": thrift_port,
            # The server authenticates nobody (hive.server2.authentication NONE),
            # but dbt-spark's thrift method requires a user name.
            "user": "dbt",
            # The plugin's default (dbt-spark's is 5 s), spelled out: the
            # server-mode classes' time depends on it.
            "poll_interval": 0.1,
            "schema": schema,
            "threads": 1,
        }
    return {
        "type": "spark_ivm",
        "method": "session",
        "host": "localhost",
        "schema": schema,
        "runtime_dir": RUNTIME_DIR,
        "threads": 1,
    }


@pytest.fixture(scope="class")
def dbt_profile_target(request: pytest.FixtureRequest, connection: str) -> dict:
    port = request.getfixturevalue("thrift_server") if connection == THRIFT else None
    return profile_target(connection, "dbt_spark_ivm_tests", port)


@pytest.fixture(scope="session")
def spark_cluster():
    """With IVM_TEST_SPARK=cluster, the standalone cluster the session drives: (runtime, spec).

    None otherwise. Stopped (every JVM it started) at the end of the run.
    """
    if SPARK_MASTER != CLUSTER:
        yield None
        return
    from dbt.adapters.spark_ivm.runtime import cluster

    spec = cluster.ClusterSpec(master_port=_free_port(), master_ui_port=_free_port())
    with cluster.driven_by_this_process(RUNTIME_DIR, spec):
        yield RUNTIME_DIR, spec


@pytest.fixture(scope="session")
def spark(spark_cluster):
    """The process's SparkSession, created with the embedded runtime's configs (SPARK_MASTER)."""
    from pyspark.sql import SparkSession

    from dbt.adapters.spark_ivm.runtime.embedded import session_configs

    configs = {**session_configs(RUNTIME_DIR), **ANSI_CONF, **SPEED_CONF}
    if spark_cluster is not None:
        configs.update(spark_cluster[1].driver_configs())
    configs["spark.driver.extraJavaOptions"] += " " + " ".join(JIT_AND_GC_OPTIONS)
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in configs.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if spark_cluster is not None:
        # The session must really be the cluster's driver, not a local one
        # some earlier code created in this process.
        assert session.sparkContext.master == spark_cluster[1].master_url
    yield session
    if spark_cluster is not None:
        # Before the workers go: a driver whose executors vanish logs errors
        # and retries for a while.
        session.stop()


@pytest.fixture(scope="session")
def thrift_server(spark):
    """A Spark Thrift Server inside this process's JVM, on a free loopback port; yields the port.

    Started only when a server-mode class runs. Each pytest-xdist worker is a
    process with its own JVM, so each has its own server and port.
    """
    from dbt.adapters.spark_ivm.engine import parse_version

    port = _free_port()
    # These are spark-submit's --hiveconf, which sets them as JVM system
    # properties; HiveConf applies system properties over everything else.
    # Operation logs would go to /tmp/<user>/operation_logs,
    # shared with every other Spark process on the machine, and are not read.
    hive_confs = {
        "hive.server2.thrift.bind.host": "127.0.0.1",
        "hive.server2.thrift.port": str(port),
        "hive.server2.logging.operation.enabled": "false",
        "hive.exec.local.scratchdir": os.path.join(RUNTIME_DIR, "hive-scratch-local"),
        "hive.exec.scratchdir": os.path.join(RUNTIME_DIR, "hive-scratch"),
    }
    system = spark._jvm.java.lang.System  # type: ignore[union-attr]
    for key, value in hive_confs.items():
        system.setProperty(key, value)
    server_class = spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2  # type: ignore[union-attr]
    # startWithContext(SQLContext) is startWithSparkSession(session, exitOnError=true),
    # which would call System.exit, ending the whole pytest process, if the
    # server failed to start; here a failure is an exception of this fixture.
    # Started from a new Python thread, so from a new JVM thread (py4j gives
    # each Python thread its own): Spark reuses a Hive SessionState found on
    # the calling thread, and this thread's (made when dbt's session method
    # ran first) carries a HiveConf read before the properties above, so
    # the server listened on *:10000.
    started: list = []
    if parse_version(spark.version) >= (4, 0):
        start = lambda: server_class.startWithSparkSession(spark._jsparkSession, False)
    else:
        # Spark 3.5 (scripts/test-matrix's oldest end) has only
        # startWithContext: a server that fails to start exits the process.
        start = lambda: server_class.startWithContext(spark._jsparkSession.sqlContext())
    starter = threading.Thread(target=lambda: started.append(start()))
    starter.start()
    starter.join()
    if not started:
        raise RuntimeError("HiveThriftServer2 did not start (see the JVM's output above)")
    server = started[0]
    try:
        _wait_for_port(port, timeout=120)
        yield port
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Thrift server did not listen on port {port}") from None
            time.sleep(0.2)
