"""The benchmark harness (bench/) end to end at SF 0.01, so that it cannot rot.

One `mixed` batch of 1 % (RF1 inserts, RF2 deletes, lineitem and customer
updates, all in one batch), one repetition, then one group-overhead pair (the
three ivm models refreshed in one invocation, grouped and independent). It runs in this process on the
suite's shared SparkSession (tests/conftest.py): the harness starts its session
with getOrCreate, exactly as dbt-spark's session method does, so it finds the
suite's session and no second JVM is started.

It is the one refreshing layer that runs in session mode only: the harness
counts each refresh's Spark jobs and bytes read from the driver's status
store, which a Thrift client cannot see, and it measures the engine, not
the transport. The refresh code it drives is the same in both modes, and
every test under tests/functional and tests/warehouse runs it over Thrift.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tpch_bench import report
from tpch_bench.catalog import MODELS_BY_NAME
from tpch_bench.cli import run_benchmark
from tpch_bench.load import drop_schemas
from tpch_bench.settings import BenchSettings

from tests.conftest import RUNTIME_DIR

# Minutes of the suite: the extended command runs it (scripts/test-extended).
pytestmark = [pytest.mark.spark, pytest.mark.extended]

# A grouped aggregate over lineitem, a three-way join and the MIN/MAX
# pre-aggregation: one of each kind of refresh, so the smoke run stays a few
# minutes of the test command; `bench/run --scale 0.01` runs all nine.
MODELS = tuple(
    MODELS_BY_NAME[name]
    for name in ("q01_pricing_summary", "q03_shipping_priority", "lineitem_supplier_extremes")
)

SCHEMA_PREFIX = "bench_smoke"


@pytest.fixture(scope="module")
def smoke_run(spark, tmp_path_factory):
    work = tmp_path_factory.mktemp("bench")
    settings = BenchSettings(
        scale_factors=(0.01,),
        change_sizes=(1.0,),
        batch_kinds=("mixed",),
        repetitions=1,
        models=MODELS,
        work_dir=work / "work",
        results_dir=work / "results",
        label="smoke",
        schema_prefix=SCHEMA_PREFIX,
        runtime_dir_override=Path(RUNTIME_DIR),
        group_overhead_pairs=1,
    )
    try:
        results, written = run_benchmark(settings, log=lambda line: None)
        yield settings, results, written
    finally:
        drop_schemas(spark, settings.model_schema(0.01), settings.source_schema(0.01))


def test_the_harness_reuses_the_process_session(smoke_run):
    _, results, _ = smoke_run
    assert results["session"]["reused"] is True
    assert results["session"]["same_session_after_dbt"] is True


def test_every_model_is_built_both_ways(smoke_run):
    _, results, _ = smoke_run
    (scale,) = results["scales"]
    statuses = {status["model"]: status for status in scale["models"]}
    assert set(statuses) == {model.name for model in MODELS}
    for name, status in statuses.items():
        assert status["table_ok"], f"{name} table: {status['table_error']}"
        assert status["ivm_ok"], f"{name} ivm: {status['ivm_error']}"
    builds = {(r["model"], r["way"]): r for r in scale["runs"] if r["phase"] == "first_build"}
    for model in MODELS:
        assert builds[(model.name, "ivm")]["action"] == "BUILD"
        assert builds[(model.name, "table")]["ok"]


def test_the_batch_changed_every_kind_of_row(smoke_run):
    _, results, _ = smoke_run
    (batch,) = results["scales"][0]["batches"]
    lineitem = batch["changes"]["lineitem"]
    assert lineitem["insert"] > 0 and lineitem["delete"] > 0 and lineitem["update_postimage"] > 0
    assert batch["changes"]["orders"]["insert"] == batch["changes"]["orders"]["delete"] == 150
    assert batch["changes"]["customer"]["update_postimage"] > 0


def test_ivm_equals_table_after_the_batch(smoke_run):
    _, results, _ = smoke_run
    (scale,) = results["scales"]
    checks = {c["model"]: c for c in scale["checks"] if c["phase"] == "batch"}
    assert set(checks) == {model.name for model in MODELS}
    for name, check in checks.items():
        assert check["equal"], f"{name}: {check}"
        assert check["table_rows"] > 0, f"{name} is empty at SF 0.01: the check proves nothing"
    assert report.problems(results) == []


def test_every_model_has_a_timing_both_ways_and_an_incremental_refresh(smoke_run):
    _, results, _ = smoke_run
    (scale,) = results["scales"]
    batch_runs = {(r["model"], r["way"]): r for r in scale["runs"] if r["phase"] == "batch"}
    no_change = {r["model"]: r for r in scale["runs"] if r["phase"] == "no_change"}
    for model in MODELS:
        for way in ("ivm", "table"):
            run = batch_runs[(model.name, way)]
            assert run["ok"] and run["seconds"] > 0 and run["jobs"] > 0, run
        assert batch_runs[(model.name, "ivm")]["action"] == "INCREMENTAL"
        assert no_change[model.name]["action"] == "NO_CHANGE"
    summaries = report.batch_summaries(results)
    assert {s.model for s in summaries} == {model.name for model in MODELS}


def test_the_group_overhead_pair_measures_both_modes(smoke_run):
    _, results, _ = smoke_run
    (scale,) = results["scales"]
    records = {record["mode"]: record for record in scale["group_overhead"]}
    assert set(records) == {"grouped", "independent"}
    for record in records.values():
        assert record["ok"], record["error"]
        assert {node["model"] for node in record["nodes"]} == {m.ivm_model for m in MODELS}
        assert {node["action"] for node in record["nodes"]} == {"INCREMENTAL"}
        assert record["invocation_seconds"] >= record["models_seconds"] > 0
        assert record["jobs"] > 0
    # The three models all read lineitem: one group, one commit, published.
    (commit,) = records["grouped"]["commits"]
    assert commit["members"] == len(MODELS)
    assert commit["publication_window_seconds"] >= 0
    assert len(records["grouped"]["views_moved_seconds"]) == 1
    assert records["independent"]["commits"] == []
    guard = {c["model"]: c for c in scale["checks"] if c["phase"] == "group_overhead"}
    assert set(guard) == {model.name for model in MODELS}
    assert all(check["equal"] for check in guard.values()), guard
    assert report.group_overhead_summary(scale) is not None


def test_the_report_is_written(smoke_run):
    settings, _, written = smoke_run
    names = {path.name for path in written}
    assert {"smoke.json", "smoke.md", "smoke-refresh-vs-change-mixed.png"} <= names
    text = (settings.results_dir / "smoke.md").read_text()
    for model in MODELS:
        assert model.name in text
    assert "WRONG" not in text
    assert "### Group commit overhead" in text
