"""connections.py: which connections `release()` keeps open for the thread's next node.

dbt closes a thread's connection after every node; over Thrift the plugin
keeps a healthy one (reuse_connections), never one on which a statement
failed, and never an embedded session's. The handles are stand-ins for
PyHive's connection wrapper: what is tested is the manager's bookkeeping.
"""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

import pytest
from dbt.adapters.contracts.connection import Connection, ConnectionState

from dbt.adapters.spark_ivm.connections import SparkIvmConnectionManager, SparkIvmCredentials

THRIFT = {"method": "thrift", "host": "127.0.0.1", "port": 10000, "user": "dbt", "schema": "s"}


class FakeHandle:
    """What dbt-spark's connection wrappers offer dbt: cursor, execute, close."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.closed = False
        self.statements: list[str] = []

    def cursor(self):
        return self

    def execute(self, sql, bindings=None):
        self.statements.append(sql)
        if self.fail:
            raise RuntimeError("the server went away")

    def close(self):
        self.closed = True

    def rollback(self):
        pass


def _manager_with(credentials: SparkIvmCredentials, handle: FakeHandle):
    profile = SimpleNamespace(credentials=credentials, query_comment=None)
    manager = SparkIvmConnectionManager(profile, multiprocessing.get_context("spawn"))
    connection = Connection(
        type="spark_ivm",
        name="model.p.first",
        state=ConnectionState.OPEN,
        transaction_open=True,
        handle=handle,
        credentials=credentials,
    )
    manager.set_thread_connection(connection)
    return manager, connection


def test_a_healthy_thrift_connection_stays_open_for_the_next_node():
    manager, connection = _manager_with(SparkIvmCredentials.from_dict(THRIFT), FakeHandle())
    manager.release()
    assert not connection.handle.closed
    assert connection.state == ConnectionState.OPEN
    assert connection.transaction_open is False
    # dbt names the kept connection for the next node without opening another.
    assert manager.set_connection_name("model.p.second") is connection
    assert connection.name == "model.p.second"
    manager.cleanup_all()
    assert connection.handle.closed


def test_a_thrift_connection_whose_statement_failed_is_closed():
    manager, connection = _manager_with(
        SparkIvmCredentials.from_dict(THRIFT), FakeHandle(fail=True)
    )
    with pytest.raises(RuntimeError, match="went away"):
        manager.add_query("select 1", auto_begin=False)
    manager.release()
    assert connection.handle.closed
    assert connection.state == ConnectionState.CLOSED


def test_reuse_connections_false_closes_after_every_node():
    credentials = SparkIvmCredentials.from_dict({**THRIFT, "reuse_connections": False})
    manager, connection = _manager_with(credentials, FakeHandle())
    manager.release()
    assert connection.handle.closed


def test_an_embedded_session_connection_is_closed_as_dbt_does():
    credentials = SparkIvmCredentials.from_dict(
        {"method": "session", "host": "localhost", "schema": "s", "runtime_dir": "/tmp/unused"}
    )
    manager, connection = _manager_with(credentials, FakeHandle())
    manager.release()
    assert connection.handle.closed
