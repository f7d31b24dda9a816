"""The embedded Spark runtime: a local SparkSession with Delta Lake enabled.

dbt-spark's ``method: session`` builds its SparkSession from the profile's
``server_side_parameters``. This module supplies the defaults that make that
session a working Delta Lake warehouse without any manual set-up, so a profile
only needs ``type: spark_ivm`` and ``method: session``. The test suite builds its
one shared session from the same function, so tests and users run the same
runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

from dbt.adapters.spark_ivm.runtime.versions import Artifact, SparkLine, installed_line

RUNTIME_DIR_NAME = ".spark_ivm"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def local_maven_repository() -> Path:
    """The Maven client's local repository (``~/.m2/repository`` unless overridden)."""
    override = os.environ.get("MAVEN_LOCAL_REPOSITORY")
    if override:
        return Path(override)
    return Path.home() / ".m2" / "repository"


def delta_jar_paths(
    line: SparkLine | None = None, repository: Path | None = None
) -> list[Path] | None:
    """Paths of `line`'s Delta jars (the installed pyspark's by default) in the local Maven
    repository, or None if any is missing."""
    line = line or installed_line()
    repository = repository or local_maven_repository()
    paths = []
    for group, artifact, version in line.artifacts:
        jar = repository.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")
        if not jar.is_file():
            return None
        paths.append(jar)
    return paths


def session_configs(runtime_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Spark configs for the embedded runtime, keeping all its files under ``runtime_dir``.

    The Delta jars are those of the installed pyspark's line (versions.py;
    UnsupportedSpark, naming the fix, when pyspark is missing or outside the
    supported lines), taken from the local Maven repository when the project's
    setup has fetched them there (no network at run time); otherwise Spark's own
    package resolution downloads them, so a user with internet and no Maven client
    can still run.
    """
    line = installed_line()
    root = Path(runtime_dir).resolve()
    configs = {
        "spark.master": "local[2]",
        "spark.app.name": "dbt-spark-ivm",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        ),
        # Derby writes derby.log into its system home, which is the cwd by default.
        # The parallel collector: G1's concurrent marking and refinement threads
        # took cores the tasks needed. On the warehouse at scale 1500 (2026-12-05,
        # warehouse-scale1500-batch60-warm-exp-gc-nosort.md against -warm-a81642a)
        # the collector's CPU fell from 38.4 to 14.7 s in a day's refresh and from
        # 18.2 to 6.8 s in the `table` build; the tests run with it too
        # (tests/conftest.py).
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={root} -Dlog4j2.configurationFile={LOG_CONFIG} -XX:+UseParallelGC"
        ),
        # Delta keeps the schema in its own log; the embedded Hive metastore would
        # otherwise reject (and log as an ERROR) the schema it is handed when a
        # Delta table is replaced.
        "spark.hadoop.hive.metastore.disallow.incompatible.col.type.changes": "false",
        # Each connection's jobs run in a scheduler pool of its own
        # (sessions.SCHEDULER_POOL), and the pools share the cores. Under
        # Spark's default FIFO scheduler a job's tasks waited for every task
        # of the jobs submitted before it: with four dbt threads a refresh's
        # small jobs (a DESCRIBE HISTORY, a probe of the change's keys)
        # waited behind another model's large stages, up to 29 s for a
        # DESCRIBE HISTORY of 0.1 s on the layered warehouse at scale 6000.
        "spark.scheduler.mode": "FAIR",
        # Local runs shuffle small data: Spark's default of 200 partitions makes
        # every aggregation pay for 200 tiny tasks.
        "spark.sql.shuffle.partitions": "4",
        # Delta rebuilds a table's snapshot from its log with this many tasks
        # (default 50), on every statement that touches a new version: on a
        # two-core local runtime that is 50 tiny tasks per read, and a quarter
        # of the test suite's time went there (measured: 2 partitions took the
        # window and strategy tests from 242 s to 200 s).
        "spark.databricks.delta.snapshotPartitions": "2",
        # The embedded runtime serves nobody else: keep its driver on loopback.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "4g",
    }
    jars = delta_jar_paths(line)
    if jars is not None:
        configs["spark.jars"] = ",".join(str(jar) for jar in jars)
        # Also on the driver's own classpath: a Thrift server in this JVM
        # (server.py, the tests' server mode) runs statements on threads that
        # did not always see spark.jars' class loader, and answered CREATE
        # TABLE ... USING DELTA with DATA_SOURCE_NOT_FOUND.
        configs["spark.driver.extraClassPath"] = os.pathsep.join(str(jar) for jar in jars)
    else:
        configs["spark.jars.packages"] = ",".join(
            f"{group}:{artifact}:{version}" for group, artifact, version in line.artifacts
        )
    return configs


def fetch_delta_jars(line: SparkLine | None = None) -> int:
    """Fetch `line`'s Delta jars (the installed pyspark's) into the local Maven repository
    with the Maven client.

    Run by scripts/setup and scripts/test-matrix; returns the Maven client's
    exit code, or 0 when the jars are already there.
    """
    import shutil
    import subprocess

    line = line or installed_line()
    if delta_jar_paths(line) is not None:
        return 0
    mvn = shutil.which("mvn")
    if mvn is None:
        print(
            "mvn not found: Spark will download the Delta jars itself on first use "
            "(spark.jars.packages), which needs internet access."
        )
        return 0
    for artifact in line.artifacts:
        completed = subprocess.run(_mvn_get(mvn, artifact), check=False)
        if completed.returncode != 0:
            return completed.returncode
    return 0


def _mvn_get(mvn: str, artifact: Artifact) -> list[str]:
    # One jar without its dependencies: Delta's POMs name Spark's own
    # artifacts (provided) and, from 4.1, Kernel's Hadoop and Jackson, which
    # pyspark ships in the versions its Spark needs.
    return [
        mvn,
        "-q",
        "-B",
        "dependency:get",
        f"-Dartifact={':'.join(artifact)}",
        "-Dtransitive=false",
    ]
