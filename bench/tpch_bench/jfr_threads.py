"""What the driver's statement threads and the executors' task threads spend their samples on (JDK Flight Recorder).

thread_cpu.py tells how much CPU each kind of JVM thread used; this tells
what for. Record a run with `-XX:StartFlightRecording=filename=rec.jfr,settings=profile`
added to the runtime's driver options (a profiling run: the recording slows
it), then, for the window of one dbt invocation (times of day as the dbt
log gives them)::

    .venv/bin/python -m tpch_bench.jfr_threads rec.jfr 22:10:51 22:14:35

A statement thread's sample goes to the phase its stack is in: the first
of STATEMENT_CATEGORIES that any of its frames names (code generation
during planning counts as code generation, the metastore during analysis
as the metastore). A task thread's goes to the category of its innermost
frame that names one of EXECUTOR_CATEGORIES, so a sample in a hash
aggregate's generated code counts as generated code, not as the aggregate
around it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# Category -> substrings of a frame's class or method, per thread kind.
STATEMENT_CATEGORIES = (
    ("code generation (Janino)", ("janino", "codehaus", "CodeGenerator", "codegen.Generate")),
    ("Hive metastore", ("hive", "derby", "metastore", "datanucleus")),
    ("parsing", ("catalyst.parser", "antlr")),
    (
        "Delta log and snapshots",
        ("delta.Snapshot", "DeltaLog", "LogSegment", "DeltaHistoryManager"),
    ),
    ("optimization", ("catalyst.optimizer",)),
    ("analysis", ("catalyst.analysis", "Analyzer")),
    ("physical planning", ("SparkPlanner", "QueryPlanner", "SparkStrategies")),
)
EXECUTOR_CATEGORIES = (
    ("generated code", ("GeneratedClass",)),
    ("code generation (Janino)", ("janino", "codehaus")),
    ("hash aggregation", ("HashAggregate", "BytesToBytesMap", "ObjectAggregation")),
    ("Parquet reads", ("VectorizedParquet", "VectorizedColumnReader", "ParquetFileFormat")),
    ("Parquet writes", ("ParquetOutputWriter", "InternalParquetRecordWriter")),
    (
        "task (de)serialization",
        ("ObjectInputStream", "ObjectOutputStream", "JavaSerializer", "Kryo"),
    ),
    ("sorting", ("UnsafeExternalSorter", "UnsafeInMemorySorter", "RadixSort", "TimSort")),
    ("shuffle", ("ShuffleWriter", "ShuffleBlockFetcher", "ExternalSorter")),
    ("expressions outside generated code", ("catalyst.expressions",)),
)
STATEMENT_THREAD = re.compile(r"^Thread-\d+$")
EXECUTOR_THREAD = re.compile(r"^Executor task launch worker")


Categories = tuple[tuple[str, tuple[str, ...]], ...]


def innermost(frames: Iterable[str], categories: Categories) -> str:
    """The category of the innermost frame that names one, else "other".

    >>> innermost(["GeneratedClass$X.agg", "HashAggregateExec.doExecute"], EXECUTOR_CATEGORIES)
    'generated code'
    >>> innermost(["java.lang.Thread.run"], EXECUTOR_CATEGORIES)
    'other'
    """
    for frame in frames:
        for name, markers in categories:
            if any(marker in frame for marker in markers):
                return name
    return "other"


def phase(frames: list[str], categories: Categories) -> str:
    """The first category that any frame names, else "other".

    >>> phase(["java.util.HashMap.get", "catalyst.analysis.Analyzer.execute",
    ...        "hive.ql.metadata.Hive.getTable"], STATEMENT_CATEGORIES)
    'Hive metastore'
    """
    for name, markers in categories:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return "other"


def samples(recording: Path) -> Iterable[tuple[str, str, list[str]]]:
    """(time of day, thread name, frames innermost first) of each execution sample."""
    jfr = shutil.which("jfr") or str(Path(shutil.which("java") or "java").resolve().parent / "jfr")
    printed = subprocess.run(
        [jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(recording)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for event in printed.split("jdk.ExecutionSample {")[1:]:
        moment = re.search(r"startTime = (\d\d:\d\d:\d\d)", event)
        thread = re.search(r'sampledThread = "([^"]+)"', event)
        if moment is None or thread is None or "stackTrace = [" not in event:
            continue
        stack = event.split("stackTrace = [", 1)[1].split("]", 1)[0]
        frames = [line.strip() for line in stack.splitlines() if line.strip()]
        yield moment.group(1), thread.group(1), frames


def summary(recording: Path, start: str, end: str) -> str:
    counts = {"statement threads": Counter[str](), "executor task threads": Counter[str]()}
    for moment, thread, frames in samples(recording):
        if not start <= moment <= end:
            continue
        if STATEMENT_THREAD.match(thread):
            counts["statement threads"][phase(frames, STATEMENT_CATEGORIES)] += 1
        elif EXECUTOR_THREAD.match(thread):
            counts["executor task threads"][innermost(frames, EXECUTOR_CATEGORIES)] += 1
    lines = []
    for kind, counted in counts.items():
        total = sum(counted.values())
        lines.append(f"{kind}: {total} samples")
        for name, count in counted.most_common():
            lines.append(f"  {count:6d} {100 * count / max(total, 1):5.1f} %  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("start", help="HH:MM:SS, the window's start (the recording's clock)")
    parser.add_argument("end", help="HH:MM:SS, its end")
    args = parser.parse_args()
    print(summary(args.recording, args.start, args.end))


if __name__ == "__main__":
    main()
