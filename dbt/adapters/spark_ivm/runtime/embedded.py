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

# Delta 4.0.x is built against Spark 4.0.x; pyproject.toml pins pyspark to the
# matching release. Changing one of these means changing the other.
DELTA_VERSION = "4.0.1"
SCALA_BINARY_VERSION = "2.13"
DELTA_ARTIFACTS = (
    ("io.delta", f"delta-spark_{SCALA_BINARY_VERSION}", DELTA_VERSION),
    ("io.delta", "delta-storage", DELTA_VERSION),
)

RUNTIME_DIR_NAME = ".spark_ivm"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def local_maven_repository() -> Path:
    """The Maven client's local repository (``~/.m2/repository`` unless overridden)."""
    override = os.environ.get("MAVEN_LOCAL_REPOSITORY")
    if override:
        return Path(override)
    return Path.home() / ".m2" / "repository"


def delta_jar_paths(repository: Path | None = None) -> list[Path] | None:
    """Paths of the Delta jars in the local Maven repository, or None if any is missing."""
    repository = repository or local_maven_repository()
    paths = []
    for group, artifact, version in DELTA_ARTIFACTS:
        jar = repository.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")
        if not jar.is_file():
            return None
        paths.append(jar)
    return paths


def session_configs(runtime_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Spark configs for the embedded runtime, keeping all its files under ``runtime_dir``.

    The Delta jars are taken from the local Maven repository when the project's
    setup has fetched them there (no network at run time); otherwise Spark's own
    package resolution downloads them, so a user with internet and no Maven client
    can still run.
    """
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
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={root} -Dlog4j2.configurationFile={LOG_CONFIG}"
        ),
        # Delta keeps the schema in its own log; the embedded Hive metastore would
        # otherwise reject (and log as an ERROR) the schema it is handed when a
        # Delta table is replaced.
        "spark.hadoop.hive.metastore.disallow.incompatible.col.type.changes": "false",
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
    jars = delta_jar_paths()
    if jars is not None:
        configs["spark.jars"] = ",".join(str(jar) for jar in jars)
        # Also on the driver's own classpath: a Thrift server in this JVM
        # (server.py, the tests' server mode) runs statements on threads that
        # did not always see spark.jars' class loader, and answered CREATE
        # TABLE ... USING DELTA with DATA_SOURCE_NOT_FOUND.
        configs["spark.driver.extraClassPath"] = os.pathsep.join(str(jar) for jar in jars)
    else:
        configs["spark.jars.packages"] = ",".join(
            f"{group}:{artifact}:{version}" for group, artifact, version in DELTA_ARTIFACTS
        )
    return configs


def fetch_delta_jars() -> int:
    """Fetch the Delta jars into the local Maven repository with the Maven client.

    Run by scripts/setup; returns the Maven client's exit code, or 0 when the
    jars are already there.
    """
    import shutil
    import subprocess

    if delta_jar_paths() is not None:
        return 0
    mvn = shutil.which("mvn")
    if mvn is None:
        print(
            "mvn not found: Spark will download the Delta jars itself on first use "
            "(spark.jars.packages), which needs internet access."
        )
        return 0
    for group, artifact, version in DELTA_ARTIFACTS:
        completed = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:get",
                f"-Dartifact={group}:{artifact}:{version}",
                "-Dtransitive=false",
            ],
            check=False,
        )
        if completed.returncode != 0:
            return completed.returncode
    return 0
