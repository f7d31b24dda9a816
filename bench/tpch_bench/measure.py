"""The experiment: per scale factor, build every model both ways, then time refreshes batch by batch.

For each scale factor:

1. generate and load the sources (fresh Delta tables, version 0);
2. first build: each model as `table` and as `ivm` (``--full-refresh``), with the
   bytes each keeps, then the correctness guard;
3. no-change refresh: each ivm model refreshed with no source commit since its
   last refresh, ``repetitions`` times;
4. for each batch kind, change size and repetition: apply a fresh batch, then for
   each model run the `ivm` refresh and the `table` rebuild back to back, the
   order alternating between repetitions (so neither way always gets the caches
   the other warmed), Spark's jobs and input bytes counted for each, and the
   guard comparing the two afterwards;
5. with ``--group-overhead N``: N pairs of group-overhead measurements (every
   ivm model refreshed in one invocation, as one consistency group and each on
   its own; group_overhead.py), then the table models rebuilt once and the
   guard run on every model.

Every run is recorded; medians and ratios are the report's business. The results
file is rewritten after every batch, so a long run that is stopped keeps what it
measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from tpch_bench import sql_names
from tpch_bench.batches import AppliedBatch, ChangeBatch, RunPlan, apply_batch, plan_run
from tpch_bench.catalog import BenchModel
from tpch_bench.dbt_driver import DbtProject, ModelRun
from tpch_bench.generate import GeneratedData, generate
from tpch_bench.group_overhead import MODES, GroupOverheadPhase, GroupOverheadRecord
from tpch_bench.load import drop_schemas, load
from tpch_bench.settings import PROJECT_DIR, BenchSettings
from tpch_bench.spark_session import SparkMetrics
from tpch_bench.verify import compare

WAYS = ("ivm", "table")


@dataclass
class RunRecord:
    """One dbt run of one model, with what Spark did for it."""

    model: str
    way: str  # ivm | table
    # first_build | no_change | batch | group_overhead_guard (the table rebuilds
    # before the guard that follows the group-overhead phase)
    phase: str
    repetition: int
    seconds: float
    invocation_seconds: float
    action: str
    message: str
    ok: bool
    jobs: int
    stages: int
    tasks: int
    input_bytes: int
    metrics_complete: bool
    batch_sequence: int | None = None
    kind: str | None = None
    size: float | None = None
    # 0 when this way ran first for this model and batch, 1 when second.
    position: int = 0


@dataclass
class CheckRecord:
    model: str
    phase: str
    equal: bool
    ivm_rows: int
    table_rows: int
    missing_from_ivm: int
    extra_in_ivm: int
    batch_sequence: int | None = None
    seconds: float = 0.0  # what the guard itself took (outside every timing)


@dataclass
class StorageRecord:
    """What each way keeps on disk: the table model vs the ivm state table."""

    model: str
    phase: str  # first_build | end
    table_bytes: int
    table_files: int
    table_rows: int
    state_bytes: int
    state_files: int
    state_rows: int


@dataclass
class ModelStatus:
    model: str
    title: str
    table_ok: bool = True
    ivm_ok: bool = True
    # The first error of the ivm model (a compiler refusal shows up here, verbatim).
    ivm_error: str | None = None
    table_error: str | None = None


@dataclass
class ScaleResult:
    scale_factor: float
    source_schema: str
    model_schema: str
    generate_seconds: float
    generate_reused: bool
    load_seconds: float
    load_table_seconds: dict[str, float]
    source_rows: dict[str, int]
    dbt_parse_seconds: float
    # Wall time of each phase, everything included (runs, guard, metrics, batches).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    models: list[ModelStatus] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    checks: list[CheckRecord] = field(default_factory=list)
    storage: list[StorageRecord] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    group_overhead: list[GroupOverheadRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ScaleExperiment:
    def __init__(
        self,
        spark: SparkSession,
        settings: BenchSettings,
        scale_factor: float,
        checkpoint: Callable[[ScaleResult], None],
        log: Callable[[str], None] = print,
    ) -> None:
        # checkpoint(result) is called after each phase and each batch with what
        # has been measured so far (the caller rewrites the results files).
        self.spark = spark
        self.settings = settings
        self.scale_factor = scale_factor
        self.checkpoint = checkpoint
        self.log = log
        self.metrics = SparkMetrics(spark)
        self.source_schema = settings.source_schema(scale_factor)
        self.model_schema = settings.model_schema(scale_factor)
        self.result: ScaleResult | None = None
        self._status: dict[str, ModelStatus] = {}

    def run(self) -> ScaleResult:
        sf = self.scale_factor
        plan = plan_run(self.settings)
        self.log(f"SF {sf:g}: generating TPC-H parquet with tpchgen-cli")
        data = generate(sf, self.settings.data_dir(sf))
        self.log(f"SF {sf:g}: loading Delta sources into {self.source_schema}")
        # The models' schema goes first: an ivm state over dropped sources is useless.
        drop_schemas(self.spark, self.model_schema)
        loaded = load(self.spark, data, self.source_schema)
        project = DbtProject(
            PROJECT_DIR,
            runtime_dir=self.settings.runtime_dir,
            model_schema=self.model_schema,
            source_schema=self.source_schema,
            target_dir=self.settings.dbt_target_dir,
            log_dir=self.settings.dbt_log_dir,
            log_level_file=self.settings.dbt_log_level_file,
            base_vars={
                "bench_ivm_join_state": self.settings.join_state,
                "bench_ivm_strategy": self.settings.strategy,
                "bench_ivm_state_form": self.settings.state_form,
            },
        )
        parse_seconds = project.parse()
        self.result = ScaleResult(
            scale_factor=sf,
            source_schema=self.source_schema,
            model_schema=self.model_schema,
            generate_seconds=round(data.seconds, 3),
            generate_reused=data.reused,
            load_seconds=round(loaded.seconds, 3),
            load_table_seconds=loaded.table_seconds,
            source_rows=loaded.rows,
            dbt_parse_seconds=round(parse_seconds, 3),
        )
        for model in self.settings.models:
            self._status[model.name] = ModelStatus(model.name, model.title)
        self.result.models = list(self._status.values())
        self.log(
            f"SF {sf:g}: {loaded.rows['lineitem']:,} lineitems loaded in {loaded.seconds:.1f}s, "
            f"dbt parse {parse_seconds:.1f}s"
        )

        self._phase("first_builds", self._first_builds, project)
        self._phase("no_change_refreshes", self._no_change_refreshes, project)
        self._phase("batches", self._batches, project, data, plan)
        if plan.group_overhead:
            self._phase("group_overhead", self._group_overhead, project, data, plan)
        for model in self._measurable():
            self._record_storage(model, "end")
        self.checkpoint(self.result)
        return self.result

    def _phase(self, name: str, phase: Callable[..., None], *args: Any) -> None:
        """Run a phase and record its wall time (the harness's own overhead included)."""
        started = time.monotonic()
        phase(*args)
        seconds = time.monotonic() - started
        assert self.result is not None
        self.result.phase_seconds[name] = round(seconds, 3)
        self.log(f"SF {self.scale_factor:g}: {name.replace('_', ' ')} took {seconds:.1f}s")
        self.checkpoint(self.result)

    # -- phases -------------------------------------------------------------

    def _first_builds(self, project: DbtProject) -> None:
        for index, model in enumerate(self.settings.models):
            # Alternate which way builds first, as the batches do.
            ways = WAYS if index % 2 == 0 else tuple(reversed(WAYS))
            for position, way in enumerate(ways):
                self._timed_run(project, model, way, "first_build", 0, position, full_refresh=True)
            if self._measurable_model(model):
                self._record_storage(model, "first_build")
                self._check(model, "first_build", None)

    def _no_change_refreshes(self, project: DbtProject) -> None:
        for repetition in range(self.settings.repetitions):
            for model in self._measurable():
                self._timed_run(project, model, "ivm", "no_change", repetition, 0)

    def _batches(self, project: DbtProject, data: GeneratedData, plan: RunPlan) -> None:
        for batch in plan.batches:
            applied = apply_batch(self.spark, data, self.source_schema, batch)
            assert self.result is not None
            self.result.batches.append(applied.to_json())
            self.log(
                f"SF {self.scale_factor:g}: batch {applied.sequence} {batch.kind} {batch.size:g}% "
                f"({applied.changed_rows:,} rows changed in {applied.seconds:.1f}s)"
            )
            # Alternate which way runs first, so neither always inherits the caches
            # the other warmed.
            ways = WAYS if batch.repetition % 2 == 0 else tuple(reversed(WAYS))
            for model in self._measurable():
                for position, way in enumerate(ways):
                    self._timed_run(
                        project, model, way, "batch", batch.repetition, position, batch=applied
                    )
                if self._measurable_model(model):
                    self._check(model, "batch", applied.sequence)
            self.checkpoint(self.result)

    def _group_overhead(self, project: DbtProject, data: GeneratedData, plan: RunPlan) -> None:
        phase = GroupOverheadPhase(
            self.spark, self.metrics, project, data, self.source_schema, self.model_schema
        )
        parse_seconds = phase.prepare()
        self.log(
            f"SF {self.scale_factor:g}: group overhead: independent mode parsed in "
            f"{parse_seconds:.1f}s"
        )
        assert self.result is not None
        models = self._measurable()
        last: ChangeBatch | None = None
        for pair, batches in enumerate(plan.group_overhead):
            # Alternate which mode goes first, as the batches alternate ways.
            modes = MODES if pair % 2 == 0 else tuple(reversed(MODES))
            for position, (mode, batch) in enumerate(zip(modes, batches, strict=True)):
                record = phase.measure(models, mode, batch, pair, position)
                self.result.group_overhead.append(record)
                last = batch
                window = ", ".join(
                    f"{c.publication_window_seconds:.2f}s"
                    for c in record.commits
                    if c.publication_window_seconds is not None
                )
                self.log(
                    f"  group overhead pair {pair} {mode:<11} {record.invocation_seconds:7.2f}s "
                    f"invocation, {record.models_seconds:7.2f}s models, {record.jobs:4d} jobs"
                    + (f", publication window {window}" if window else "")
                    + ("" if record.ok else f"  FAILED: {record.error or 'a model failed'}")
                )
                self.checkpoint(self.result)
        # The phase refreshed only the ivm models: rebuild the tables once (their
        # times are recorded, not reported) and check every ivm model against its
        # table. A refresh that lost a change would still differ at the end.
        for model in models:
            self._timed_run(project, model, "table", "group_overhead_guard", 0, 0)
            if self._measurable_model(model):
                self._check(model, "group_overhead", last.sequence if last else None)

    # -- one run, one check -------------------------------------------------

    def _timed_run(
        self,
        project: DbtProject,
        model: BenchModel,
        way: str,
        phase: str,
        repetition: int,
        position: int,
        *,
        full_refresh: bool = False,
        batch: AppliedBatch | None = None,
    ) -> ModelRun:
        dbt_model = model.ivm_model if way == "ivm" else model.table_model
        mark = self.metrics.mark()
        run = project.run_model(dbt_model, full_refresh=full_refresh)
        work = self.metrics.since(mark)
        assert self.result is not None
        self.result.runs.append(
            RunRecord(
                model=model.name,
                way=way,
                phase=phase,
                repetition=repetition,
                seconds=round(run.seconds, 4),
                invocation_seconds=round(run.invocation_seconds, 4),
                action=run.action,
                message=run.message,
                ok=run.ok,
                jobs=work.jobs,
                stages=work.stages,
                tasks=work.tasks,
                input_bytes=work.input_bytes,
                metrics_complete=work.complete,
                batch_sequence=batch.sequence if batch else None,
                kind=batch.kind if batch else None,
                size=batch.size if batch else None,
                position=position,
            )
        )
        status = self._status[model.name]
        if not run.ok:
            if way == "ivm" and status.ivm_ok:
                status.ivm_ok, status.ivm_error = False, run.message
            if way == "table" and status.table_ok:
                status.table_ok, status.table_error = False, run.message
        outcome = run.action if run.ok else "FAILED"
        self.log(
            f"  {dbt_model:<40} {phase:<11} {run.seconds:7.2f}s  {work.jobs:3d} jobs  "
            f"{work.input_bytes / 1e6:9.2f} MB read  {outcome}"
        )
        return run

    def _check(self, model: BenchModel, phase: str, batch_sequence: int | None) -> None:
        started = time.monotonic()
        comparison = compare(self.spark, self.model_schema, model.ivm_model, model.table_model)
        assert self.result is not None
        self.result.checks.append(
            CheckRecord(
                model=model.name,
                phase=phase,
                equal=comparison.equal,
                ivm_rows=comparison.ivm_rows,
                table_rows=comparison.table_rows,
                missing_from_ivm=comparison.missing_from_ivm,
                extra_in_ivm=comparison.extra_in_ivm,
                batch_sequence=batch_sequence,
                seconds=round(time.monotonic() - started, 3),
            )
        )
        if not comparison.equal:
            self.log(
                f"  WRONG: {model.ivm_model} differs from {model.table_model}: "
                f"{comparison.missing_from_ivm} rows missing, {comparison.extra_in_ivm} extra"
            )

    def _record_storage(self, model: BenchModel, phase: str) -> None:
        table = self._detail(model.table_model, count_rows=False)
        state = self._detail(f"{model.ivm_model}__ivm_state", count_rows=True)
        assert self.result is not None
        self.result.storage.append(
            StorageRecord(
                model=model.name,
                phase=phase,
                table_bytes=table[0],
                table_files=table[1],
                table_rows=table[2],
                state_bytes=state[0],
                state_files=state[1],
                state_rows=state[2],
            )
        )

    def _detail(self, name: str, *, count_rows: bool) -> tuple[int, int, int]:
        """(bytes, files, rows) of a Delta table of the model schema; rows -1 when not counted.

        The table model's rows are in the guard's comparison already; the state's
        are worth a count (pre-aggregation rows make it larger than the model).
        """
        qualified = sql_names.table(self.model_schema, name)
        detail = self.spark.sql(f"DESCRIBE DETAIL {qualified}").collect()[0]
        rows = self.spark.table(qualified).count() if count_rows else -1
        return int(detail["sizeInBytes"]), int(detail["numFiles"]), int(rows)

    def _measurable_model(self, model: BenchModel) -> bool:
        status = self._status[model.name]
        return status.ivm_ok and status.table_ok

    def _measurable(self) -> list[BenchModel]:
        """Models built both ways without error so far: the others are reported, not timed."""
        return [model for model in self.settings.models if self._measurable_model(model)]


def wall_clock() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
