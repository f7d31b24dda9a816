"""The layered warehouse, end to end: raw sources, a first build, change batches.

Run through `scripts/warehouse` from the repository root. After the first
build and after each batch, `dbt run` refreshes every model and `dbt test`
runs its `ivm_matches_query` test (the model equals its query at the
versions it read). The run reports, per model and batch, what the refresh did
(incremental, no change, recompute, rebuild: the action dbt's adapter
response carries, with its reason), the share maintained incrementally, and
the time of the refresh against rebuilding every model as `table` on the
same data in the same session (`--target table`). Per batch it says which
models were not maintained incrementally and why (not_incremental), as the
batch ends and in the report. Results go to integration_tests/warehouse/results/
as JSON and markdown.

tests/warehouse/ runs the same batches with the same checks inside the test
suite, without the table comparison.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbt.cli.main import dbtRunner
from raw_data import TABLES, Insert, RawData, csv_field

PROJECT_DIR = Path(__file__).resolve().parent
RESULTS_DIR = PROJECT_DIR / "results"
LAYERS = ("bronze", "silver", "gold")
# What counts as maintained incrementally: the change was applied (or there
# was none to apply); recompute, rebuild and fallback each rebuilt the model.
INCREMENTAL_ACTIONS = ("incremental", "no_change")
# An insert of more rows than this is loaded from a CSV file, not SQL literals.
LITERAL_ROWS = 5000


@dataclass(frozen=True)
class ModelOutcome:
    model: str
    layer: str
    action: str  # the ivm refresh's action, lower case (recipe.RefreshResult.action)
    message: str
    seconds: float


@dataclass(frozen=True)
class TestOutcome:
    test: str
    status: str
    message: str


@dataclass
class Step:
    """One step: its `dbt run` and `dbt test` (and the `table` rebuild of the same data)."""

    name: str
    models: list[ModelOutcome] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    wall_seconds: float = 0.0  # the `dbt run` that refreshed the models, start to end
    table_seconds: float | None = None  # every model rebuilt as `table`, same data
    table_wall_seconds: float | None = None  # that rebuild's `dbt run`, start to end
    # Each model's own `table` rebuild on the same data, by model name.
    table_models: dict[str, float] = field(default_factory=dict)
    # False where the step's `dbt test` was skipped (run_warehouse's `test_first_build`).
    tested: bool = True

    @property
    def model_seconds(self) -> float:
        return sum(m.seconds for m in self.models)

    @property
    def incremental(self) -> list[ModelOutcome]:
        return [m for m in self.models if m.action in INCREMENTAL_ACTIONS]

    @property
    def exceptions(self) -> list[ModelOutcome]:
        return [m for m in self.models if m.action not in INCREMENTAL_ACTIONS]

    @property
    def incremental_share(self) -> float:
        return len(self.incremental) / len(self.models) if self.models else 0.0

    @property
    def slower_than_rebuild(self) -> list[str]:
        """The models whose refresh took longer than their own `table` rebuild."""
        return [
            m.model
            for m in self.models
            if m.model in self.table_models and m.seconds > self.table_models[m.model]
        ]

    @property
    def failed_tests(self) -> list[TestOutcome]:
        return [t for t in self.tests if t.status != "pass"]


@dataclass(frozen=True)
class DbtProject:
    """How to invoke dbt on the warehouse project (the tests point it elsewhere)."""

    profiles_dir: Path = PROJECT_DIR
    raw_schema: str = "warehouse_raw"
    # Where dbt writes target/ and logs/ (default: inside the project).
    work_dir: Path | None = None
    # The schemas of the ivm models and of their `table` twins (profiles.yml).
    schemas: tuple[str, ...] = ("warehouse", "warehouse_table")
    # dbt's --threads for every invocation (None: profiles.yml's 1).
    threads: int | None = None

    def invoke(self, command: str, *extra: str, variables: dict | None = None) -> list:
        args = [
            command,
            "--project-dir",
            str(PROJECT_DIR),
            "--profiles-dir",
            str(self.profiles_dir),
        ]
        if self.work_dir is not None:
            args += [
                "--target-path",
                str(self.work_dir / "target"),
                "--log-path",
                str(self.work_dir / "logs"),
            ]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        args += [
            "--vars",
            json.dumps({"warehouse_raw_schema": self.raw_schema, **(variables or {})}),
        ]
        result = dbtRunner().invoke([*args, *extra])
        if result.result is None:
            raise RuntimeError(f"dbt {command} did not run: {result.exception}")
        return list(result.result.results)


def layer_of(result) -> str:
    path = Path(result.node.original_file_path)
    return next((part for part in path.parts if part in LAYERS), "")


def step_from(name: str, results: Sequence, wall_seconds: float) -> Step:
    step = Step(name=name, wall_seconds=wall_seconds)
    for result in results:
        if result.node.resource_type == "model":
            response = result.adapter_response or {}
            # The materialization stores the refresh's action as the response code;
            # a model that failed has none and counts as an exception.
            action = str(response.get("code") or str(result.status)).lower()
            message = response.get("_message") or result.message or ""
            step.models.append(
                ModelOutcome(
                    result.node.name, layer_of(result), action, message, result.execution_time
                )
            )
        elif result.node.resource_type == "test":
            step.tests.append(
                TestOutcome(result.node.name, str(result.status), result.message or "")
            )
    return step


def build(dbt: DbtProject, name: str, *extra: str, test: bool = True) -> Step:
    """Refresh the models (`dbt run`, timed start to end), then run their tests (`dbt test`).

    Two invocations rather than one `dbt build`, so that the run's wall time
    is the refresh alone, comparable with the `table` rebuild's run, also
    with several threads. `test`: False skips the `dbt test`.
    """
    started = time.monotonic()
    results = dbt.invoke("run", *extra)
    wall_seconds = time.monotonic() - started
    if not test:
        step = step_from(name, results, wall_seconds)
        step.tested = False
        return step
    tests = dbt.invoke("test", *(e for e in extra if e != "--full-refresh"))
    return step_from(name, [*results, *tests], wall_seconds)


def rebuild_as_tables(dbt: DbtProject, step: Step) -> None:
    """Every model built as `table` on the same data, timed into `step` (sum, wall, per model)."""
    started = time.monotonic()
    results = dbt.invoke(
        "run", "--target", "table", variables={"warehouse_materialization": "table"}
    )
    step.table_wall_seconds = time.monotonic() - started
    failed = [r.node.name for r in results if str(r.status) != "success"]
    if failed:
        raise RuntimeError(f"the table rebuild failed for {', '.join(failed)}")
    step.table_models = {r.node.name: r.execution_time for r in results}
    step.table_seconds = sum(step.table_models.values())


def execute(spark, statement: str | Insert, scratch: Path) -> None:
    """Run one raw-data statement: one Delta commit."""
    if isinstance(statement, str):
        spark.sql(statement)
    elif len(statement.rows) <= LITERAL_ROWS:
        spark.sql(statement.statement())
    else:
        path = scratch / f"{statement.name}.csv"
        with path.open("w", newline="") as file:
            csv.writer(file).writerows([csv_field(v) for v in row] for row in statement.rows)
        frame = (
            spark.read.schema(TABLES[statement.name])
            .option("timestampFormat", "yyyy-MM-dd HH:mm:ss")
            .csv(str(path))
        )
        frame.write.insertInto(statement.table)


def run_warehouse(
    spark,
    dbt: DbtProject,
    batches: int = 3,
    compare_tables: bool = False,
    select: Sequence[str] = (),
    scale: int = 1,
    batch_scale: int | None = None,
    warm_up: bool = False,
    test_first_build: bool = True,
) -> list[Step]:
    """Create the raw sources, build, then apply and refresh `batches` change batches.

    `select`: dbt selectors limiting the models built (closed under their
    upstreams, e.g. "+model"); the raw data and batches stay the same.
    `scale`, `batch_scale`: RawData's, multiplying every count of generated
    rows, and of a batch's rows when given. `warm_up`: build the `table`
    twins once, untimed, before the first build. Every step runs in this
    process's one JVM, so without it the first build is the JVM's first
    work (its scans, writes and code generation compiled as it goes) and
    the `table` build timed after it finds them compiled; with it both
    timed builds run in a JVM a whole build has warmed, as on a
    long-running server. `test_first_build`: False skips the first build's
    `dbt test` (28 minutes at scale 6000); each batch's still runs.
    """
    selection = ("--select", *select) if select else ()
    # Start from nothing: the raw tables are re-created below, and the views of
    # an earlier run show states whose source versions went with them (a
    # group member's test that runs before its group publishes would read
    # them; CONTRIBUTING, known gaps).
    for schema in dbt.schemas:
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    raw = RawData(dbt.raw_schema, scale=scale, batch_scale=batch_scale)
    with tempfile.TemporaryDirectory(prefix="warehouse_raw_") as scratch:
        for statement in (*raw.create_statements(), *raw.first_load()):
            execute(spark, statement, Path(scratch))
        if warm_up:
            rebuild_as_tables(dbt, Step("warm-up"))
        steps = [build(dbt, "first build", "--full-refresh", *selection, test=test_first_build)]
        if compare_tables:
            rebuild_as_tables(dbt, steps[0])
        for number in range(1, batches + 1):
            commits = 0
            for statement in raw.batch(number):
                execute(spark, statement, Path(scratch))
                commits += 1
            step = build(dbt, f"batch {number} ({commits} source commits)", *selection)
            # Said as each batch ends: a long run is followed while it goes.
            print("\n".join([f"{step.name}:", *not_incremental(step)]), flush=True)
            if compare_tables:
                rebuild_as_tables(dbt, step)
            steps.append(step)
    return steps


def _tests_passed(step: Step) -> str:
    """The step's passed tests out of those run, or why none ran."""
    if not step.tested:
        return "not run"
    return f"{len(step.tests) - len(step.failed_tests)}/{len(step.tests)}"


def markdown(
    steps: list[Step],
    threads: int = 1,
    scale: int = 1,
    raw_rows: dict[str, int] | None = None,
    batch_scale: int | None = None,
    warm_up: bool = False,
) -> str:
    models = [m.model for m in steps[0].models]
    layers = {m.model: m.layer for m in steps[0].models}
    per_layer = ", ".join(f"{layer} {list(layers.values()).count(layer)}" for layer in LAYERS)
    options = f"--threads {threads}" + (f" --scale {scale}" if scale != 1 else "")
    batches = f"scale {scale}"
    if batch_scale is not None and batch_scale != scale:
        options += f" --batch-scale {batch_scale}"
        batches = f"scale {scale}, batches at scale {batch_scale}"
    warmed = ""
    if warm_up:
        options += " --warm-up"
        warmed = " The JVM was warmed by an untimed `table` build before the first build."
    if not steps[0].tested:
        options += " --skip-first-build-tests"
        warmed += " The first build's `dbt test` was skipped; each batch's ran."
    lines = [
        "# The layered warehouse: what each refresh did",
        "",
        (
            f"{len(models)} ivm models ({per_layer}), {threads} dbt thread(s), {batches}; "
            f"`scripts/warehouse {options}` reproduces it.{warmed}"
        ),
        "",
    ]
    if raw_rows:
        sizes = ", ".join(f"{name} {rows:,}" for name, rows in raw_rows.items())
        lines += [f"Raw tables after the last batch (rows): {sizes}.", ""]
    lines += [
        (
            "| step | incremental | share | ivm refresh s (models) | `table` rebuild s | ratio "
            "| ivm run wall s | `table` run wall s | wall ratio | tests passed |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        table = f"{step.table_seconds:.1f}" if step.table_seconds is not None else "-"
        ratio = f"{step.table_seconds / step.model_seconds:.2f}x" if step.table_seconds else "-"
        table_wall = step.table_wall_seconds
        wall = f"{table_wall:.1f}" if table_wall is not None else "-"
        wall_ratio = f"{table_wall / step.wall_seconds:.2f}x" if table_wall else "-"
        lines.append(
            f"| {step.name} | {len(step.incremental)}/{len(step.models)} | "
            f"{step.incremental_share:.0%} | {step.model_seconds:.1f} | {table} | {ratio} | "
            f"{step.wall_seconds:.1f} | {wall} | {wall_ratio} | "
            f"{_tests_passed(step)} |"
        )
    lines += [
        "",
        (
            "Ratio: `table` rebuild time over ivm refresh time (above 1: ivm is faster), from "
            "the models' summed times; wall ratio: the same from each `dbt run`'s start to "
            "end (with several threads, models overlap)."
        ),
        "",
    ]
    lines += [
        "## Per model",
        "",
        (
            "Each cell: what the ivm model's refresh did and its time, then its own `table` "
            "rebuild's time on the same data (the cell is bold where the refresh took longer)."
        ),
        "",
        "| model | layer | " + " | ".join(s.name for s in steps) + " |",
    ]
    lines.append("|---|---|" + "---|" * len(steps))
    by_step = [{m.model: m for m in s.models} for s in steps]
    for model in models:
        cells = []
        for step, outcomes in zip(steps, by_step):
            outcome = outcomes.get(model)
            cells.append(_model_cell(outcome, step.table_models.get(model)))
        lines.append(f"| {model} | {layers[model]} | " + " | ".join(cells) + " |")
    for step in steps:
        slower = step.slower_than_rebuild
        if step.table_models:
            lines += [
                "",
                f"{step.name}: {len(slower)} of {len(step.models)} models refreshed slower than "
                "their own `table` rebuild" + (f" ({', '.join(slower)})." if slower else "."),
            ]
    lines += ["", "## Not maintained incrementally after the first build", ""]
    for step in steps[1:]:
        lines += [f"### {step.name}", "", *not_incremental(step), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def not_incremental(step: Step) -> list[str]:
    """A batch's models that were not maintained incrementally, each with its action and why.

    The first line counts them; a model's reason is its refresh's message
    (a recompute's estimates, a rebuild's cause, a refused model's refusal
    and how it handed its change on).
    """
    share = f"{len(step.incremental)}/{len(step.models)} incremental ({step.incremental_share:.0%})"
    if not step.exceptions:
        return [f"{share}: every model."]
    return [
        f"{share}; not incremental:",
        "",
        *[f"- {m.model} ({m.action}): {m.message}" for m in step.exceptions],
    ]


def _model_cell(outcome: ModelOutcome | None, rebuild: float | None) -> str:
    """`action refresh s / table rebuild s`, bold where the refresh took longer."""
    if outcome is None:
        return "-"
    text = f"{outcome.action} {outcome.seconds:.1f}s"
    if rebuild is None:
        return text
    text += f" / {rebuild:.1f}s"
    return f"**{text}**" if outcome.seconds > rebuild else text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--no-table", action="store_true", help="skip the `table` rebuilds")
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help=(
            "build the `table` twins once, untimed, before the first build, so both timed "
            "builds run in a warmed JVM"
        ),
    )
    parser.add_argument(
        "--skip-first-build-tests",
        action="store_true",
        help=(
            "skip the `dbt test` after the first build (half an hour at scale 6000); every "
            "batch's tests still run"
        ),
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="dbt threads, for the refreshes and the rebuilds"
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="multiply every count of generated raw rows (first load and batches) by this",
    )
    parser.add_argument(
        "--batch-scale",
        type=int,
        default=None,
        help=(
            "multiply a batch's row counts by this instead (a divisor of --scale): a day's "
            "load into a larger warehouse"
        ),
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark conf for the embedded session, repeatable (e.g. spark.driver.memory=12g)",
    )
    parser.add_argument(
        "--label", default="", help="names the result files warehouse-<label>.md and .json"
    )
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from dbt.adapters.spark_ivm.runtime.embedded import RUNTIME_DIR_NAME, session_configs

    configs = session_configs(PROJECT_DIR / RUNTIME_DIR_NAME)
    for pair in args.conf:
        key, _, value = pair.partition("=")
        configs[key] = value
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in configs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    dbt = DbtProject(threads=args.threads)
    warm_up = args.warm_up and not args.no_table
    steps = run_warehouse(
        spark,
        dbt,
        args.batches,
        compare_tables=not args.no_table,
        warm_up=warm_up,
        scale=args.scale,
        batch_scale=args.batch_scale,
        test_first_build=not args.skip_first_build_tests,
    )
    raw_rows = {
        name: spark.table(f"{dbt.raw_schema}.{name}").count()
        for name in ("customers", "products", "orders", "order_items", "payments")
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    report = markdown(steps, args.threads, args.scale, raw_rows, args.batch_scale, warm_up=warm_up)
    name = f"warehouse-{args.label}" if args.label else "warehouse"
    (RESULTS_DIR / f"{name}.md").write_text(report)
    payload = [
        {**asdict(s), "incremental_share": s.incremental_share, "model_seconds": s.model_seconds}
        for s in steps
    ]
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(report)
    failed = [(s.name, t.test) for s in steps for t in s.failed_tests]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
