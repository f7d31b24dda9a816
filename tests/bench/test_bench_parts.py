"""The harness's pure parts, without Spark: batch planning and the report's verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest
from tpch_bench import report
from tpch_bench.batches import ORDER_KEY_SHIFT, plan_batches, plan_run
from tpch_bench.catalog import MODELS
from tpch_bench.group_overhead import commits_from_rows, views_moved_seconds
from tpch_bench.settings import (
    DEFAULT_PLOTS_DIR,
    DEFAULT_RESULTS_DIR,
    BenchSettings,
    plots_dir_for,
)


def test_rf_batches_use_fresh_parts_and_free_key_slots():
    batches = plan_batches(("rf",), (0.1, 1.0, 10.0), 3)
    assert [len(b.insert_parts) for b in batches] == [1, 1, 1, 10, 10, 10, 100, 100, 100]
    inserted = [part for b in batches for part in b.insert_parts]
    deleted = [part for b in batches for part in b.delete_parts]
    assert len(inserted) == len(set(inserted)) == len(deleted) == len(set(deleted)) == 333
    # No part is both copied and deleted: a batch inserting copies of the rows it
    # deletes would leave key-blind aggregates unchanged and prove nothing.
    assert not set(inserted) & set(deleted)
    # tpchgen-cli's order keys use residues 0-7 modulo 32: a shift of 8 is free.
    assert {b.insert_key_shift for b in batches} == {ORDER_KEY_SHIFT}
    assert [b.repetition for b in batches[:3]] == [0, 1, 2]


def test_rf_batches_that_would_share_parts_are_refused_before_running():
    plan_batches(("rf",), (25.0,), 2)  # 500 parts each way: the limit
    with pytest.raises(ValueError, match="need 1010 of the 1000 parts"):
        plan_batches(("rf",), (25.0, 0.5), 2)


def test_update_batches_change_no_parts_and_differ_by_salt():
    batches = plan_batches(("lineitem_updates", "customer_updates"), (1.0,), 2)
    assert all(not b.insert_parts and not b.delete_parts for b in batches)
    assert len({b.update_salt for b in batches}) == 4
    assert batches[0].update_threshold == 10_000  # 1 % of 1,000,000 hash buckets


def _results(batch_changes: dict, action: str, model_reads: list[str]) -> dict:
    run = {
        "model": "m",
        "way": "ivm",
        "phase": "batch",
        "ok": True,
        "action": action,
        "message": "",
        "batch_sequence": 1,
    }
    scale = {
        "scale_factor": 1,
        "checks": [],
        "models": [{"model": "m", "table_error": None, "ivm_error": None}],
        "batches": [{"sequence": 1, "changes": batch_changes}],
        "runs": [run],
    }
    return {"settings": {"model_reads": {"m": model_reads}}, "scales": [scale]}


@pytest.mark.parametrize(
    ("changes", "action", "reads", "flagged"),
    [
        ({"lineitem": {"insert": 5}}, "INCREMENTAL", ["lineitem"], False),
        ({"lineitem": {"insert": 5}}, "REBUILD", ["lineitem"], True),
        ({"lineitem": {"insert": 5}}, "RECOMPUTE", ["lineitem"], False),
        ({"customer": {"update_postimage": 2}}, "NO_CHANGE", ["lineitem"], False),
        ({"customer": {"update_postimage": 2}}, "INCREMENTAL", ["lineitem"], True),
        ({"customer": {}}, "NO_CHANGE", ["customer"], False),
    ],
    ids=[
        "incremental",
        "rebuild",
        "auto-recompute",
        "untouched",
        "untouched-but-refreshed",
        "empty-batch",
    ],
)
def test_the_report_expects_incremental_only_when_a_source_changed(changes, action, reads, flagged):
    assert bool(report.problems(_results(changes, action, reads))) is flagged


def test_a_compiler_refusal_is_reported_not_failed():
    results = _results({}, "NO_CHANGE", ["lineitem"])
    refusal = "Model 'x' cannot be maintained incrementally: LEFT JOIN ..."
    results["scales"][0]["models"][0]["ivm_error"] = refusal
    assert report.problems(results) == []
    results["scales"][0]["models"][0]["ivm_error"] = "Runtime Error: out of memory"
    assert report.problems(results) == ["SF 1: m ivm failed: Runtime Error: out of memory"]


def test_the_profile_sums_each_node_s_statements_by_kind():
    from tpch_bench.profile import profile, render, statements

    log = [
        '\x1b[0m12:00:00.000001 [debug] [Thread-1 ]: On model.b.q01_ivm: /* {"app": "dbt"} */\n',
        "MERGE INTO `s`.`q01_ivm__ivm_state` AS t\n",
        "USING (SELECT 1) AS d ON true\n",
        "\x1b[0m12:00:00.000002 [debug] [Thread-2 ]: On model.b.q01_table: select 1\n",
        "\x1b[0m12:00:02.000000 [debug] [Thread-1 ]: SQL status: OK in 2.500 seconds\n",
        "\x1b[0m12:00:02.100000 [debug] [Thread-2 ]: SQL status: OK in 0.500 seconds\n",
        "\x1b[0m12:00:02.200000 [debug] [Thread-1 ]: On model.b.q01_ivm: ALTER VIEW `s`.`v` AS SELECT 1\n",
        "\x1b[0m12:00:02.300000 [debug] [Thread-1 ]: SQL status: OK in 0.250 seconds\n",
        "\x1b[0m12:00:02.400000 [debug] [Thread-1 ]: On model.b.q01_ivm: DESCRIBE HISTORY `s`.`x` LIMIT 1\n",
        "\x1b[0m12:00:02.500000 [debug] [Thread-1 ]: SQL status: OK in 0.125 seconds\n",
        "\x1b[0m12:00:02.600000 [debug] [Thread-1 ]: On model.b.q01_ivm: SET k=v\n",
    ]
    found = statements(log)
    assert [s.kind for s in found] == [
        "MERGE",
        "SELECT",
        "ALTER VIEW ... AS",
        "DESCRIBE HISTORY",
        "SET",
    ]
    assert "USING (SELECT 1)" in found[0].sql
    (ivm,) = profile(found, nodes=("q01_ivm",))
    assert ivm.total == 2.875
    assert dict(ivm.by_kind) == {
        "MERGE": [2.5],
        "ALTER VIEW ... AS": [0.25],
        "DESCRIBE HISTORY": [0.125],
    }
    assert render([ivm]).splitlines()[1].split()[:2] == ["MERGE", "x1"]


# -- the group-overhead phase -----------------------------------------------------


def test_group_overhead_batches_come_after_the_runs_batches_on_fresh_parts():
    settings = BenchSettings(
        scale_factors=(1.0,),
        change_sizes=(1.0, 0.1),
        batch_kinds=("rf",),
        repetitions=1,
        models=MODELS,
        work_dir=Path("work"),
        results_dir=Path("results"),
        label="t",
        group_overhead_pairs=3,
    )
    plan = plan_run(settings)
    overhead = [batch for pair in plan.group_overhead for batch in pair]
    assert len(overhead) == 6
    # The smallest of --sizes, always rf (it changes lineitem, which every model reads).
    assert {(b.kind, b.size) for b in overhead} == {("rf", 0.1)}
    assert [b.repetition for b in overhead] == [0, 0, 1, 1, 2, 2]
    everything = [*plan.batches, *overhead]
    assert [b.sequence for b in everything] == list(range(1, 9))
    parts = [part for b in everything for part in (*b.insert_parts, *b.delete_parts)]
    assert len(parts) == len(set(parts))


def test_zero_repetitions_leaves_only_the_group_overhead_phase():
    settings = BenchSettings(
        scale_factors=(1.0,),
        change_sizes=(0.1,),
        batch_kinds=("rf",),
        repetitions=0,
        models=MODELS,
        work_dir=Path("work"),
        results_dir=Path("results"),
        label="t",
        group_overhead_pairs=1,
    )
    plan = plan_run(settings)
    assert plan.batches == []
    assert len(plan.group_overhead) == 1


def _overhead_run(mode, pair, invocation, q01, q06, *, commits=None, action="INCREMENTAL"):
    nodes = [
        {"model": "q01_ivm", "seconds": q01, "action": action, "message": "", "ok": True},
        {"model": "q06_ivm", "seconds": q06, "action": "INCREMENTAL", "message": "", "ok": True},
    ]
    if commits is None:
        commits = (
            [{"members": 2, "group_seconds": q01 + q06, "publication_window_seconds": 0.2 * pair}]
            if mode == "grouped"
            else []
        )
    return {
        "pair": pair,
        "mode": mode,
        "position": 0,
        "batch": {"size": 0.1, "changed_rows": 15_000},
        "ok": True,
        "error": None,
        "invocation_seconds": invocation,
        "models_seconds": q01 + q06,
        "jobs": 100 if mode == "grouped" else 110,
        "input_bytes": 1_000_000,
        "nodes": nodes,
        "commits": commits,
        "views_moved_seconds": [0.1 * pair] if mode == "grouped" else [],
    }


def _overhead_results(runs):
    """A results file with only a group-overhead phase, complete enough to draw the markdown."""
    results = _results({}, "NO_CHANGE", ["lineitem"])
    results.update(
        label="t",
        started_at="2026-11-26T13:00:00+0000",
        environment={"cores": 2, "versions": {}, "delta": "4.0.1"},
        session={"reused": True},
    )
    results["settings"].update(
        models=["q01", "q06"],
        model_reads={"q01": ["lineitem"], "q06": ["lineitem", "part"]},
        scale_factors=[1],
        change_sizes=[0.1],
        batch_kinds=["rf"],
        repetitions=0,
        group_overhead_pairs=3,
        group_overhead_size=0.1,
    )
    results["scales"][0].update(
        runs=[],
        batches=[],
        storage=[],
        group_overhead=runs,
        source_rows={"lineitem": 6_001_215, "orders": 1_500_000},
        generate_reused=True,
        load_seconds=30.0,
        dbt_parse_seconds=1.5,
    )
    return results


def test_the_group_overhead_summary_compares_the_modes_medians():
    runs = [
        _overhead_run("grouped", 1, 12.0, 5.0, 6.0),
        _overhead_run("grouped", 2, 14.0, 6.0, 7.0),
        _overhead_run("grouped", 3, 13.0, 5.5, 6.5),
        _overhead_run("independent", 1, 10.0, 5.0, 4.0),
        _overhead_run("independent", 2, 11.0, 4.0, 5.0),
        _overhead_run("independent", 3, 30.0, 4.5, 4.5),
    ]
    results = _overhead_results(runs)
    summary = report.group_overhead_summary(results["scales"][0])
    assert summary.grouped.invocation_seconds == 13.0
    assert summary.independent.invocation_seconds == 11.0
    assert summary.invocation_difference == 2.0
    assert summary.invocation_ratio == pytest.approx(13 / 11)
    assert summary.models_difference == pytest.approx(12.0 - 9.0)
    assert summary.grouped.model_seconds == {"q01_ivm": 5.5, "q06_ivm": 6.5}
    assert summary.publication_window_seconds == pytest.approx(0.4)
    assert summary.views_moved_seconds == pytest.approx(0.2)
    assert report.problems(results) == []
    text = report.markdown(results, [])
    assert "### Group commit overhead" in text
    assert "| invocation wall time, s | 13.00 | 11.00 | +2.00 | 1.182 |" in text
    # Every run listed under the medians, the grouped ones with their window.
    assert "| 2 | grouped | ? | 14.00 | 13.00 | 100 | 0.40 | ? |" in text
    assert "| 3 | independent | ? | 30.00 | 9.00 | 110 | - | ? |" in text
    # The pins: q01 and q06 share lineitem, so 2 sources pinned once vs 3 in all.
    assert "2 sources, where the independent refreshes pin each model's own, 3 in all" in text


def test_no_group_overhead_section_without_both_modes():
    results = _overhead_results([_overhead_run("grouped", 1, 12.0, 5.0, 6.0)])
    assert report.group_overhead_summary(results["scales"][0]) is None
    assert "Group commit overhead" not in report.markdown(results, [])


@pytest.mark.parametrize(
    ("run", "flagged"),
    [
        (_overhead_run("grouped", 1, 1.0, 1.0, 1.0, action="REBUILD"), "refresh was REBUILD"),
        (_overhead_run("grouped", 1, 1.0, 1.0, 1.0, commits=[]), "expected one group commit"),
        (
            _overhead_run(
                "grouped",
                1,
                1.0,
                1.0,
                1.0,
                commits=[{"members": 2, "group_seconds": 2.0, "publication_window_seconds": None}],
            ),
            "no 'published' row",
        ),
        (
            _overhead_run("independent", 1, 1.0, 1.0, 1.0, commits=[{"members": 2}]),
            "its models were grouped",
        ),
    ],
    ids=["not-incremental", "no-commit", "unpublished", "independent-but-grouped"],
)
def test_the_report_flags_group_overhead_runs_that_did_not_do_what_their_mode_says(run, flagged):
    (problem,) = report.problems(_overhead_results([run]))
    assert flagged in problem


def test_commit_rows_pair_into_publication_windows():
    rows = [
        {"commit_id": "c1", "kind": "published", "group_name": "g", "members": 2,
         "group_seconds": 9.5, "committed_at": "t1", "micros": 3_250_000},
        {"commit_id": "c1", "kind": "commit", "group_name": "g", "members": 2,
         "group_seconds": 9.0, "committed_at": "t0", "micros": 3_000_000},
    ]  # fmt: skip
    (commit,) = commits_from_rows(rows)
    assert commit.group_seconds == 9.0
    assert commit.publication_window_seconds == 0.25
    assert (commit.committed_at, commit.published_at) == ("t0", "t1")
    (unpublished,) = commits_from_rows(rows[1:])
    assert unpublished.publication_window_seconds is None


def test_the_commit_line_of_the_dbt_log_gives_the_views_moved_time():
    line = (
        "consistency group 'q14_promotion_effect_ivm' committed 3f2a9c1e0b7d: "
        "tpch_sf1_models.q01_pricing_summary_ivm@7 (incremental, 3.1s); sources "
        "tpch_sf1.lineitem@12; group refresh 41.2s, views moved within 0.41s "
        "(log: tpch_sf1_models.ivm_group_commits)"
    )
    assert views_moved_seconds(["q01: refreshed; consistency group ...", line]) == [0.41]


def test_plots_of_the_committed_results_go_where_the_docs_site_serves_them(tmp_path):
    assert plots_dir_for(DEFAULT_RESULTS_DIR) == DEFAULT_PLOTS_DIR
    assert DEFAULT_PLOTS_DIR.relative_to(DEFAULT_RESULTS_DIR.parents[1]) == Path(
        "docs/assets/bench"
    )
    assert plots_dir_for(tmp_path) == tmp_path  # a run elsewhere keeps them beside its results
    results = _overhead_results([])
    text = report.markdown(results, [Path("../../docs/assets/bench/t-refresh-vs-scale.png")])
    assert "![t-refresh-vs-scale](../../docs/assets/bench/t-refresh-vs-scale.png)" in text


def test_the_comparison_puts_each_run_s_own_ratio_side_by_side(tmp_path):
    from tpch_bench import compare

    runs = sorted((Path(__file__).parents[2] / "bench" / "results" / "issue20").glob("sf1-*.json"))
    assert compare.main([*map(str, runs), "--out", str(tmp_path), "--label", "c"]) == 0
    text = (tmp_path / "c.md").read_text()
    assert (tmp_path / "c-ratios.png").stat().st_size > 0
    for path in runs:
        run = compare.Run.load(path)
        assert f"`{run.name}`" in text
        q1 = run.summaries[((1.0, "rf", 0.1), "q01_pricing_summary")]
        # The ratio is the run's own rebuild over its own refresh.
        assert f"{q1.ivm_seconds:.2f} | {q1.table_seconds:.2f} | {q1.speedup:.1f}x" in text
    assert text.count("| q01_pricing_summary |") == 1


def test_runs_of_one_commit_embedded_and_on_a_cluster_keep_apart(tmp_path):
    from tpch_bench import compare

    runs = Path(__file__).parents[2] / "bench" / "results" / "issue22"
    embedded = compare.Run.load(runs / "sf1-rf01-embedded.json")
    on_cluster = compare.Run.load(runs / "sf1-rf01-cluster.json")
    assert on_cluster.name == embedded.name + " on the cluster"
    assert report.load_results(runs / "sf1-rf01-cluster.json")["session"]["master"].startswith(
        "spark://"
    )


def test_runs_of_one_commit_on_two_engines_are_named_by_them(tmp_path):
    import json

    from tpch_bench import compare

    source = Path(__file__).parents[2] / "bench" / "results" / "issue20" / "sf1-rf01-7449f0e.json"
    results = json.loads(source.read_text())
    paths = []
    for spark, delta in [("4.0.5", "4.0.1"), ("4.2.1", "4.4.0")]:
        results["environment"]["versions"]["pyspark"] = spark
        results["environment"]["delta"] = delta
        path = tmp_path / f"{spark}.json"
        path.write_text(json.dumps(results))
        paths.append(path)
    assert compare.main([*map(str, paths), "--out", str(tmp_path), "--label", "c"]) == 0
    text = (tmp_path / "c.md").read_text()
    assert "`7449f0e on Spark 4.0.5 + Delta 4.0.1`, `7449f0e on Spark 4.2.1 + Delta 4.4.0`" in text
    # Runs on one engine keep their commit's name alone.
    assert compare.Run.load(paths[0]).name == "7449f0e"


def test_example_runs_reads_each_runs_table_and_reports_totals_ratios_and_models_under_build():
    from micro import example_runs

    def output(refresh: float, heading: str = example_runs.HEADING) -> str:
        return (
            "Incremental refresh: only the change feed is read\n  model  seconds  what happened\n"
            "  a  9.00  IVM incremental\n"
            f"{heading} (seconds)\n"
            "  model                 refresh    build    table  table/refresh\n"
            f"  a                     {refresh:.2f}     3.00     1.00          0.50x\n"
            "  b                     1.00     2.00     0.50          0.50x\n"
            f"  all models            {refresh + 1:.2f}     5.00     1.50          0.50x\n"
            "Refresh with no new source commits\n"
        )

    # An output from before the second day was added reads the same.
    old = example_runs.read_run(output(4.0, example_runs.EARLIER_HEADING))
    runs = {"old": old, "new": example_runs.read_run(output(2.0))}
    assert runs["new"]["a"] == example_runs.ModelTimes(2.0, 3.0, 1.0)
    assert set(runs["old"]) == {"a", "b", example_runs.TOTAL}
    table = example_runs.report(runs).split("\n")
    assert "| `a` | 4.00 | 2.00 |" in table
    assert "| all models: refreshes | 5.00 | 3.00 |" in table
    assert "| all models: table / refresh | 0.30x | 0.50x |" in table
    assert "| refreshes under their first build | 1 of 2 | 2 of 2 |" in table


def test_a_label_naming_a_folder_gets_that_folder_for_results_and_plots(tmp_path, monkeypatch):
    # The plots themselves need a whole run's results; a stand-in writes the
    # file each would, where report.plots writes it (under the label's path).
    def plots(results, directory: Path, label: str) -> list[Path]:
        plot = directory / f"{label}-refresh-vs-scale.png"
        plot.write_bytes(b"png")
        return [plot]

    monkeypatch.setattr(report, "plots", plots)
    monkeypatch.setattr(report, "markdown", lambda results, links: "\n".join(map(str, links)))
    written = report.write_report(
        {"label": "issue54/run"},
        tmp_path / "results",
        "issue54/run",
        plots_directory=tmp_path / "assets",
    )
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "results/issue54/run.json",
        "results/issue54/run.md",
        "assets/issue54/run-refresh-vs-scale.png",
    ]
    assert (
        tmp_path / "results/issue54/run.md"
    ).read_text() == "../../assets/issue54/run-refresh-vs-scale.png"


def test_the_cpu_profile_sums_each_statements_tasks_and_splits_dbt_invocations():
    import json

    from tpch_bench.cpu_profile import invocations, read, render

    def job(job_id, stages, description, submitted):
        return {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Submission Time": submitted,
            "Stage IDs": stages,
            "Properties": {"spark.job.description": description},
        }

    def task(stage, nanoseconds):
        return {
            "Event": "SparkListenerTaskEnd",
            "Stage ID": stage,
            "Task Metrics": {"Executor CPU Time": nanoseconds},
        }

    log = [
        job(0, [0, 1], "model.p.a (ivm): MERGE INTO `s`.`a__ivm_state` AS t", 1_000),
        task(0, 2_000_000_000),
        task(1, 500_000_000),
        # Delta's own job for a's MERGE: counted with it.
        job(5, [6], "Delta: model.p.a (ivm): MERGE INTO `s`.`a__ivm_state` AS t: Writing", 1_500),
        task(6, 1_000_000_000),
        job(1, [2], "model.p.b (ivm): INSERT INTO `s`.`b__ivm_state`", 2_000),
        task(2, 1_000_000_000),
        job(2, [3], "test.p.t (ivm): select 1", 3_000),
        task(3, 4_000_000_000),
        job(3, [4], "model.p.a (table): create or replace table `t`.`a`", 4_000),
        task(4, 3_000_000_000),
        job(4, [5], "sql at NativeMethodAccessorImpl.java:0", 5_000),  # no dbt node: left out
        task(5, 9_000_000_000),
    ]
    jobs, cpu = read(json.dumps(e) for e in log)
    found = invocations(jobs, cpu)
    assert [(i.kind, i.target, round(i.seconds, 1)) for i in found] == [
        ("model", "ivm", 4.5),
        ("test", "ivm", 4.0),
        ("model", "table", 3.0),
    ]
    shown = render(found[0], top=5)
    assert "4.5 CPU s" in shown and "MERGE INTO 3.5, INSERT INTO 1.0" in shown
    assert "     3.5  a" in shown


def test_thread_cpu_sums_each_kind_per_invocation_and_counts_a_new_jvm_from_zero(tmp_path):
    import json

    from tpch_bench import thread_cpu

    # A real sample reads this machine's /proc: its keys name a pid and a kind.
    assert all(" " in key for key in thread_cpu.Sampler(own_pid=-1).sample())
    assert thread_cpu.jvm_kind("C2 CompilerThre") == "JIT compilation"

    samples = [
        {"t": 1000.0, "cpu": {"7 tasks": 10.0, "7 jit": 5.0, "3 python": 1.0}},
        {"t": 1010.0, "cpu": {"7 tasks": 18.0, "7 jit": 9.0, "3 python": 2.0}},
        # The first JVM ended; the second invocation's JVM starts from zero.
        {"t": 1030.0, "cpu": {"8 tasks": 12.0, "8 jit": 2.0, "3 python": 3.0}},
    ]
    (tmp_path / "cpu.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    day = "1970-01-01"
    log = tmp_path / "dbt.log"
    log.write_text(
        "\x1b[0m00:16:40.000000 [info ] [MainThread]: Running with dbt=1.11\n"
        "\x1b[0m00:16:50.000000 [info ] [MainThread]: Done.\n"
        "\x1b[0m00:16:50.000000 [info ] [MainThread]: Running with dbt=1.11\n"
        "\x1b[0m00:17:10.000000 [info ] [MainThread]: Done.\n"
    )
    windows = thread_cpu.invocations(log.read_text().splitlines(), day)
    assert [(w.start, w.end) for w in windows] == [(1000.0, 1010.0), (1010.0, 1030.0)]
    shown = thread_cpu.render(windows, samples, cores=2)
    assert "invocation 1: 10.0 s wall, 13.0 CPU s (65% of 2 cores)" in shown
    assert "invocation 2: 20.0 s wall, 15.0 CPU s (38% of 2 cores)" in shown
