"""Credentials and connection manager for ``type: spark_ivm``.

Everything dbt-spark accepts in a profile is accepted here unchanged. For
``method: session`` the embedded runtime's Spark configs (Delta Lake, a local
master, warehouse and metastore under ``runtime_dir``) are filled in as
defaults beneath whatever ``server_side_parameters`` the profile sets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dbt.adapters.spark.connections import (
    SparkConnectionManager,
    SparkConnectionMethod,
    SparkCredentials,
)

from dbt.adapters.spark_ivm.runtime import RUNTIME_DIR_NAME, session_configs


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
    poll_interval: float = 0.1

    def __post_init__(self) -> None:
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
