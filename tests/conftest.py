"""Shared fixtures: one embedded Spark session (with Delta) for the whole test run.

dbt runs in-process (dbt-tests-adapter's `project` fixture and `run_dbt`), and
dbt-spark's session method reuses the process's SparkSession, so the JVM starts
once. Every layer that needs Spark uses the same runtime directory.
"""

from __future__ import annotations

import os
import tempfile

import pytest

pytest_plugins = ["dbt.tests.fixtures.project"]

RUNTIME_DIR = os.environ.get("SPARK_IVM_TEST_RUNTIME_DIR") or tempfile.mkdtemp(
    prefix="spark-ivm-tests-"
)


@pytest.fixture(scope="class")
def dbt_profile_target() -> dict:
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

    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(RUNTIME_DIR).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
