"""The layered warehouse, end to end: raw sources, a first build, change batches.

Run through `scripts/warehouse` from the repository root. After the first
build and after each batch, `dbt build` refreshes every model and runs its
`ivm_matches_query` test (the model equals its query at the versions it
read). The run reports, per model and batch, what the refresh did
(incremental, no change, recompute, rebuild: the action dbt's adapter
response carries, with its reason), the share maintained incrementally, and
the time of the refresh against rebuilding every model as `table` on the
same data in the same session (`--target table`). Results go to
integration_tests/warehouse/results/ as JSON and markdown.

tests/warehouse/ runs the same batches with the same checks inside the test
suite, without the table comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbt.cli.main import dbtRunner
from raw_data import RawData

PROJECT_DIR = Path(__file__).resolve().parent
RESULTS_DIR = PROJECT_DIR / "results"
LAYERS = ("bronze", "silver", "gold")
# What counts as maintained incrementally: the change was applied (or there
# was none to apply); recompute, rebuild and fallback each rebuilt the model.
INCREMENTAL_ACTIONS = ("incremental", "no_change")


@dataclass(frozen=True)
class ModelOutcome:
    model: str
    layer: str
    action: str  # the ivm refresh's action, lower case (refresh.RefreshResult.action)
    message: str
    seconds: float


@dataclass(frozen=True)
class TestOutcome:
    test: str
    status: str
    message: str


@dataclass
class Step:
    """One `dbt build` (or the `table` rebuild of the same step)."""

    name: str
    models: list[ModelOutcome] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    wall_seconds: float = 0.0
    table_seconds: float | None = None  # every model rebuilt as `table`, same data

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


def build(dbt: DbtProject, name: str, *extra: str) -> Step:
    started = time.monotonic()
    results = dbt.invoke("build", *extra)
    return step_from(name, results, time.monotonic() - started)


def rebuild_as_tables(dbt: DbtProject) -> float:
    """Seconds to build every model as `table` (models only, same data)."""
    results = dbt.invoke(
        "run", "--target", "table", variables={"warehouse_materialization": "table"}
    )
    failed = [r.node.name for r in results if str(r.status) != "success"]
    if failed:
        raise RuntimeError(f"the table rebuild failed for {', '.join(failed)}")
    return sum(r.execution_time for r in results)


def run_warehouse(
    spark,
    dbt: DbtProject,
    batches: int = 3,
    compare_tables: bool = False,
    select: Sequence[str] = (),
) -> list[Step]:
    """Create the raw sources, build, then apply and refresh `batches` change batches.

    `select`: dbt selectors limiting the models built (closed under their
    upstreams, e.g. "+model"); the raw data and batches stay the same.
    """
    selection = ("--select", *select) if select else ()
    # Start from nothing: the raw tables are re-created below, and the views of
    # an earlier run show states whose source versions went with them (a
    # group member's test that runs before its group publishes would read
    # them; CONTRIBUTING, known gaps).
    for schema in dbt.schemas:
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    raw = RawData(dbt.raw_schema)
    for statement in (*raw.create_statements(), *raw.first_load()):
        spark.sql(statement)
    steps = [build(dbt, "first build", "--full-refresh", *selection)]
    if compare_tables:
        steps[0].table_seconds = rebuild_as_tables(dbt)
    for number in range(1, batches + 1):
        commits = 0
        for statement in raw.batch(number):
            spark.sql(statement)
            commits += 1
        step = build(dbt, f"batch {number} ({commits} source commits)", *selection)
        if compare_tables:
            step.table_seconds = rebuild_as_tables(dbt)
        steps.append(step)
    return steps


def markdown(steps: list[Step]) -> str:
    models = [m.model for m in steps[0].models]
    layers = {m.model: m.layer for m in steps[0].models}
    per_layer = ", ".join(f"{layer} {list(layers.values()).count(layer)}" for layer in LAYERS)
    lines = [
        "# The layered warehouse: what each refresh did",
        "",
        f"{len(models)} ivm models ({per_layer}); `scripts/warehouse` reproduces it.",
        "",
        "| step | incremental | share | ivm refresh s (models) | `table` rebuild s | ratio | tests passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        table = f"{step.table_seconds:.1f}" if step.table_seconds is not None else "-"
        ratio = f"{step.table_seconds / step.model_seconds:.2f}x" if step.table_seconds else "-"
        lines.append(
            f"| {step.name} | {len(step.incremental)}/{len(step.models)} | "
            f"{step.incremental_share:.0%} | {step.model_seconds:.1f} | {table} | {ratio} | "
            f"{len(step.tests) - len(step.failed_tests)}/{len(step.tests)} |"
        )
    lines += ["", "Ratio: `table` rebuild time over ivm refresh time (above 1: ivm is faster).", ""]
    lines += ["## Per model", "", "| model | layer | " + " | ".join(s.name for s in steps) + " |"]
    lines.append("|---|---|" + "---|" * len(steps))
    by_step = [{m.model: m for m in s.models} for s in steps]
    for model in models:
        cells = []
        for outcomes in by_step:
            outcome = outcomes.get(model)
            cells.append(f"{outcome.action} {outcome.seconds:.1f}s" if outcome else "-")
        lines.append(f"| {model} | {layers[model]} | " + " | ".join(cells) + " |")
    exceptions = [(s.name, m) for s in steps[1:] for m in s.exceptions]
    lines += ["", "## Not maintained incrementally after the first build", ""]
    lines += [f"- {name}, {m.model}: {m.message}" for name, m in exceptions] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--no-table", action="store_true", help="skip the `table` rebuilds")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from dbt.adapters.spark_ivm.runtime import RUNTIME_DIR_NAME, session_configs

    builder = SparkSession.builder.enableHiveSupport()
    for key, value in session_configs(PROJECT_DIR / RUNTIME_DIR_NAME).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    steps = run_warehouse(spark, DbtProject(), args.batches, compare_tables=not args.no_table)
    RESULTS_DIR.mkdir(exist_ok=True)
    report = markdown(steps)
    (RESULTS_DIR / "warehouse.md").write_text(report)
    payload = [
        {**asdict(s), "incremental_share": s.incremental_share, "model_seconds": s.model_seconds}
        for s in steps
    ]
    (RESULTS_DIR / "warehouse.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(report)
    failed = [(s.name, t.test) for s in steps for t in s.failed_tests]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
