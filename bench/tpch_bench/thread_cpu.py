"""Where the machine's cores go during a run: CPU per process and JVM thread kind.

cpu_profile.py sums what Spark's executors spent on tasks. On two cores a
refresh batch keeps them busy with tasks barely more than half its wall
time; the rest is spent outside tasks: the driver's threads planning
statements and loading Delta snapshots, the garbage collector, the JIT,
and dbt's own Python (one interpreter, one core at most under the GIL).
Linux keeps every thread's CPU in /proc/<pid>/task/<tid>/stat, and the JVM
names its threads ("Executor task launch worker", "GC Thread#0", the py4j
connection threads "Thread-N" that run each statement on the driver), so
sampling those files tells the kinds apart without touching the run.

Sample next to a run, then summarise the windows between dbt invocations::

    .venv/bin/python -m tpch_bench.thread_cpu sample /tmp/cpu.jsonl &
    scripts/warehouse ...
    kill %1
    .venv/bin/python -m tpch_bench.thread_cpu summary /tmp/cpu.jsonl \\
        --log integration_tests/warehouse/logs/dbt.log

The summary gives, for each dbt invocation of the log, its wall time, the
CPU seconds of each kind and the share of the machine's core time they used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tpch_bench.profile import LOG_LINE

TICKS = os.sysconf("SC_CLK_TCK")

# A JVM thread's name (comm keeps its first 15 characters) -> its kind.
# Order matters: the first pattern that matches names the kind.
JVM_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("executor tasks", re.compile(r"^Executor task")),
    ("statements (py4j)", re.compile(r"^Thread-\d+$")),
    (
        "query stages",
        re.compile(r"^(ResultQueryStag|QueryStageCreat|subquery-|broadcast-exch|shuffle-exchang)"),
    ),
    ("garbage collection", re.compile(r"^(GC Thread|G1 |VM Thread)")),
    ("JIT compilation", re.compile(r"^C[12] Compiler")),
    (
        "scheduler",
        re.compile(r"^(dag-scheduler|task-result|dispatcher-|map-output|spark-listener)"),
    ),
)
OTHER_JVM = "other JVM threads"
EXITED_JVM = "JVM threads since exited"
PYTHON = "Python (dbt, compiler)"


def jvm_kind(name: str) -> str:
    """
    >>> jvm_kind("Executor task l"), jvm_kind("Thread-7"), jvm_kind("GC Thread#1")
    ('executor tasks', 'statements (py4j)', 'garbage collection')
    >>> jvm_kind("block-manager-s")
    'other JVM threads'
    """
    for kind, pattern in JVM_KINDS:
        if pattern.match(name):
            return kind
    return OTHER_JVM


def _cpu_ticks(stat_path: Path) -> int:
    # Fields after the parenthesised name: utime and stime are the 12th and
    # 13th of them (fields 14 and 15 of proc(5)).
    text = stat_path.read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "comm").read_text().strip()
            except OSError:
                continue


class Sampler:
    """CPU seconds used so far by each "<pid> <kind>", over every java and python process.

    Keyed by process: each dbt invocation of the embedded runtime starts a
    JVM of its own, whose counters start again from zero. Each thread's CPU
    is remembered from the last sample that saw it, so a pool thread that
    exits (Spark's task and exchange pools let idle threads go) keeps its
    kind; only what it spent since that sample falls to EXITED_JVM.
    """

    def __init__(self, own_pid: int) -> None:
        self.own_pid = own_pid
        self.threads: dict[tuple[int, int], tuple[str, int]] = {}

    def sample(self) -> dict[str, float]:
        seconds: dict[str, float] = defaultdict(float)
        for pid, comm in _processes():
            try:
                if comm == "java":
                    total = _cpu_ticks(Path(f"/proc/{pid}/stat"))
                    self._read_threads(pid)
                    seen = 0
                    for (owner, _), (kind, ticks) in self.threads.items():
                        if owner == pid:
                            seen += ticks
                            seconds[f"{pid} {kind}"] += ticks / TICKS
                    seconds[f"{pid} {EXITED_JVM}"] += max(total - seen, 0) / TICKS
                elif comm.startswith(("python", "dbt")) and pid != self.own_pid:
                    seconds[f"{pid} {PYTHON}"] += _cpu_ticks(Path(f"/proc/{pid}/stat")) / TICKS
            except OSError:
                continue  # the process ended between listing and reading
        return dict(seconds)

    def _read_threads(self, pid: int) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                ticks = _cpu_ticks(task / "stat")
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            self.threads[(pid, int(task.name))] = (jvm_kind(name), ticks)


def record(out: Path, every: float) -> None:
    sampler = Sampler(os.getpid())
    with out.open("a") as sink:
        while True:
            sink.write(json.dumps({"t": time.time(), "cpu": sampler.sample()}) + "\n")
            sink.flush()
            time.sleep(every)


@dataclass
class Window:
    label: str
    start: float
    end: float


def invocations(log_lines: Iterable[str], day: str) -> list[Window]:
    """dbt invocations of a debug log as (start, end) epoch seconds, the day given as YYYY-MM-DD.

    >>> lines = ["\\x1b[0m01:00:00.000000 [info ] [MainThread]: Running with dbt=1.11",
    ...          "\\x1b[0m01:00:09.500000 [debug] [MainThread]: Command end result",
    ...          "\\x1b[0m01:01:00.000000 [info ] [MainThread]: Running with dbt=1.11",
    ...          "\\x1b[0m01:01:30.000000 [info ] [MainThread]: Done."]
    >>> [(w.label, round(w.end - w.start, 1)) for w in invocations(lines, "2026-12-05")]
    [('1', 9.5), ('2', 30.0)]
    """
    windows: list[Window] = []
    for line in log_lines:
        found = LOG_LINE.match(line)
        if not found:
            continue
        moment = datetime.strptime(f"{day} {found['time']}", "%Y-%m-%d %H:%M:%S.%f")
        epoch = moment.replace(tzinfo=timezone.utc).timestamp()
        if "Running with dbt=" in line:
            windows.append(Window(str(len(windows) + 1), epoch, epoch))
        elif windows:
            windows[-1].end = epoch
    return windows


def usage(samples: list[dict], start: float, end: float) -> dict[str, float]:
    """CPU seconds per kind between the samples nearest the window's ends.

    A process that started within the window counts from zero.

    >>> s = [{"t": 0, "cpu": {"7 a": 1.0}}, {"t": 10, "cpu": {"7 a": 4.0, "9 a": 2.0, "9 b": 1.0}}]
    >>> usage(s, 0, 10)
    {'a': 5.0, 'b': 1.0}
    """
    before = min(samples, key=lambda s: abs(s["t"] - start))["cpu"]
    after = min(samples, key=lambda s: abs(s["t"] - end))["cpu"]
    spent: dict[str, float] = defaultdict(float)
    for key, seconds in after.items():
        spent[key.split(" ", 1)[1]] += seconds - before.get(key, 0.0)
    return dict(spent)


def render(windows: list[Window], samples: list[dict], cores: int) -> str:
    out = []
    for window in windows:
        wall = window.end - window.start
        if wall < 5:
            continue
        spent = usage(samples, window.start, window.end)
        busy = sum(spent.values())
        out.append(
            f"invocation {window.label}: {wall:.1f} s wall, {busy:.1f} CPU s "
            f"({busy / (wall * cores):.0%} of {cores} cores)"
        )
        for kind, seconds in sorted(spent.items(), key=lambda item: -item[1]):
            out.append(f"  {kind:<28} {seconds:8.1f} s  {seconds / (wall * cores):5.1%}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpch_bench.thread_cpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser(
        "sample", help="append a sample every --every seconds until killed"
    )
    sampling.add_argument("out", type=Path)
    sampling.add_argument("--every", type=float, default=2.0)
    summary = commands.add_parser("summary", help="CPU per kind for each dbt invocation of a log")
    summary.add_argument("samples", type=Path)
    summary.add_argument("--log", type=Path, required=True, help="the run's dbt debug log")
    summary.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.command == "sample":
        record(args.out, args.every)
        return 0
    samples = [json.loads(line) for line in args.samples.read_text().splitlines() if line]
    if not samples:
        print(f"{args.samples}: no samples", file=sys.stderr)
        return 1
    day = datetime.fromtimestamp(samples[0]["t"], timezone.utc).strftime("%Y-%m-%d")
    windows = [
        w
        for w in invocations(args.log.read_text(errors="replace").splitlines(), day)
        if w.end >= samples[0]["t"] and w.start <= samples[-1]["t"]
    ]
    print(render(windows, samples, args.cores))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
