"""A Spark session of its own for each open connection of the embedded runtime.

dbt-spark's ``method: session`` runs every statement of every dbt thread in
the process's one SparkSession (``SparkSession.builder...getOrCreate()``,
called again for each statement). Session confs are then shared by all of
them, and two confs matter to a refresh:

- the commit metadata set for one commit (``delta.confs.USER_METADATA_CONF``) is
  written into any commit another thread of the process makes meanwhile;
- the version of the session's last commit (``delta.confs.LAST_COMMIT_CONF``) may be
  another thread's, so the state's version after a refresh's commit had to be
  read from its history: a ``DESCRIBE HISTORY``, one Spark job, 0.26-0.28 s on
  a 1,000-row table, where reading the conf takes 0.02 s (measured 2026-11-30).

Here each connection dbt opens takes a session of its own
(``SparkSession.newSession``: the same SparkContext, metastore, Delta logs
and cached data, with confs, temporary views and a current database of its
own), as a Spark Thrift Server gives each of its connections. Sessions are
kept for the next connection when a connection closes, so their number stays
that of the connections open at once; one on which a statement failed is
dropped instead, as a session that may hold a conf its failed statement left.
A kept session's temporary views are dropped first: the next connection must
find none, as a new server session would. dbt-spark's incremental
materialization leaves ``<model>__dbt_tmp`` behind, and Spark lists a
temporary view under every schema with no schema of its own, which breaks a
later connection's ``dbt docs generate`` ("'NoneType' object has no attribute
'lower'" in dbt-core's catalog).

Each session also has a scheduler pool of its own (``SCHEDULER_POOL``, under
the runtime's fair scheduler, ``embedded.py``): the Spark jobs of one
connection's statements then share the cores with those of the others
instead of waiting for every task of the jobs submitted before them.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from dbt.adapters.spark.session import Connection, Cursor, SessionConnectionWrapper
from dbt_common.exceptions import DbtRuntimeError
from pyspark.errors import AnalysisException

# Idle sessions, each with its scheduler pool, by the profile's
# server_side_parameters they were made with.
_IDLE: dict[tuple[tuple[str, str], ...], list[tuple[Any, str]]] = {}
_IDLE_LOCK = threading.Lock()

# The thread-local Spark property that puts a thread's jobs in a scheduler
# pool; a pool named for the first time is made with Spark's defaults (FIFO
# within it, weight 1), and the pools share the cores fairly.
SCHEDULER_POOL = "spark.scheduler.pool"
_POOL_NUMBERS = itertools.count(1)


def _new_session(parameters: Mapping[str, str]) -> Any:
    """A new session of the process's SparkContext, with `parameters` set on it."""
    from pyspark.sql import SparkSession

    # What dbt-spark's cursor runs before each statement: the first call in
    # the process starts Spark with every parameter.
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in parameters.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate().newSession()
    # A new session starts from the SparkContext's configs; a parameter that
    # can change at run time may have been given after Spark started (by
    # another profile in the same process), so it is set on the session too.
    for key, value in parameters.items():
        if session.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


def _drop_temporary_views(session: Any) -> None:
    """Drop (and so uncache) every temporary view of `session`.

    Read from the session's catalog in the JVM: no Spark job and no metastore
    call, where SHOW TABLES lists the current database's tables too.
    """
    views = session._jsparkSession.sessionState().catalog().listLocalTempViews("*").iterator()
    while views.hasNext():
        session.catalog.dropTempView(views.next().table())


class OwnSessionConnection(Connection):
    """dbt-spark's session Connection, with a SparkSession no other connection uses."""

    def __init__(self, *, server_side_parameters: Mapping[str, str] | None = None) -> None:
        super().__init__(server_side_parameters=dict(server_side_parameters or {}))
        self._key = tuple(sorted(self.server_side_parameters.items()))
        with _IDLE_LOCK:
            idle = _IDLE.get(self._key)
            kept = idle.pop() if idle else None
        if kept is not None and kept[0]._jsparkSession.sparkContext().isStopped():
            kept = None  # kept from a Spark application that has since stopped
        if kept is None:
            # A pool per session, not per connection: sessions are kept for
            # the next connection, so the pools number those open at once.
            kept = (_new_session(self.server_side_parameters), f"dbt_{next(_POOL_NUMBERS)}")
        self.session, self.pool = kept
        self.failed = False
        self._closed = False

    def cursor(self) -> Cursor:
        return OwnSessionCursor(self)

    def close(self) -> None:
        """Keep the session for the next connection, unless a statement on it failed."""
        if self._closed:
            return
        self._closed = True
        if self.failed:
            return
        try:
            _drop_temporary_views(self.session)
        except Exception:  # noqa: BLE001 - e.g. its Spark application stopped: not kept, as a failed one
            return
        with _IDLE_LOCK:
            _IDLE.setdefault(self._key, []).append((self.session, self.pool))


# dbt's query comment names the node a statement runs for.
_QUERY_COMMENT = re.compile(r"^\s*/\*(?P<comment>.*?)\*/", re.DOTALL)
_NODE_ID = re.compile(r'"node_id":\s*"(?P<node>[^"]+)"')
_TARGET = re.compile(r'"target_name":\s*"(?P<target>[^"]+)"')
DESCRIPTION_CHARACTERS = 120


def job_description(sql: str) -> str:
    r"""A statement's Spark job description: its dbt node and target, then its first words.

    >>> job_description('/* {"node_id": "model.p.m", "target_name": "dev"} */\nMERGE INTO  t USING s')
    'model.p.m (dev): MERGE INTO t USING s'
    >>> job_description("SHOW TABLES")
    'SHOW TABLES'
    """
    found = _QUERY_COMMENT.match(sql)
    statement = " ".join(sql[found.end() :].split()) if found else " ".join(sql.split())
    statement = statement[:DESCRIPTION_CHARACTERS]
    node = _NODE_ID.search(found.group("comment")) if found else None
    if node is None:
        return statement
    target = _TARGET.search(found.group("comment")) if found else None
    where = f" ({target.group('target')})" if target else ""
    return f"{node.group('node')}{where}: {statement}"


class OwnSessionCursor(Cursor):
    """dbt-spark's session Cursor, running statements in its connection's session."""

    def __init__(self, connection: OwnSessionConnection) -> None:
        super().__init__(server_side_parameters=connection.server_side_parameters)
        self._connection = connection

    @contextlib.contextmanager
    def _marking_failure(self) -> Iterator[None]:
        """A statement that fails marks the connection, so its session is not kept."""
        try:
            yield
        except BaseException:
            self._connection.failed = True
            raise

    def execute(self, sql: str, *parameters: Any) -> None:
        if parameters:
            sql = sql % parameters
        with self._marking_failure():
            try:
                # Set on this thread's jobs, so the Spark UI and the event log
                # tell which model each ran for (bench/tpch_bench/cpu_profile.py),
                # and so they run in this connection's scheduler pool.
                context = self._connection.session.sparkContext
                context.setJobDescription(job_description(sql))
                context.setLocalProperty(SCHEDULER_POOL, self._connection.pool)
                self._df = self._connection.session.sql(sql)
            except AnalysisException as exc:  # as dbt-spark's session cursor reports it
                raise DbtRuntimeError(str(exc)) from exc

    def fetchall(self) -> Any:
        with self._marking_failure():
            return super().fetchall()

    def fetchone(self) -> Any:
        with self._marking_failure():
            return super().fetchone()


class OwnSessionWrapper(SessionConnectionWrapper):
    """The connection handle dbt holds; closing it hands its session back."""

    handle: OwnSessionConnection

    def close(self) -> None:
        super().close()
        self.handle.close()
