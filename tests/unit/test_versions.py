"""Issue 55: the install shape and the supported range (runtime/versions.py, embedded.py).

pyspark is the `session` extra's: importing the plugin, or a thrift profile,
imports none of it; a session profile without it, or with a pyspark outside
the supported lines, stops naming the fix; the embedded runtime's Delta jars
are those of the installed pyspark's line.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from dbt_common.exceptions import DbtRuntimeError

from dbt.adapters.spark_ivm.connections import SparkIvmCredentials
from dbt.adapters.spark_ivm.runtime import embedded, versions

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("pyspark", "delta", "scala", "delta_spark"),
    [
        ("3.5.9", "3.3.3", "2.12", "delta-spark_2.12"),
        ("3.5.0", "3.3.3", "2.12", "delta-spark_2.12"),
        ("4.0.1", "4.0.1", "2.13", "delta-spark_2.13"),
        ("4.0.5", "4.0.1", "2.13", "delta-spark_2.13"),
        ("4.1.4", "4.4.0", "2.13", "delta-spark_4.1_2.13"),
        ("4.2.1", "4.4.0", "2.13", "delta-spark_4.2_2.13"),
    ],
)
def test_each_supported_line_has_its_delta(pyspark, delta, scala, delta_spark):
    line = versions.line_of(pyspark)
    assert (line.delta, line.scala, line.delta_spark) == (delta, scala, delta_spark)
    assert line.artifacts[0] == ("io.delta", delta_spark, delta)
    assert all(version == delta for _, _, version in line.artifacts)


@pytest.mark.parametrize("pyspark", ["3.4.4", "4.3.0", "5.0.0", "nonsense"])
def test_a_pyspark_outside_the_range_names_the_supported_lines(pyspark):
    with pytest.raises(versions.UnsupportedSpark) as refused:
        versions.line_of(pyspark)
    message = str(refused.value)
    assert f"pyspark {pyspark} is installed" in message
    assert "3.5.x, 4.0.x, 4.1.x or 4.2.x" in message
    assert "method: thrift" in message


def test_the_ends_and_the_default_are_supported_lines():
    assert versions.OLDEST.spark == (3, 5) and versions.NEWEST.spark == (4, 2)
    assert versions.DEFAULT in versions.SUPPORTED
    for line in versions.SUPPORTED:
        assert versions.line_of(line.tested) is line


def test_the_scripts_read_the_lines_without_the_package(tmp_path):
    """scripts/setup and scripts/test-matrix run versions.py before anything is installed."""
    script = ROOT / "dbt" / "adapters" / "spark_ivm" / "runtime" / "versions.py"
    for name, line in [("default", versions.DEFAULT), ("newest", versions.NEWEST)]:
        answer = subprocess.run(
            [sys.executable, "-I", str(script), name],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )
        assert answer.stdout.strip() == line.tested


def test_pyspark_is_only_the_session_extra_s():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if "pyspark" in d or "[session" in d]
    session = project["optional-dependencies"]["session"]
    assert any(d.startswith("pyspark>=3.5,<4.3") for d in session), session


def test_importing_the_plugin_and_a_thrift_profile_import_no_pyspark():
    code = (
        "import sys\n"
        "import dbt.adapters.spark_ivm\n"
        "from dbt.adapters.spark_ivm.connections import SparkIvmCredentials\n"
        "SparkIvmCredentials.from_dict({'method': 'thrift', 'host': 'h', 'port': 1,"
        " 'user': 'u', 'schema': 's'})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "[]"


SESSION_PROFILE = {"method": "session", "host": "localhost", "schema": "s"}


def _installed(monkeypatch, version: str | None) -> None:
    """As if pyspark `version` (None: no pyspark at all) were installed."""

    def fake(name: str) -> str:
        if name != "pyspark":
            return metadata.version(name)
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(versions.metadata, "version", fake)
    if version is None:
        # A None entry makes `import pyspark.version` raise ImportError.
        monkeypatch.setitem(sys.modules, "pyspark.version", None)


def test_a_session_profile_without_pyspark_names_the_extra(monkeypatch):
    _installed(monkeypatch, None)
    with pytest.raises(DbtRuntimeError) as refused:
        SparkIvmCredentials.from_dict(SESSION_PROFILE)
    message = str(refused.value)
    assert "needs pyspark, which is not installed" in message
    assert "pip install 'dbt-spark-ivm[session]'" in message


def test_a_session_profile_with_an_unsupported_pyspark_names_the_supported_ones(monkeypatch):
    _installed(monkeypatch, "4.3.0")
    with pytest.raises(DbtRuntimeError, match=r"pyspark 4\.3\.0 is installed.*4\.2\.x"):
        SparkIvmCredentials.from_dict(SESSION_PROFILE)


@pytest.mark.parametrize("pyspark", ["3.5.9", "4.2.1"])
def test_the_runtime_loads_the_jars_of_the_installed_line(monkeypatch, tmp_path, pyspark):
    _installed(monkeypatch, pyspark)
    line = versions.line_of(pyspark)
    repository = tmp_path / "m2"
    monkeypatch.setenv("MAVEN_LOCAL_REPOSITORY", str(repository))
    # Not fetched: Spark's own resolution is asked for exactly the line's artifacts.
    configs = embedded.session_configs(tmp_path / "runtime")
    assert configs["spark.jars.packages"] == ",".join(":".join(a) for a in line.artifacts)
    # Fetched: the jars themselves, on both class paths.
    for group, artifact, version in line.artifacts:
        jar = repository.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")
        jar.parent.mkdir(parents=True)
        jar.touch()
    configs = embedded.session_configs(tmp_path / "runtime")
    assert "spark.jars.packages" not in configs
    jars = configs["spark.jars"].split(",")
    assert [Path(jar).name for jar in jars] == [f"{a}-{v}.jar" for _, a, v in line.artifacts]
    assert configs["spark.driver.extraClassPath"].split(":") == jars
