"""Where a dbt run's CPU goes: Spark's event log, its tasks' CPU summed per model and statement.

dbt's log times each statement from its start to its end, which under
several threads on two cores is mostly waiting for the other threads' jobs:
at warehouse scale 1500 the statements of a batch add up to the same 900 s
whatever a change saves (profile.py). The executors' CPU time does not
wait. Each statement's jobs carry the description the session cursor gives
them (runtime/sessions.job_description: the dbt node and target, then the
statement's first words), and the event log records every task's CPU time
under its stage, and every stage under its job.

Run with Spark's event log on, e.g. for the warehouse::

    scripts/warehouse ... --conf spark.eventLog.enabled=true --conf spark.eventLog.dir=/tmp/events
    .venv/bin/python -m tpch_bench.cpu_profile /tmp/events/<application dir or file> [--top 25]

prints the run's dbt invocations (consecutive jobs of one kind: models or
tests, of one target), each with its CPU seconds, then for each model
invocation the models and statements that used the most.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# runtime/sessions.job_description: "<node> (<target>): <statement>".
_DESCRIPTION = re.compile(
    r"^(?P<node>(?:model|test|seed|snapshot)\.\S+) \((?P<target>[^)]*)\): (?P<statement>.*)$"
)
# Delta describes the jobs it runs for a statement (a MERGE's file scans and
# rewrite, the files a query reads) "Delta: <the statement's description>:
# <its operation>"; they are the statement's. Left out until 2026-12-05,
# they were 97 of the warehouse batch's 223 executor CPU s (its MERGEs').
_DELTA_PREFIX = "Delta: "


# Task metrics and their units per second: CPU time in nanoseconds, run time
# (the task's wall time on its executor thread: CPU, I/O and waits) in milliseconds.
CPU, RUN = "Executor CPU Time", "Executor Run Time"
METRICS = {CPU: 1e9, RUN: 1e3}


@dataclass(frozen=True)
class Job:
    job_id: int
    submitted: int  # milliseconds since the epoch
    node: str
    target: str
    statement: str


@dataclass
class Invocation:
    """Consecutive jobs of one kind (models or tests) and one target: one dbt command."""

    kind: str
    target: str
    jobs: list[Job] = field(default_factory=list)
    cpu: dict[int, float] = field(default_factory=dict)  # job id -> CPU seconds

    @property
    def seconds(self) -> float:
        return sum(self.cpu.get(job.job_id, 0.0) for job in self.jobs)

    @property
    def wall(self) -> float:
        return (self.jobs[-1].submitted - self.jobs[0].submitted) / 1000 if self.jobs else 0.0


def log_lines(path: Path) -> Iterator[str]:
    """The event log's lines: one file, or Spark 4's directory of rolled files, in order.

    A file Spark compressed with zstd (its default) is read through the zstd
    command; `spark.eventLog.compress=false` writes plain JSON lines.
    """
    files = [path]
    if path.is_dir():
        rolled = [f for f in path.iterdir() if f.name.startswith("events_")]
        files = sorted(rolled, key=lambda f: int(f.name.split("_")[1]))
    for file in files:
        if file.suffix in (".zstd", ".zst"):
            if shutil.which("zstd") is None:
                raise SystemExit(
                    f"{file} is zstd-compressed and no zstd command is installed: "
                    "install zstd, or run with spark.eventLog.compress=false"
                )
            # A log still being written ends mid-frame: zstd then fails after
            # writing what it could decode, which is kept.
            decoded = subprocess.run(["zstd", "-dc", str(file)], capture_output=True, check=False)
            text = decoded.stdout.decode("utf-8", errors="replace")
            complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
            yield from complete.splitlines()
        else:
            with file.open(encoding="utf-8") as lines:
                yield from lines


def events(lines: Iterable[str]) -> Iterator[dict]:
    for line in lines:
        if line.strip():
            yield json.loads(line)


def read(lines: Iterable[str], metric: str = CPU) -> tuple[list[Job], dict[int, float]]:
    """The described jobs in submission order, and each job's tasks' seconds of `metric`."""
    jobs: list[Job] = []
    stage_job: dict[int, int] = {}
    cpu: dict[int, float] = defaultdict(float)
    for event in events(lines):
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            job_id = int(event["Job ID"])
            for stage in event.get("Stage IDs", []):
                stage_job.setdefault(int(stage), job_id)
            description = (event.get("Properties") or {}).get("spark.job.description") or ""
            if description.startswith(_DELTA_PREFIX):
                description = description[len(_DELTA_PREFIX) :].rpartition(": ")[0]
            found = _DESCRIPTION.match(description)
            if found is not None:
                jobs.append(
                    Job(
                        job_id,
                        int(event.get("Submission Time") or 0),
                        found["node"],
                        found["target"],
                        found["statement"],
                    )
                )
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            job_id = stage_job.get(int(event["Stage ID"]))
            if job_id is not None:
                cpu[job_id] += int(metrics.get(metric) or 0) / METRICS[metric]
    return jobs, dict(cpu)


def invocations(jobs: list[Job], cpu: dict[int, float]) -> list[Invocation]:
    """Jobs split where their kind (model or test) or target changes."""
    found: list[Invocation] = []
    for job in sorted(jobs, key=lambda j: (j.submitted, j.job_id)):
        kind = job.node.split(".", 1)[0]
        if not found or (found[-1].kind, found[-1].target) != (kind, job.target):
            found.append(Invocation(kind, job.target, cpu=cpu))
        found[-1].jobs.append(job)
    return found


def _statement_kind(statement: str) -> str:
    words = statement.split()
    head = " ".join(words[:2]).upper()
    for kind in ("CREATE OR", "MERGE INTO", "INSERT INTO", "INSERT OVERWRITE", "CACHE TABLE"):
        if head.startswith(kind):
            return kind
    return words[0].upper() if words else "?"


def render(invocation: Invocation, top: int, unit: str = "CPU s") -> str:
    by_node: dict[str, float] = defaultdict(float)
    by_statement: dict[tuple[str, str], float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for job in invocation.jobs:
        seconds = invocation.cpu.get(job.job_id, 0.0)
        node = job.node.rsplit(".", 1)[-1]
        by_node[node] += seconds
        by_statement[(node, job.statement)] += seconds
        by_kind[_statement_kind(job.statement)] += seconds
    heading = (
        f"{invocation.kind}s ({invocation.target}): {invocation.seconds:.1f} {unit} "
        f"over {invocation.wall:.1f} s of job submissions"
    )
    lines = [heading]
    lines.append(
        "  by statement kind: "
        + ", ".join(
            f"{kind} {seconds:.1f}"
            for kind, seconds in sorted(by_kind.items(), key=lambda i: -i[1])
        )
    )
    lines.append(f"  models, most CPU first (top {top}):")
    for node, seconds in sorted(by_node.items(), key=lambda i: -i[1])[:top]:
        lines.append(f"    {seconds:8.1f}  {node}")
    lines.append(f"  statements, most CPU first (top {top}):")
    for (node, statement), seconds in sorted(by_statement.items(), key=lambda i: -i[1])[:top]:
        lines.append(f"    {seconds:8.1f}  {node}: {statement[:90]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("event_log", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--run-time",
        action="store_true",
        help="sum the tasks' run time (CPU, I/O and waits on their executor thread) instead",
    )
    args = parser.parse_args(argv)
    jobs, cpu = read(log_lines(args.event_log), RUN if args.run_time else CPU)
    unit = "task s" if args.run_time else "CPU s"
    found = invocations(jobs, cpu)
    for index, invocation in enumerate(found, start=1):
        print(
            f"{index}. {invocation.kind}s ({invocation.target}): {len(invocation.jobs)} jobs, "
            f"{invocation.seconds:.1f} {unit}"
        )
    for invocation in found:
        if invocation.kind == "model":
            print()
            print(render(invocation, args.top, unit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
