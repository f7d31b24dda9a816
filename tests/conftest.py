"""Shared fixtures: one embedded Spark session (with Delta) for the whole test run.

dbt runs in-process (dbt-tests-adapter's `project` fixture and `run_dbt`), and
dbt-spark's session method reuses the process's SparkSession, so the JVM starts
once. Every layer that needs Spark uses the same runtime directory.

Server mode: a test class with `ivm_connection = "thrift"` (or every class,
with IVM_TEST_CONNECTION=thrift) gets a `method: thrift` profile instead. dbt
then talks to a Spark Thrift Server started inside this process's JVM over
the same SparkContext, so the server's sessions share the catalog and the
warehouse with the `spark` fixture (the tests' source writes and oracle keep
working) while every statement dbt runs goes over the wire, each connection in
its own server-side session, as against a cluster.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time

import pytest

pytest_plugins = ["dbt.tests.fixtures.project"]

RUNTIME_DIR = os.environ.get("SPARK_IVM_TEST_RUNTIME_DIR") or tempfile.mkdtemp(
    prefix="spark-ivm-tests-"
)

SESSION = "session"
THRIFT = "thrift"
CONNECTIONS = (SESSION, THRIFT)
# The connection of test classes that do not name one (`ivm_connection`).
DEFAULT_CONNECTION = os.environ.get("IVM_TEST_CONNECTION") or SESSION
if DEFAULT_CONNECTION not in CONNECTIONS:
    raise ValueError(
        f"IVM_TEST_CONNECTION={DEFAULT_CONNECTION!r}: expected one of {', '.join(CONNECTIONS)}"
    )

# Server-mode repeats of session-mode classes that the test command leaves out
# (`server_lane = "extended"` on the class): each passed over Thrift on its own,
# and together they add about 20 minutes. The test command keeps every refresh
# branch (TestIvmMaterializationOverThrift), concurrent refreshes and the
# standalone server's worked example (test_server_mode.py) over Thrift.
# IVM_SERVER_ALL=1 (or IVM_TEST_CONNECTION=thrift, which runs every class over
# Thrift) runs them too.
SERVER_ALL = os.environ.get("IVM_SERVER_ALL") == "1" or DEFAULT_CONNECTION == THRIFT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SERVER_ALL:
        return
    skip = pytest.mark.skip(
        reason="server-mode repeat of a session-mode class, left out of the test command "
        "for time (about 20 minutes for all): IVM_SERVER_ALL=1 runs it"
    )
    for item in items:
        if getattr(item.cls, "server_lane", None) == "extended":
            item.add_marker(skip)


# dbt-spark sets this on every connection it opens (both methods); the oracle
# session must evaluate queries the same way, whichever connection dbt uses.
ANSI_CONF = {"spark.sql.ansi.enabled": "false"}


def connection_of(request: pytest.FixtureRequest) -> str:
    """The connection a test class's dbt runs use: its `ivm_connection`, else the default."""
    connection = getattr(request.cls, "ivm_connection", None) or DEFAULT_CONNECTION
    if connection not in CONNECTIONS:
        raise ValueError(
            f"{request.cls.__name__}.ivm_connection={connection!r}: "
            f"expected one of {', '.join(CONNECTIONS)}"
        )
    return connection


@pytest.fixture(scope="class")
def dbt_profile_target(request: pytest.FixtureRequest) -> dict:
    if connection_of(request) == THRIFT:
        port = request.getfixturevalue("thrift_server")
        return {
            "type": "spark_ivm",
            "method": "thrift",
            "host": "127.0.0.1",
            "port": port,
            # The server authenticates nobody (hive.server2.authentication NONE),
            # but dbt-spark's thrift method requires a user name.
            "user": "dbt",
            # dbt-spark sleeps this many seconds whenever a statement has not
            # finished at its first poll (default 5): most of a refresh's
            # statements take well under a second.
            "poll_interval": 1,
            "schema": "dbt_spark_ivm_tests",
            "threads": 1,
        }
    return {
        "type": "spark_ivm",
        "method": "session",
        "host": "localhost",
        "schema": "dbt_spark_ivm_tests",
        "runtime_dir": RUNTIME_DIR,
        "threads": 1,
    }


@pytest.fixture(scope="session")
def spark():
    """The process's SparkSession, created with the embedded runtime's configs."""
    from pyspark.sql import SparkSession

    from dbt.adapters.spark_ivm.runtime import session_configs

    configs = {**session_configs(RUNTIME_DIR), **ANSI_CONF}
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in configs.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def thrift_server(spark):
    """A Spark Thrift Server inside this process's JVM, on a free loopback port; yields the port.

    Started only when a server-mode class runs. Each pytest-xdist worker is a
    process with its own JVM, so each has its own server and port.
    """
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
    starter = threading.Thread(
        target=lambda: started.append(
            server_class.startWithSparkSession(spark._jsparkSession, False)  # type: ignore[attr-defined]
        )
    )
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
