"""One day's refresh of the layered warehouse, replayed from a snapshot under settings to compare (issue 54).

A whole warehouse run (`scripts/warehouse`, 55 minutes at scale 6000)
measures a lever once, beside runs of other commits made hours apart; its
batch's wall moved by 5-10 % between runs of the same code. This script
measures one day's `dbt run` of the ivm models again and again on the same
states and the same batch, so that variants can be alternated:

    cd bench
    # once: raw data and the first build, then a copy of the runtime
    PYTHONPATH=. ../.venv/bin/python micro/warehouse_batch_ab.py prepare \\
        --scale 1500 --batch-scale 60 --snapshot /tmp/wh-snapshot
    # each run: the snapshot restored, a fresh JVM warmed by the `table`
    # build (untimed), the day's batch committed, the ivm models' `dbt run` timed
    PYTHONPATH=. ../.venv/bin/python micro/warehouse_batch_ab.py run \\
        --scale 1500 --batch-scale 60 --snapshot /tmp/wh-snapshot \\
        --variant base= --out /tmp/ab.jsonl
    PYTHONPATH=. ../.venv/bin/python micro/warehouse_batch_ab.py run ... \\
        --variant "nowscg=spark.sql.codegen.wholeStage:false" --out /tmp/ab.jsonl
    PYTHONPATH=. ../.venv/bin/python micro/warehouse_batch_ab.py summary /tmp/ab.jsonl

`--day N` times day N's refresh instead, after days 1 to N-1 committed
and refreshed untimed (what a refresh learns from earlier ones: `auto`'s
estimates, a MIN/MAX refill, shows from the second day on).

A variant is `name=key:value;key:value`, Spark confs of the session (the
refresh's own SETs still apply to its statements and RESET to these). Each
run appends one JSON line: the `dbt run`'s wall, the CPU seconds of the
JVM's threads by kind (tpch_bench.thread_cpu) and of this process's
Python (dbt, the compiler, the sampler's reads of /proc), each
model's seconds and action. Run it from a clone: it rewrites the warehouse
project's runtime (integration_tests/warehouse/.spark_ivm).

Measured 2026-12-07 at scale 1500 (bench/results/issue54/warehouse-batch-ab-1500-4f1e943.txt):
identical runs took 202.2-232.5 s, so compare variants by the range of
several alternated runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from tpch_bench.spark_session import start_session
from tpch_bench.thread_cpu import Sampler

WAREHOUSE = Path(__file__).resolve().parents[2] / "integration_tests" / "warehouse"
sys.path.insert(0, str(WAREHOUSE))

# The warehouse driver is a script beside its project, not a package.
from driver import (
    DbtProject,
    Step,
    build,
    execute,
    rebuild_as_tables,
)
from raw_data import RawData

RUNTIME = WAREHOUSE / ".spark_ivm"


def prepare(args: argparse.Namespace) -> None:
    """Raw data and the first build (no tests), then the runtime copied to the snapshot."""
    shutil.rmtree(RUNTIME, ignore_errors=True)
    spark, _ = start_session(RUNTIME, tuple(args.conf))
    dbt = DbtProject(threads=args.threads)
    raw = RawData(dbt.raw_schema, scale=args.scale, batch_scale=args.batch_scale)
    with tempfile.TemporaryDirectory(prefix="warehouse_raw_") as scratch:
        for statement in (*raw.create_statements(), *raw.first_load()):
            execute(spark, statement, Path(scratch))
    step = build(dbt, "first build", "--full-refresh", test=False)
    print(f"first build: {step.wall_seconds:.1f} s", flush=True)
    spark.stop()
    # The metastore and the tables, as the first build left them.
    shutil.rmtree(args.snapshot, ignore_errors=True)
    subprocess.run(["cp", "-a", str(RUNTIME), str(args.snapshot)], check=True)


def jvm_cpu(sampler: Sampler, jvm: int) -> dict[str, float]:
    """CPU seconds per thread kind of the JVM whose pid is `jvm` (this session's)."""
    spent: dict[str, float] = defaultdict(float)
    for key, seconds in sampler.sample().items():
        pid, kind = key.split(" ", 1)
        if int(pid) == jvm:
            spent[kind] += seconds
    return dict(spent)


def run(args: argparse.Namespace) -> None:
    """The snapshot restored, the JVM warmed, the batch committed, the ivm `dbt run` measured."""
    name, _, listed = args.variant.partition("=")
    confs = dict(kv.split(":", 1) for kv in listed.split(";") if kv)
    shutil.rmtree(RUNTIME, ignore_errors=True)
    subprocess.run(["cp", "-a", str(args.snapshot), str(RUNTIME)], check=True)
    spark, _ = start_session(RUNTIME, (*args.conf, *confs.items()))
    dbt = DbtProject(threads=args.threads)
    # Untimed: the `table` build warms the JVM, as the driver's --warm-up does
    # (unlike a whole run's, this JVM has not run the first build).
    rebuild_as_tables(dbt, Step("warm-up"))
    raw = RawData(dbt.raw_schema, scale=args.scale, batch_scale=args.batch_scale)
    # The generator's state after the first load (the batch draws from it),
    # its rows generated again and dropped: the snapshot holds them.
    for _ in raw.first_load():
        pass
    with tempfile.TemporaryDirectory(prefix="warehouse_raw_") as scratch:
        # Days before --day: committed and refreshed untimed, so the timed
        # day's refreshes start from the history earlier days left (what
        # `ivm_strategy: auto` and a MIN/MAX refill read).
        for day in range(1, args.day):
            for statement in raw.batch(day):
                execute(spark, statement, Path(scratch))
            build(dbt, f"batch {day}", test=False)
        for statement in raw.batch(args.day):
            execute(spark, statement, Path(scratch))
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    sampler = Sampler(os.getpid())
    before = jvm_cpu(sampler, jvm)
    python_before = resource.getrusage(resource.RUSAGE_SELF)
    # Sampled every second meanwhile: a pool thread that exits keeps the kind
    # it was last seen with (thread_cpu.Sampler), not "since exited".
    done = threading.Event()

    def watch() -> None:
        while not done.wait(1.0):
            jvm_cpu(sampler, jvm)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    step = build(dbt, f"batch {args.day}", test=False)
    wall = time.monotonic() - started
    done.set()
    watcher.join()
    after, python_after = jvm_cpu(sampler, jvm), resource.getrusage(resource.RUSAGE_SELF)
    cpu = {kind: round(after.get(kind, 0.0) - before.get(kind, 0.0), 1) for kind in after}
    cpu["Python (dbt, compiler)"] = round(
        (python_after.ru_utime + python_after.ru_stime)
        - (python_before.ru_utime + python_before.ru_stime),
        1,
    )
    line = {
        "variant": name,
        "day": args.day,
        "confs": confs,
        "wall": round(wall, 1),
        "cpu": cpu,
        "cpu_total": round(sum(cpu.values()), 1),
        "models": {m.model: [m.action, round(m.seconds, 2)] for m in step.models},
    }
    with open(args.out, "a") as sink:
        sink.write(json.dumps(line) + "\n")
    print(json.dumps({k: v for k, v in line.items() if k != "models"}), flush=True)


def summary(path: Path) -> None:
    """Each run's wall and CPU by kind, in the order run."""
    for text in path.read_text().splitlines():
        line = json.loads(text)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(line["cpu"].items(), key=lambda i: -i[1]))
        actions = defaultdict(int)
        for action, _ in line["models"].values():
            actions[action] += 1
        print(
            f"{line['variant']:>12}: wall {line['wall']:6.1f} s, CPU {line['cpu_total']:6.1f} s "
            f"({kinds}); {dict(actions)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("prepare", "run", "summary"))
    parser.add_argument("path", nargs="?", type=Path, help="summary: the runs' JSON lines")
    parser.add_argument("--scale", type=int, default=1500)
    parser.add_argument("--batch-scale", type=int, default=60)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument(
        "--day", type=int, default=1, help="run: the day timed (the ones before refreshed untimed)"
    )
    parser.add_argument("--snapshot", type=Path, default=Path("/tmp/wh-snapshot"))
    parser.add_argument("--variant", default="base=")
    parser.add_argument("--out", type=Path, default=Path("/tmp/warehouse-batch-ab.jsonl"))
    parser.add_argument(
        "--conf",
        action="append",
        default=[("spark.driver.memory", "12g")],
        type=lambda pair: tuple(pair.split("=", 1)),
        metavar="KEY=VALUE",
        help="a Spark conf of every session (default: spark.driver.memory=12g)",
    )
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args)
    elif args.command == "run":
        run(args)
    else:
        summary(args.path)


if __name__ == "__main__":
    main()
