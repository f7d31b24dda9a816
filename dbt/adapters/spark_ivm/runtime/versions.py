"""The Spark lines the embedded runtime supports, and the Delta Lake release each runs with.

pyspark is an optional dependency (the `session` extra): a team that reaches
its cluster with `method: thrift` runs no local Spark. Where one is
installed, its major.minor picks the Delta Lake jars the embedded runtime
loads (Delta is built per Spark line, and a jar built for one line fails to
load classes on another). The table is docs/compatibility.md's; the ends of
the range are what `scripts/test-matrix` installs.

Standard library only, and no import of pyspark: `scripts/setup` and
`scripts/test-matrix` run this file before the package is installed
(`python versions.py default|oldest|newest` prints that line's pyspark).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata

DOCS = "docs/compatibility.md"
SESSION_EXTRA = "pip install 'dbt-spark-ivm[session]'"

Artifact = tuple[str, str, str]  # Maven group, artifact, version


@dataclass(frozen=True)
class SparkLine:
    """One supported pyspark line and the Delta Lake release the embedded runtime pairs with it."""

    spark: tuple[int, int]
    # The pyspark release of this line the project installs and tests
    # (scripts/setup for the default line, scripts/test-matrix for the ends).
    tested: str
    # The newest Delta Lake release Maven Central serves for this line.
    delta: str
    scala: str
    # Delta 4.1 on publishes delta-spark once per Spark line
    # (delta-spark_4.1_2.13, delta-spark_4.2_2.13); before, one per Scala version.
    delta_spark: str
    # Delta 4.1 on: delta-spark reads its logs through Delta Kernel, whose
    # jars it names as dependencies (Spark ships none of them).
    kernel: bool = False

    @property
    def name(self) -> str:
        """'3.5.x', as the docs and errors write a line."""
        return f"{self.spark[0]}.{self.spark[1]}.x"

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        """The jars the embedded runtime loads, fetched one by one (without their dependencies:
        Spark ships the rest, and a second copy of Spark's own jars on the classpath breaks it).

        >>> [a for _, a, _ in line_of("4.2.1").artifacts]
        ['delta-spark_4.2_2.13', 'delta-storage', 'delta-kernel-api', 'delta-kernel-defaults']
        >>> line_of("3.5.9").artifacts[0]
        ('io.delta', 'delta-spark_2.12', '3.3.3')
        """
        found = [
            ("io.delta", self.delta_spark, self.delta),
            ("io.delta", "delta-storage", self.delta),
        ]
        if self.kernel:
            found += [
                ("io.delta", "delta-kernel-api", self.delta),
                ("io.delta", "delta-kernel-defaults", self.delta),
            ]
        return tuple(found)


# Oldest first. Delta 4.4.1 is on PyPI but its jars are not on Maven Central
# (4.4.0 is the newest there, 2026-12-03). Delta 4.1.0-4.3.x built for Spark
# 4.1.0 fail to load on Spark 4.1.2 and later (Spark removed IgnoreCachedData
# and changed ParquetToSparkSchemaConverter's constructor; delta-io/delta
# issue 6867): 4.4.0's build for 4.1 loads on 4.1.4.
SUPPORTED = (
    SparkLine((3, 5), tested="3.5.9", delta="3.3.3", scala="2.12", delta_spark="delta-spark_2.12"),
    # Delta 4.0.1 is the newest Delta for Spark 4.0 (built against 4.0.1); the
    # line's newest pyspark patch release runs it.
    SparkLine((4, 0), tested="4.0.5", delta="4.0.1", scala="2.13", delta_spark="delta-spark_2.13"),
    SparkLine(
        (4, 1),
        tested="4.1.4",
        delta="4.4.0",
        scala="2.13",
        delta_spark="delta-spark_4.1_2.13",
        kernel=True,
    ),
    SparkLine(
        (4, 2),
        tested="4.2.1",
        delta="4.4.0",
        scala="2.13",
        delta_spark="delta-spark_4.2_2.13",
        kernel=True,
    ),
)
# The line scripts/setup installs (the README's commands, the benchmark).
DEFAULT = SUPPORTED[1]
OLDEST, NEWEST = SUPPORTED[0], SUPPORTED[-1]


class UnsupportedSpark(RuntimeError):
    """The installed pyspark is missing, or of a line no Delta Lake release here supports."""


def supported_names() -> str:
    """'3.5.x, 4.0.x, 4.1.x or 4.2.x'."""
    names = [line.name for line in SUPPORTED]
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def line_of(pyspark_version: str) -> SparkLine:
    """The supported line of a pyspark release, or UnsupportedSpark naming the supported ones.

    >>> line_of("4.0.5").delta
    '4.0.1'
    >>> try:
    ...     line_of("4.3.0")
    ... except UnsupportedSpark as error:
    ...     print(str(error)[:100])
    pyspark 4.3.0 is installed, but the embedded runtime (method: session) supports pyspark 3.5.x, 4.0.x
    """
    found = _major_minor(pyspark_version)
    for line in SUPPORTED:
        if line.spark == found:
            return line
    raise UnsupportedSpark(
        f"pyspark {pyspark_version} is installed, but the embedded runtime (method: session) "
        f"supports pyspark {supported_names()}, each with the Delta Lake release built for it "
        f"({DOCS}). Install a supported one, e.g. pip install 'pyspark=={NEWEST.tested}', or use "
        "method: thrift against a server of a supported Spark."
    )


def installed_pyspark() -> str:
    """The installed pyspark's version, read without importing pyspark (which starts nothing,
    but takes a second and pulls in its whole Python API).

    UnsupportedSpark when there is none: the message names the extra that brings it.
    """
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        pass
    # A pyspark that is on the path without pip's metadata (a Spark
    # distribution's python/ folder on PYTHONPATH) still says its version.
    try:
        from pyspark.version import __version__  # type: ignore[import-not-found]
    except ImportError:
        raise UnsupportedSpark(
            "method: session runs Spark inside dbt and needs pyspark, which is not installed. "
            f"Install it with {SESSION_EXTRA} (pyspark {supported_names()}; {DOCS}), or use "
            "method: thrift against a Spark Thrift Server, which needs no local Spark."
        ) from None
    return str(__version__)


def installed_line() -> SparkLine:
    """The supported line of the installed pyspark (UnsupportedSpark when none is, or it is not)."""
    return line_of(installed_pyspark())


def _main(argv: list[str]) -> int:
    """`python versions.py default|oldest|newest`: that line's pyspark release, for the scripts."""
    lines = {"default": DEFAULT, "oldest": OLDEST, "newest": NEWEST}
    if len(argv) != 1 or argv[0] not in lines:
        print(f"usage: versions.py {'|'.join(lines)}", file=sys.stderr)
        return 2
    print(lines[argv[0]].tested)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
