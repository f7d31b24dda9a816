"""Credentials and connection manager for ``type: spark_ivm``.

Everything dbt-spark accepts in a profile is accepted here unchanged. For
``method: session`` the embedded runtime's Spark configs (Delta Lake, a local
master, warehouse and metastore under ``runtime_dir``) are filled in as
defaults beneath whatever ``server_side_parameters`` the profile sets.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

from dbt.adapters.contracts.connection import ConnectionState
from dbt.adapters.spark.connections import (
    SparkConnectionManager,
    SparkConnectionMethod,
    SparkCredentials,
)
from dbt_common.exceptions import DbtRuntimeError

from dbt.adapters.spark_ivm.runtime.embedded import RUNTIME_DIR_NAME, session_configs
from dbt.adapters.spark_ivm.runtime.versions import UnsupportedSpark, installed_line


def _dbt_project_dir() -> str:
    """The dbt project being run: the runtime lives beside it, not in the caller's cwd."""
    try:
        from dbt.flags import get_flags

        project_dir = getattr(get_flags(), "PROJECT_DIR", None)
    except Exception:  # noqa: BLE001 - flags are unset when credentials are built outside a dbt run
        project_dir = None
    return os.path.abspath(project_dir or os.getcwd())


@dataclass
class SparkIvmCredentials(SparkCredentials):
    # Folder for the embedded runtime's warehouse and metastore (session method
    # only). Default: `.spark_ivm/` inside the dbt project directory.
    runtime_dir: str | None = None
    # dbt-spark's thrift method sleeps this many seconds between status polls
    # of a statement that has not finished at its first poll. Its default of
    # 5 s made a refresh (ten or more statements of a fraction of a second
    # each) take several times its session-mode time. Declared a float here
    # (dbt-spark's is an integer) so that the sleep can be shorter than a
    # statement: a status poll is one cheap Thrift call.
    poll_interval: float = 0.1  # type: ignore[assignment]  # dbt-spark's int: fractions of a second here
    # Thrift only: keep a thread's server session open from one node to the
    # next instead of closing it after every node (dbt's default). Opening a
    # server session builds a new Spark session state on the server, whose
    # first statement reloads every table's metadata, and closing it cleans
    # up its scratch directories: together 0.3-2 s per node on a local server.
    # A connection on which any statement failed is closed as before.
    reuse_connections: bool = True

    def __post_init__(self) -> None:
        if self.method == SparkConnectionMethod.SESSION:
            # Before dbt-spark's own check, whose message names dbt-spark's
            # extra: this plugin's brings a pyspark it supports, and a pyspark
            # outside the supported lines has no Delta Lake release to load.
            try:
                installed_line()
            except UnsupportedSpark as error:
                raise DbtRuntimeError(str(error)) from None
        super().__post_init__()
        if self.method == SparkConnectionMethod.SESSION:
            if not self.runtime_dir:
                self.runtime_dir = os.path.join(_dbt_project_dir(), RUNTIME_DIR_NAME)
            defaults = session_configs(self.runtime_dir)
            self.server_side_parameters = {**defaults, **self.server_side_parameters}

    @property
    def type(self) -> str:
        return "spark_ivm"

    def _connection_keys(self) -> tuple[str, ...]:
        return (*super()._connection_keys(), "runtime_dir")


class SparkIvmConnectionManager(SparkConnectionManager):
    TYPE = "spark_ivm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Handles on which a statement failed: their server session may hold
        # state a failed statement left behind (a commit-metadata SET whose
        # RESET never ran), or their transport may be broken. Never reused.
        self._failed_handles: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def open(cls, connection):
        """dbt-spark's open; in the embedded runtime, with a Spark session of the connection's own."""
        if connection.state == ConnectionState.OPEN:
            return connection
        connection = super().open(connection)
        if connection.credentials.method == SparkConnectionMethod.SESSION:
            from dbt.adapters.spark_ivm.runtime.sessions import (
                OwnSessionConnection,
                OwnSessionWrapper,
            )

            parameters = connection.credentials.server_side_parameters
            connection.handle = OwnSessionWrapper(
                OwnSessionConnection(server_side_parameters=parameters)
            )
        return connection

    def add_query(self, sql: str, *args: Any, **kwargs: Any):
        try:
            return super().add_query(sql, *args, **kwargs)
        except BaseException:
            connection = self.get_if_exists()
            if connection is not None and connection.handle is not None:
                with self.lock:
                    self._failed_handles.add(connection.handle)
            raise

    def release(self) -> None:
        """Close the thread's connection after its node, unless it is a healthy
        Thrift session kept for the thread's next node (`reuse_connections`).

        A kept connection stays in dbt's thread_connections: dbt renames it
        for the next node (ConnectionReused) and closes it in cleanup_all at
        the end of the invocation.
        """
        connection = self.get_if_exists()
        if connection is not None and self._keeps_open(connection):
            # What close() would do first: Spark has no transactions, so
            # dbt's ROLLBACK of the node's "transaction" is a no-op.
            connection.transaction_open = False
            return
        super().release()

    def _keeps_open(self, connection) -> bool:
        credentials = connection.credentials
        if credentials.method != SparkConnectionMethod.THRIFT:
            return False
        if not getattr(credentials, "reuse_connections", False):
            return False
        if connection.state != "open":
            return False
        with self.lock:
            return connection.handle not in self._failed_handles
