"""What the connection's Spark is: its Spark and Delta Lake versions and its parallelism.

Asked once per Spark the process talks to (the embedded runtime, or a
Thrift server's host and port), with one SQL statement, so it reads the
same over every connection method: Spark's `version()`, Delta's version
through `reflect('io.delta.package', 'VERSION')` (the `VERSION` of Delta's
package object, a static method every Delta release has), and how many
tasks the engine runs at once, counted as the partitions of a `RANGE`
without a partition count (Spark splits it into its default parallelism:
the cores of a local master, or of a cluster's executors).

Where a statement needs a newer Spark or Delta feature, the refresh asks
`Engine` and uses the older form where it must; how many shuffle
partitions a change runs in starts from `parallelism`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from ivm_compiler.sql import DIALECT

Version = tuple[int, ...]

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> Version | None:
    """The leading `major.minor[.patch]` of a version string, or None.

    >>> parse_version("4.0.1 29434ea766b0fc3c3bf6eaadb43a8f931133649e")
    (4, 0, 1)
    >>> parse_version("3.3.2")
    (3, 3, 2)
    >>> parse_version("4.1") , parse_version(None), parse_version("unknown")
    ((4, 1, 0), None, None)
    """
    match = _VERSION.match((text or "").strip())
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


def shown(version: Version | None) -> str:
    """A version as people write it; "unknown" for None.

    >>> shown((3, 5, 9)), shown(None)
    ('3.5.9', 'unknown')
    """
    return ".".join(map(str, version)) if version is not None else "unknown"


@dataclass(frozen=True)
class Engine:
    """The Spark and Delta Lake a connection runs statements on."""

    spark: Version
    # None where Delta's package object could not be read (an engine that
    # does not load Delta's classes where SQL functions are resolved).
    delta: Version | None
    # Tasks the engine runs at once (Spark's default parallelism).
    parallelism: int

    def describe(self) -> str:
        """One line for logs and ivm_explain.

        >>> Engine((4, 0, 1), (4, 0, 1), 2).describe()
        'Spark 4.0.1, Delta Lake 4.0.1, parallelism 2'
        """
        return f"Spark {shown(self.spark)}, Delta Lake {shown(self.delta)}, parallelism {self.parallelism}"


# Rows of the RANGE whose partitions are counted: enough for every
# partition of any default parallelism up to it to hold one.
_RANGE_ROWS = 4096


def probe(with_delta: bool = True) -> str:
    """The one statement that asks a Spark what it is.

    >>> print(probe())
    SELECT VERSION() AS `spark`, REFLECT('io.delta.package', 'VERSION') AS `delta`, (SELECT COUNT(DISTINCT `p`) FROM (SELECT SPARK_PARTITION_ID() AS `p` FROM RANGE(0, 4096))) AS `parallelism`
    """
    # Spark refuses a nondeterministic expression inside an aggregate, so
    # the partition id is projected first and counted outside.
    partitions = exp.select(
        exp.alias_(exp.Anonymous(this="SPARK_PARTITION_ID"), "p", quoted=True)
    ).from_(
        exp.Table(
            this=exp.Anonymous(
                this="RANGE",
                expressions=[exp.Literal.number(0), exp.Literal.number(_RANGE_ROWS)],
            )
        )
    )
    parallelism = exp.select(
        exp.Count(this=exp.Distinct(expressions=[exp.column("p", quoted=True)]))
    ).from_(partitions.subquery())
    delta = exp.Anonymous(
        this="REFLECT",
        expressions=[exp.Literal.string("io.delta.package"), exp.Literal.string("VERSION")],
    )
    columns = [
        exp.alias_(exp.Anonymous(this="VERSION"), "spark", quoted=True),
        exp.alias_(delta if with_delta else exp.null(), "delta", quoted=True),
        exp.alias_(exp.Subquery(this=parallelism), "parallelism", quoted=True),
    ]
    return exp.select(*columns).sql(dialect=DIALECT)


def from_answer(row: Sequence[Any]) -> Engine:
    """The Engine of probe()'s one row.

    >>> from_answer(["3.5.9 abc", "3.3.2", 8])
    Engine(spark=(3, 5, 9), delta=(3, 3, 2), parallelism=8)
    """
    spark = parse_version(str(row[0]))
    if spark is None:
        raise ValueError(f"Spark answered version() with {row[0]!r}, not a version")
    return Engine(
        spark=spark,
        delta=parse_version(str(row[1])) if row[1] is not None else None,
        parallelism=max(1, int(row[2] or 1)),
    )


_KNOWN: dict[Hashable, Engine] = {}
_LOCK = threading.Lock()


def engine_of(key: Hashable, query: Callable[[str], Sequence[Sequence[Any]]]) -> Engine:
    """The Engine behind `key` (a Spark the process talks to), asked the first time only.

    `query` runs a statement and returns its rows. Where REFLECT is refused
    (Delta's classes not visible to SQL functions, or reflection disabled),
    the engine is asked again without it and its Delta version is unknown.
    """
    with _LOCK:
        known = _KNOWN.get(key)
    if known is not None:
        return known
    try:
        rows = query(probe())
    except Exception:  # noqa: BLE001 - the Delta version is optional; the second ask is not
        rows = query(probe(with_delta=False))
    found = from_answer(rows[0])
    with _LOCK:
        _KNOWN.setdefault(key, found)
        return _KNOWN[key]
