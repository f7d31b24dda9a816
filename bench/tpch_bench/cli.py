"""Command line of the benchmark: ``bench/run [options]`` (see bench/README.md).

One process, one JVM: the SparkSession is started once (its start timed on its
own), then every scale factor is generated, loaded and measured in turn on it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from dbt.adapters.spark_ivm.refresh.join_states import NONE as JOIN_STATE_NONE
from dbt.adapters.spark_ivm.refresh.join_states import SETTINGS as JOIN_STATE_SETTINGS
from dbt.adapters.spark_ivm.runtime import cluster
from tpch_bench import report
from tpch_bench.batches import plan_run
from tpch_bench.catalog import MODELS, select_models
from tpch_bench.measure import ScaleExperiment, ScaleResult, wall_clock
from tpch_bench.settings import (
    BATCH_KINDS,
    BENCH_DIR,
    DEFAULT_BATCH_KINDS,
    DEFAULT_CHANGE_SIZES,
    DEFAULT_REPETITIONS,
    DEFAULT_RESULTS_DIR,
    DEFAULT_SCALE_FACTORS,
    DEFAULT_WORK_DIR,
    BenchSettings,
    plots_dir_for,
    scale_tag,
)
from tpch_bench.spark_session import SessionStart, start_session

# Exit codes: a wrong answer or a failed run makes the whole run fail, so that no
# one quotes the speed of a refresh that was incorrect.
EXIT_OK = 0
EXIT_PROBLEMS = 1
# --cluster: two workers of one core, each executor sized like half of the
# embedded run's memory (its local[2] executors share the driver's heap).
CLUSTER_SPEC = cluster.ClusterSpec(worker_memory="6g", executor_memory="5g")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/run",
        description="TPC-H refresh benchmark: dbt-spark-ivm's ivm refreshes vs table rebuilds.",
    )
    parser.add_argument(
        "--scale",
        dest="scales",
        type=float,
        action="append",
        help=f"TPC-H scale factor, repeatable (default: {_join(DEFAULT_SCALE_FACTORS)})",
    )
    parser.add_argument(
        "--sizes",
        type=_floats,
        default=DEFAULT_CHANGE_SIZES,
        help="change sizes in percent of the changed table's rows, comma separated "
        f"(default: {','.join(f'{size:g}' for size in DEFAULT_CHANGE_SIZES)})",
    )
    parser.add_argument(
        "--kinds",
        type=_names,
        default=DEFAULT_BATCH_KINDS,
        help=f"batch kinds, comma separated, of {', '.join(BATCH_KINDS)} "
        f"(default: {','.join(DEFAULT_BATCH_KINDS)})",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=DEFAULT_REPETITIONS,
        help="batches per kind and size, and no-change refreshes; times are medians; "
        f"0 skips both, e.g. to run only --group-overhead (default: {DEFAULT_REPETITIONS})",
    )
    parser.add_argument(
        "--group-overhead",
        dest="group_overhead_pairs",
        type=int,
        default=0,
        metavar="N",
        help="after the batches, N pairs of runs of every ivm model in one dbt invocation, "
        "as one consistency group and each on its own (ivm_group 'none'), each after a "
        "fresh rf batch of the smallest --sizes (default: 0, no such phase)",
    )
    parser.add_argument(
        "--models",
        type=_names,
        default=(),
        help=f"models to run, comma separated (default: all of {', '.join(m.name for m in MODELS)})",
    )
    parser.add_argument(
        "--join-state",
        choices=JOIN_STATE_SETTINGS,
        default=JOIN_STATE_NONE,
        help="the ivm models' ivm_join_state: keep reverse-join tables for none, the "
        "inputs 'auto' picks, or all join inputs; run twice with different --label "
        f"values to compare (default: {JOIN_STATE_NONE})",
    )
    parser.add_argument(
        "--strategy",
        choices=("auto", "incremental", "recompute"),
        default="auto",
        help="the ivm models' ivm_strategy; 'incremental' measures the incremental "
        "path even where 'auto' would recompute (default: auto)",
    )
    parser.add_argument(
        "--state-form",
        choices=("auto", "merged", "log"),
        default="auto",
        help="the ivm models' ivm_state_form; 'log' appends each change to the state and "
        "consolidates it when read, for every model whose state adds up; 'auto' does so "
        "where a model can (default: auto)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="start a local Spark standalone cluster (a master and two workers, each its "
        "own JVM, one core each) and run the session as its driver, so every task runs in "
        "an executor of another JVM; stopped at the end (default: local[2], one JVM)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK_DIR,
        help="generated data, the embedded warehouse and dbt's files (default: bench/work)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_RESULTS_DIR,
        help="where the results JSON, markdown and plots go (default: bench/results, "
        "whose plots go to docs/assets/bench, the documentation's figures)",
    )
    parser.add_argument(
        "--label", help="results file name stem (default: tpch-sf<scale>-..., from the scales)"
    )
    parser.add_argument(
        "--schema-prefix",
        default="tpch",
        help="prefix of the schemas created, <prefix>_sf<SF> and <prefix>_sf<SF>_models",
    )
    parser.add_argument(
        "--conf",
        dest="spark_conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark config over the embedded runtime's defaults, repeatable "
        "(e.g. --conf spark.driver.memory=8g)",
    )
    parser.add_argument(
        "--dbt-log-level-file",
        choices=("info", "debug"),
        default="info",
        help="dbt's log level in <work-dir>/dbt/logs/dbt.log; debug records every statement "
        "a refresh runs and how long it took (default: info)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="redraw the markdown and plots of an earlier run's results file, run nothing",
    )
    return parser


def settings_from(args: argparse.Namespace) -> BenchSettings:
    scales = tuple(args.scales or DEFAULT_SCALE_FACTORS)
    return BenchSettings(
        scale_factors=scales,
        change_sizes=tuple(args.sizes),
        batch_kinds=tuple(args.kinds),
        repetitions=args.repetitions,
        models=select_models(list(args.models)),
        work_dir=args.work_dir.resolve(),
        results_dir=args.results_dir.resolve(),
        label=args.label or "tpch-" + "-".join(f"sf{scale_tag(sf)}" for sf in scales),
        schema_prefix=args.schema_prefix,
        spark_conf=tuple(_key_value(text) for text in args.spark_conf),
        dbt_log_level_file=args.dbt_log_level_file,
        group_overhead_pairs=args.group_overhead_pairs,
        join_state=str(args.join_state),
        strategy=args.strategy,
        state_form=args.state_form,
        cluster=args.cluster,
    )


def run_benchmark(
    settings: BenchSettings, log: Callable[[str], None] = print
) -> tuple[dict[str, Any], list[Path]]:
    """Run every scale factor of ``settings``; returns the results and the files written."""
    results: dict[str, Any] = {
        "label": settings.label,
        "started_at": wall_clock(),
        "finished_at": None,
        "settings": _settings_json(settings),
        "environment": environment(),
        "session": None,
        "scales": [],
    }

    def checkpoint(scale: ScaleResult, index: int) -> None:
        # JSON and markdown only: the plots are drawn once, at the end.
        results["scales"][index] = scale.to_json()
        report.write_report(results, settings.results_dir, settings.label, with_plots=False)

    settings.runtime_dir.mkdir(parents=True, exist_ok=True)
    with _cluster(settings, log) as driver_conf:
        spark, session = start_session(settings.runtime_dir, (*driver_conf, *settings.spark_conf))
        try:
            _measure(spark, session, settings, results, checkpoint, log)
        finally:
            if settings.cluster:
                # Before the workers go: a driver whose executors vanish
                # retries and logs for a while.
                spark.stop()
    results["finished_at"] = wall_clock()
    written = report.write_report(
        results, settings.results_dir, settings.label, plots_directory=settings.plots_dir
    )
    return results, written


@contextlib.contextmanager
def _cluster(
    settings: BenchSettings, log: Callable[[str], None]
) -> Iterator[tuple[tuple[str, str], ...]]:
    """With --cluster, a local standalone cluster for the run: the driver's configs for it."""
    if not settings.cluster:
        yield ()
        return
    spec = CLUSTER_SPEC
    started = time.monotonic()
    with cluster.driven_by_this_process(settings.runtime_dir, spec) as configs:
        log(
            f"Spark standalone cluster {spec.master_url} ({spec.workers} workers, "
            f"{spec.executor_memory} executors) up in {time.monotonic() - started:.1f}s"
        )
        yield tuple(configs.items())


def _measure(
    spark: SparkSession,
    session: SessionStart,
    settings: BenchSettings,
    results: dict[str, Any],
    checkpoint: Callable[..., None],
    log: Callable[[str], None],
) -> None:
    """Every scale factor of `settings` measured on `spark`, into `results`."""
    results["session"] = {
        "seconds": round(session.seconds, 3),
        "reused": session.reused,
        "application_id": session.application_id,
    }
    log(
        "SparkSession "
        + ("reused" if session.reused else f"started in {session.seconds:.1f}s (JVM start)")
    )
    for index, scale_factor in enumerate(settings.scale_factors):
        results["scales"].append(None)
        ScaleExperiment(
            spark, settings, scale_factor, functools.partial(checkpoint, index=index), log
        ).run()
    # dbt must have run on the session started above, not on one of its own.
    results["session"]["same_session_after_dbt"] = (
        spark.sparkContext.applicationId == session.application_id
    )
    results["session"]["master"] = spark.sparkContext.master


def environment() -> dict[str, Any]:
    from dbt.adapters.spark_ivm.runtime.versions import installed_line

    versions = {}
    for package in ("dbt-spark-ivm", "dbt-core", "dbt-spark", "pyspark", "tpchgen-cli"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
        # The Delta release the embedded runtime loads for the installed pyspark.
        "delta": installed_line().delta,
        "git_commit": _git_commit(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        results = report.load_results(args.report_only)
        directory = args.report_only.parent
        written = report.write_report(
            results, directory, results["label"], plots_directory=plots_dir_for(directory)
        )
        print("\n".join(str(path) for path in written))
        return EXIT_OK
    try:
        settings = settings_from(args)
        # Fails now, not hours in, when the batches need more parts than TPC-H has.
        plan_run(settings)
    except ValueError as invalid:
        parser.error(str(invalid))  # exits with status 2
    results, written = run_benchmark(settings)
    print("Wrote " + ", ".join(str(path) for path in written))
    found = report.problems(results)
    for problem in found:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return EXIT_PROBLEMS if found else EXIT_OK


def _settings_json(settings: BenchSettings) -> dict[str, Any]:
    return {
        "scale_factors": list(settings.scale_factors),
        "change_sizes": list(settings.change_sizes),
        "batch_kinds": list(settings.batch_kinds),
        "repetitions": settings.repetitions,
        "models": [model.name for model in settings.models],
        "model_reads": {model.name: list(model.reads) for model in settings.models},
        "schema_prefix": settings.schema_prefix,
        "spark_conf": dict(settings.spark_conf),
        "group_overhead_pairs": settings.group_overhead_pairs,
        "join_state": settings.join_state,
        "strategy": settings.strategy,
        "state_form": settings.state_form,
        "cluster": settings.cluster,
        "group_overhead_size": (
            settings.group_overhead_size if settings.group_overhead_pairs else None
        ),
    }


def _git_commit() -> str | None:
    completed = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    return completed.stdout.strip() or None if completed.returncode == 0 else None


def _key_value(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise ValueError(f"--conf takes KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _join(values: tuple[float, ...]) -> str:
    return ", ".join(f"{value:g}" for value in values)
