"""From the results JSON to what a reader looks at: a markdown report and PNG plots.

Everything here is derived from the JSON alone (``python -m tpch_bench --report-only
RESULTS.json`` redraws it), so the raw runs stay the one record of a benchmark.
Medians are taken over repetitions; the speed-up is table time / ivm time, so
above 1 means the ivm refresh was faster.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The phrase every ivm compiler refusal carries (ivm_compiler's NotMaintainable):
# a refused model is a finding of the benchmark, not a failure of the run.
REFUSAL_PHRASE = "cannot be maintained incrementally"


def is_refusal(message: str | None) -> bool:
    return bool(message) and REFUSAL_PHRASE in str(message)


@dataclass(frozen=True)
class BatchSummary:
    scale_factor: float
    kind: str
    size: float
    model: str
    ivm_seconds: float
    table_seconds: float
    ivm_jobs: float
    table_jobs: float
    ivm_input_bytes: float
    table_input_bytes: float
    repetitions: int
    ivm_actions: tuple[str, ...]
    guard_ok: bool

    @property
    def speedup(self) -> float:
        return self.table_seconds / self.ivm_seconds if self.ivm_seconds else float("nan")


def load_results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def measured_scales(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The scale factors with results so far (a running benchmark has a placeholder for the next)."""
    return [scale for scale in results["scales"] if scale is not None]


def batch_summaries(results: dict[str, Any]) -> list[BatchSummary]:
    summaries = []
    for scale in measured_scales(results):
        checks_by_batch = defaultdict(list)
        for check in scale["checks"]:
            if check["phase"] == "batch":
                checks_by_batch[(check["model"], check["batch_sequence"])].append(check["equal"])
        grouped: dict[tuple[str, float, str], dict[str, list[dict[str, Any]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for run in scale["runs"]:
            if run["phase"] == "batch" and run["ok"]:
                grouped[(run["kind"], run["size"], run["model"])][run["way"]].append(run)
        for (kind, size, model), by_way in grouped.items():
            ivm, table = by_way.get("ivm", []), by_way.get("table", [])
            if not ivm or not table:
                continue
            batches = {run["batch_sequence"] for run in ivm}
            guard = [ok for sequence in batches for ok in checks_by_batch[(model, sequence)]]
            summaries.append(
                BatchSummary(
                    scale_factor=scale["scale_factor"],
                    kind=kind,
                    size=size,
                    model=model,
                    ivm_seconds=_median(r["seconds"] for r in ivm),
                    table_seconds=_median(r["seconds"] for r in table),
                    ivm_jobs=_median(r["jobs"] for r in ivm),
                    table_jobs=_median(r["jobs"] for r in table),
                    ivm_input_bytes=_median(r["input_bytes"] for r in ivm),
                    table_input_bytes=_median(r["input_bytes"] for r in table),
                    repetitions=min(len(ivm), len(table)),
                    ivm_actions=tuple(sorted({r["action"] for r in ivm})),
                    guard_ok=bool(guard) and all(guard),
                )
            )
    model_order = _model_order(results)
    return sorted(summaries, key=lambda s: (s.scale_factor, s.kind, model_order(s.model), s.size))


@dataclass(frozen=True)
class ModeSummary:
    """One mode of the group-overhead phase: medians over its successful runs."""

    mode: str
    runs: int
    invocation_seconds: float
    models_seconds: float  # the sum of the models' dbt execution times
    jobs: float
    input_bytes: float
    # Each model's median execution time.
    model_seconds: dict[str, float]


@dataclass(frozen=True)
class GroupOverheadSummary:
    scale_factor: float
    size: float
    changed_rows: float
    grouped: ModeSummary
    independent: ModeSummary
    # Medians over the grouped runs' commits: 'commit' row to 'published' row
    # (the commit log's committed_at), the dbt log's "views moved within", and
    # the group's time from its first member's start to the 'commit' row.
    publication_window_seconds: float
    views_moved_seconds: float
    group_seconds: float

    @property
    def invocation_difference(self) -> float:
        return self.grouped.invocation_seconds - self.independent.invocation_seconds

    @property
    def invocation_ratio(self) -> float:
        return _quotient(self.grouped.invocation_seconds, self.independent.invocation_seconds)

    @property
    def models_difference(self) -> float:
        return self.grouped.models_seconds - self.independent.models_seconds

    @property
    def models_ratio(self) -> float:
        return _quotient(self.grouped.models_seconds, self.independent.models_seconds)


def group_overhead_summary(scale: dict[str, Any]) -> GroupOverheadSummary | None:
    """The scale factor's group-overhead phase, or None when it has no successful run of a mode."""
    records = [r for r in scale.get("group_overhead") or [] if r["ok"]]
    modes = {}
    for mode in ("grouped", "independent"):
        runs = [r for r in records if r["mode"] == mode]
        if not runs:
            return None
        per_model: dict[str, list[float]] = defaultdict(list)
        for run in runs:
            for node in run["nodes"]:
                per_model[node["model"]].append(node["seconds"])
        modes[mode] = ModeSummary(
            mode=mode,
            runs=len(runs),
            invocation_seconds=_median(r["invocation_seconds"] for r in runs),
            models_seconds=_median(r["models_seconds"] for r in runs),
            jobs=_median(r["jobs"] for r in runs),
            input_bytes=_median(r["input_bytes"] for r in runs),
            model_seconds={model: _median(times) for model, times in per_model.items()},
        )
    commits = [c for r in records if r["mode"] == "grouped" for c in r["commits"]]
    return GroupOverheadSummary(
        scale_factor=scale["scale_factor"],
        size=records[0]["batch"]["size"],
        changed_rows=_median(r["batch"]["changed_rows"] for r in records),
        grouped=modes["grouped"],
        independent=modes["independent"],
        publication_window_seconds=_median(
            c["publication_window_seconds"]
            for c in commits
            if c["publication_window_seconds"] is not None
        ),
        views_moved_seconds=_median(
            seconds
            for r in records
            if r["mode"] == "grouped"
            for seconds in r["views_moved_seconds"]
        ),
        group_seconds=_median(
            c["group_seconds"] for c in commits if c["group_seconds"] is not None
        ),
    )


def _group_overhead_problems(scale: dict[str, Any]) -> list[str]:
    """A run that failed, did not refresh incrementally, or did not publish as its mode says."""
    found = []
    sf = f"SF {scale['scale_factor']:g}"
    for record in scale.get("group_overhead") or []:
        run = f"{sf}: group-overhead pair {record['pair']} {record['mode']}"
        if record["error"]:
            found.append(f"{run} failed: {record['error']}")
        for node in record["nodes"]:
            if not node["ok"]:
                found.append(f"{run}: {node['model']} failed: {node['message']}")
            elif node["action"] not in ("INCREMENTAL", "RECOMPUTE"):
                # Every model reads lineitem, which every rf batch changes
                # (RECOMPUTE: ivm_strategy auto chose to recompute it).
                found.append(
                    f"{run}: {node['model']} refresh was {node['action']}, not INCREMENTAL "
                    f"or RECOMPUTE: {node['message']}"
                )
        commits = record["commits"]
        if record["mode"] == "independent" and commits:
            found.append(f"{run} wrote {len(commits)} group commit(s): its models were grouped")
        if record["mode"] == "grouped" and record["ok"]:
            if len(commits) != 1 or commits[0]["members"] != len(record["nodes"]):
                found.append(
                    f"{run}: expected one group commit of {len(record['nodes'])} members, "
                    f"the commit log has {[c['members'] for c in commits]}"
                )
            elif commits[0]["publication_window_seconds"] is None:
                found.append(f"{run}: its commit has no 'published' row")
    return found


def problems(results: dict[str, Any]) -> list[str]:
    """What makes a run's numbers untrustworthy: wrong answers, failed runs, non-incremental refreshes."""
    found = []
    model_reads = {name: set(tables) for name, tables in results["settings"]["model_reads"].items()}
    for scale in measured_scales(results):
        sf = f"SF {scale['scale_factor']:g}"
        for check in scale["checks"]:
            if not check["equal"]:
                found.append(
                    f"{sf}: {check['model']} ivm differs from table after "
                    f"{_batch_name(check)} ({check['missing_from_ivm']} missing, "
                    f"{check['extra_in_ivm']} extra rows)"
                )
        for status in scale["models"]:
            if status["table_error"]:
                found.append(f"{sf}: {status['model']} table failed: {status['table_error']}")
            if status["ivm_error"] and not is_refusal(status["ivm_error"]):
                found.append(f"{sf}: {status['model']} ivm failed: {status['ivm_error']}")
        changed_tables = {
            batch["sequence"]: {table for table, changes in batch["changes"].items() if changes}
            for batch in scale["batches"]
        }
        for run in scale["runs"]:
            if run["way"] != "ivm" or not run["ok"] or run["phase"] == "first_build":
                continue
            expected = _expected_actions(run, changed_tables, model_reads)
            if run["action"] not in expected:
                found.append(
                    f"{sf}: {run['model']} ivm {run['phase']} refresh was {run['action']}, "
                    f"not {' or '.join(expected)}: {run['message']}"
                )
        found += _group_overhead_problems(scale)
    return found


def _expected_actions(
    run: dict[str, Any], changed_tables: dict[int, set[str]], model_reads: dict[str, set[str]]
) -> tuple[str, ...]:
    """What an ivm refresh may do: nothing new to read means NO_CHANGE, else apply it.

    Applying is INCREMENTAL, or RECOMPUTE when ivm_strategy: auto estimated
    recomputing cheaper (a choice, reported with its estimates, not a
    rebuild for lack of change data). A batch that changes none of a model's
    sources (customer updates under Q1, or a 0.1 % customer batch that
    selects no customer at SF 0.01) leaves it unchanged.
    """
    if run["phase"] == "no_change":
        return ("NO_CHANGE",)
    touched = changed_tables.get(run["batch_sequence"], set()) & model_reads.get(
        run["model"], set()
    )
    return ("INCREMENTAL", "RECOMPUTE") if touched else ("NO_CHANGE",)


# -- markdown -----------------------------------------------------------------


def markdown(results: dict[str, Any], plots: list[Path]) -> str:
    """The report; ``plots`` are paths relative to the markdown file's directory."""
    env = results["environment"]
    session = results["session"]
    lines = [
        f"# TPC-H refresh benchmark: {results['label']}",
        "",
        (
            f"Run {results['started_at']} to {results.get('finished_at') or '(unfinished)'} on "
            f"{env['cores']} cores; dbt-spark-ivm {env['versions'].get('dbt-spark-ivm')} "
            f"(commit {env.get('git_commit') or '?'}), dbt-core {env['versions'].get('dbt-core')}, "
            f"pyspark {env['versions'].get('pyspark')}, Delta {env['delta']}, "
            f"tpchgen-cli {env['versions'].get('tpchgen-cli')}."
        ),
        "",
        (
            f"Settings: scale factors {_join(results['settings']['scale_factors'])}; change sizes "
            f"{_join(results['settings']['change_sizes'])} %; batch kinds "
            f"{', '.join(results['settings']['batch_kinds'])}; {results['settings']['repetitions']} "
            "repetition(s), times are medians"
            + _group_overhead_setting(results["settings"])
            + f"; ivm_join_state {results['settings'].get('join_state', 'none')!r}"
            + f", ivm_strategy {results['settings'].get('strategy', 'auto')!r}"
            + f", ivm_state_form {results['settings'].get('state_form', 'merged')!r}."
        ),
        "",
        "Spark: "
        + (
            "the session as the driver of a local standalone cluster (a master and two "
            "workers of one core, each its own JVM), every task in an executor of another JVM"
            if results["settings"].get("cluster")
            else "embedded, local[2] (driver and executors in one JVM)"
        )
        + (f", master {session['master']}." if session.get("master") else "."),
        "",
        "JVM and SparkSession start (not in any figure below): "
        + (
            "not measured, the session was already running in this process."
            if session["reused"]
            else f"{session['seconds']:.1f} s."
        ),
        "",
    ]
    found = problems(results)
    lines += ["## Problems", ""]
    lines += [f"- {problem}" for problem in found] or [
        (
            "None: every ivm model equaled its table twin after every batch, and every ivm "
            "refresh after a batch that changed its sources applied the change or, where "
            "ivm_strategy 'auto' chose to, recomputed it (and found no change when the batch "
            "left its sources alone)."
        )
    ]
    lines.append("")

    refusals = [
        (scale["scale_factor"], status)
        for scale in measured_scales(results)
        for status in scale["models"]
        if is_refusal(status["ivm_error"])
    ]
    if refusals:
        lines += ["## Refused by the ivm compiler", ""]
        lines += [
            f"- SF {sf:g} `{status['model']}`: {status['ivm_error']}" for sf, status in refusals
        ]
        lines.append("")

    summaries = batch_summaries(results)
    for scale in measured_scales(results):
        sf = scale["scale_factor"]
        lines += [
            f"## SF {sf:g}",
            "",
            f"Sources: {scale['source_rows'].get('lineitem', 0):,} lineitems, "
            f"{scale['source_rows'].get('orders', 0):,} orders; generated in "
            + ("(reused)" if scale["generate_reused"] else f"{scale['generate_seconds']:.1f} s")
            + f", loaded in {scale['load_seconds']:.1f} s; dbt parse {scale['dbt_parse_seconds']:.1f} s.",
            "",
        ]
        lines += _first_build_table(scale)
        lines += _no_change_table(scale)
        for kind in results["settings"]["batch_kinds"]:
            rows = [s for s in summaries if s.scale_factor == sf and s.kind == kind]
            if rows:
                lines += _batch_table(kind, rows, scale)
        overhead = group_overhead_summary(scale)
        if overhead is not None:
            lines += _group_overhead_section(overhead, results["settings"]["model_reads"])
            lines += _group_overhead_runs(scale["group_overhead"])
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{plot.stem}]({plot.as_posix()})" for plot in plots]
        lines.append("")
    return "\n".join(lines)


def _first_build_table(scale: dict[str, Any]) -> list[str]:
    builds: dict[str, dict[str, float]] = defaultdict(dict)
    for run in scale["runs"]:
        if run["phase"] == "first_build" and run["ok"]:
            builds[run["model"]][run["way"]] = run["seconds"]
    storage = {s["model"]: s for s in scale["storage"] if s["phase"] == "first_build"}
    lines = [
        "### First build",
        "",
        "| model | table s | ivm s | ivm / table | table size | ivm state size "
        + "| state / table | state rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, ways in builds.items():
        if "ivm" not in ways or "table" not in ways or model not in storage:
            continue
        kept = storage[model]
        lines.append(
            f"| {model} | {ways['table']:.2f} | {ways['ivm']:.2f} | "
            f"{_ratio(ways['ivm'], ways['table'])} | {_size(kept['table_bytes'])} | "
            f"{_size(kept['state_bytes'])} | {_ratio(kept['state_bytes'], kept['table_bytes'])} | "
            f"{kept['state_rows']:,} |"
        )
    return [*lines, ""]


def _no_change_table(scale: dict[str, Any]) -> list[str]:
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in scale["runs"]:
        if run["phase"] == "no_change" and run["ok"]:
            runs[run["model"]].append(run)
    if not runs:  # --repetitions 0 skips them
        return []
    lines = [
        "### Refresh with no source change",
        "",
        "| model | ivm s | Spark jobs | read | action |",
        "|---|---:|---:|---:|---|",
    ]
    for model, model_runs in runs.items():
        lines.append(
            f"| {model} | {_median(r['seconds'] for r in model_runs):.2f} | "
            f"{_median(r['jobs'] for r in model_runs):g} | "
            f"{_size(_median(r['input_bytes'] for r in model_runs))} | "
            f"{', '.join(sorted({r['action'] for r in model_runs}))} |"
        )
    return [*lines, ""]


def _batch_table(kind: str, rows: list[BatchSummary], scale: dict[str, Any]) -> list[str]:
    changed: dict[float, list[int]] = defaultdict(list)
    for batch in scale["batches"]:
        if batch["kind"] == kind:
            changed[batch["size"]].append(batch["changed_rows"])
    sizes = ", ".join(
        f"{size:g} % = {_median(counts):,.0f} rows" for size, counts in sorted(changed.items())
    )
    lines = [
        f"### Batches `{kind}` (rows changed per batch: {sizes})",
        "",
        (
            "| model | size % | ivm s | table s | table / ivm | ivm jobs | table jobs "
            "| ivm read | table read | ivm action | guard |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        speed = f"{row.speedup:.1f}x" if row.guard_ok else "WRONG ANSWER"
        lines.append(
            f"| {row.model} | {row.size:g} | {row.ivm_seconds:.2f} | {row.table_seconds:.2f} | "
            f"{speed} | {row.ivm_jobs:g} | {row.table_jobs:g} | "
            f"{_size(row.ivm_input_bytes)} | {_size(row.table_input_bytes)} | "
            f"{', '.join(row.ivm_actions)} | {'equal' if row.guard_ok else 'DIFFERS'} |"
        )
    return [*lines, ""]


def group_overhead_explained(shared_pins: int, own_pins: int) -> str:
    """What a grouped run does that independent refreshes do not.

    (consistency/publish.py, and refresh/recipe.py's pin.)
    """
    return (
        "What the difference consists of: a grouped run pins every source of the group "
        "once, when its first member starts (a DESCRIBE DETAIL and a DESCRIBE HISTORY per "
        f"source: {shared_pins} sources, where the independent refreshes pin each model's "
        f"own, {own_pins} in all), holds every member's view until the last member has "
        "written its state, then appends two rows to the commit log (the 'commit' row "
        "that decides the group's state and the 'published' row that closes it, each a "
        "Delta commit) around the same one ALTER VIEW per model that independent "
        "refreshes run right after each refresh; the last member's time carries the commit."
    )


def _group_overhead_runs(records: list[dict[str, Any]]) -> list[str]:
    """Every run of the phase, so a reader can see the spread behind the medians."""
    lines = [
        (
            "Every run (load: the machine's 1-minute load average right after the run; well "
            "above the session's 2 cores, another process competed for them):"
        ),
        "",
        (
            "| pair | mode | started | invocation s | models s | Spark jobs "
            "| publication window s | load |"
        ),
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for record in records:
        windows = [
            c["publication_window_seconds"]
            for c in record["commits"]
            if c["publication_window_seconds"] is not None
        ]
        load = record.get("load_average")
        lines.append(
            f"| {record['pair']} | {record['mode']} | {record.get('started_at') or '?'} | "
            f"{record['invocation_seconds']:.2f} | {record['models_seconds']:.2f} | "
            f"{record['jobs']} | {', '.join(f'{w:.2f}' for w in windows) or '-'} | "
            f"{'?' if load is None else f'{load:.1f}'} |"
        )
    return [*lines, ""]


def _group_overhead_setting(settings: dict[str, Any]) -> str:
    pairs = settings.get("group_overhead_pairs") or 0
    if not pairs:
        return ""
    return f"; group overhead: {pairs} pair(s) of rf {settings['group_overhead_size']:g} % runs"


def _group_overhead_section(
    summary: GroupOverheadSummary, model_reads: dict[str, list[str]]
) -> list[str]:
    grouped, independent = summary.grouped, summary.independent
    reads = [
        set(model_reads.get(model.removesuffix("_ivm"), ())) for model in grouped.model_seconds
    ]
    shared_pins = len(set().union(*reads)) if reads else 0
    lines = [
        "### Group commit overhead",
        "",
        (
            f"Every ivm model ({len(grouped.model_seconds)}) refreshed in one dbt invocation "
            f"after a fresh `rf` batch of {summary.size:g} % ({summary.changed_rows:,.0f} rows "
            "changed): **grouped**, as one consistency group (they all read lineitem), or "
            "**independent**, each with `ivm_group: 'none'`, published on its own. "
            f"{grouped.runs} grouped and {independent.runs} independent runs, the mode going "
            "first alternating between pairs; medians."
        ),
        "",
        "| | grouped | independent | grouped - independent | grouped / independent |",
        "|---|---:|---:|---:|---:|",
        (
            f"| invocation wall time, s | {grouped.invocation_seconds:.2f} | "
            f"{independent.invocation_seconds:.2f} | {summary.invocation_difference:+.2f} | "
            f"{summary.invocation_ratio:.3f} |"
        ),
        (
            f"| models' execution time (sum), s | {grouped.models_seconds:.2f} | "
            f"{independent.models_seconds:.2f} | {summary.models_difference:+.2f} | "
            f"{summary.models_ratio:.3f} |"
        ),
        (
            f"| Spark jobs | {grouped.jobs:g} | {independent.jobs:g} | "
            f"{grouped.jobs - independent.jobs:+g} | {_quotient(grouped.jobs, independent.jobs):.3f} |"
        ),
        (
            f"| read | {_size(grouped.input_bytes)} | {_size(independent.input_bytes)} | | "
            f"{_quotient(grouped.input_bytes, independent.input_bytes):.3f} |"
        ),
        "",
        (
            "Publication window (the commit log's 'commit' row to its 'published' row): "
            f"{_seconds(summary.publication_window_seconds)}; the dbt log's \"views moved "
            f"within\": {_seconds(summary.views_moved_seconds)}; the group's refresh, from its "
            f"first member's start to the commit row: {_seconds(summary.group_seconds)}."
        ),
        "",
        group_overhead_explained(shared_pins, sum(len(tables) for tables in reads)),
        "",
        "| model | grouped s | independent s | grouped - independent |",
        "|---|---:|---:|---:|",
    ]
    for model, seconds in grouped.model_seconds.items():
        alone = independent.model_seconds.get(model, float("nan"))
        lines.append(f"| {model} | {seconds:.2f} | {alone:.2f} | {seconds - alone:+.2f} |")
    return [*lines, ""]


# -- plots ----------------------------------------------------------------------


def plots(results: dict[str, Any], directory: Path, label: str) -> list[Path]:
    """PNG plots: refresh time vs change size (one per batch kind) and vs scale factor."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    summaries = [s for s in batch_summaries(results) if s.guard_ok]
    if not summaries:
        return []
    written = []
    models = sorted({s.model for s in summaries}, key=_model_order(results))
    scales = sorted({s.scale_factor for s in summaries})
    colours = {sf: plt.get_cmap("tab10")(i) for i, sf in enumerate(scales)}
    for kind in results["settings"]["batch_kinds"]:
        rows = [s for s in summaries if s.kind == kind]
        if not rows:
            continue
        figure, axes = _grid(plt, len(models))
        for axis, model in zip(axes, models, strict=False):
            for sf in scales:
                points = sorted(
                    (s.size, s) for s in rows if s.model == model and s.scale_factor == sf
                )
                if not points:
                    continue
                sizes = [size for size, _ in points]
                axis.plot(
                    sizes,
                    [s.ivm_seconds for _, s in points],
                    "o-",
                    color=colours[sf],
                    label=f"ivm SF {sf:g}",
                )
                axis.plot(
                    sizes,
                    [s.table_seconds for _, s in points],
                    "s--",
                    color=colours[sf],
                    label=f"table SF {sf:g}",
                )
            _style(axis, model, "change size (% of rows)")
        figure.suptitle(f"Refresh time vs change size, batches '{kind}' (median)")
        path = directory / f"{label}-refresh-vs-change-{kind}.png"
        written.append(_save(plt, figure, axes, path))

    kind = "rf" if any(s.kind == "rf" for s in summaries) else summaries[0].kind
    size = min(s.size for s in summaries if s.kind == kind)
    figure, axes = _grid(plt, len(models))
    for axis, model in zip(axes, models, strict=False):
        points = sorted(
            (s.scale_factor, s)
            for s in summaries
            if s.kind == kind and s.size == size and s.model == model
        )
        factors = [sf for sf, _ in points]
        axis.plot(factors, [s.ivm_seconds for _, s in points], "o-", label="ivm refresh")
        axis.plot(factors, [s.table_seconds for _, s in points], "s--", label="table rebuild")
        _style(axis, model, "scale factor")
    figure.suptitle(f"Refresh time vs scale factor, batch '{kind}' {size:g} % (median)")
    written.append(_save(plt, figure, axes, directory / f"{label}-refresh-vs-scale.png"))
    return written


def _grid(plt: Any, count: int) -> tuple[Any, list[Any]]:
    columns = 3
    rows = max(1, -(-count // columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    return figure, [axis for row in axes for axis in row]


def _style(axis: Any, title: str, xlabel: str) -> None:
    from matplotlib import ticker

    axis.set_title(title, fontsize=9)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel(xlabel, fontsize=8)
    axis.set_ylabel("seconds", fontsize=8)
    axis.tick_params(labelsize=7)
    # Plain numbers at 1-2-5 steps on the log axes (a panel often spans less than a
    # decade, where the default shows no label at all); minor ticks unlabelled.
    for scale_axis in (axis.xaxis, axis.yaxis):
        scale_axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        scale_axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        scale_axis.set_minor_formatter(ticker.NullFormatter())
    axis.grid(True, which="both", alpha=0.3)


def _save(plt: Any, figure: Any, axes: list[Any], path: Path) -> Path:
    used = [axis for axis in axes if axis.lines]
    for axis in axes:
        if not axis.lines:
            axis.set_visible(False)
    if used:
        handles, labels = used[0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    figure.tight_layout(rect=(0, 0.06, 1, 0.95))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# -- writing ----------------------------------------------------------------------


def write_report(
    results: dict[str, Any],
    directory: Path,
    label: str,
    *,
    with_plots: bool = True,
    plots_directory: Path | None = None,
) -> list[Path]:
    """The JSON and the markdown of a run under ``directory``, its plots under
    ``plots_directory`` (default: ``directory``); returns the paths."""
    json_path = directory / f"{label}.json"
    # A label may name a folder (issue54/run): each output's own folder is made.
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    written_plots: list[Path] = []
    if with_plots:
        plots_directory = plots_directory or directory
        (plots_directory / label).parent.mkdir(parents=True, exist_ok=True)
        written_plots = plots(results, plots_directory, label)
    markdown_path = directory / f"{label}.md"
    links = [Path(os.path.relpath(plot, markdown_path.parent)) for plot in written_plots]
    markdown_path.write_text(markdown(results, links))
    return [json_path, markdown_path, *written_plots]


# -- helpers ----------------------------------------------------------------------


def _median(values: Iterable[float]) -> float:
    collected = list(values)
    return float(statistics.median(collected)) if collected else float("nan")


def _size(count: float) -> str:
    """Bytes for a reader: 812 B, 41.3 KB, 18.2 MB, 2.41 GB."""
    if math.isnan(count):  # nothing measured
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def _quotient(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def _seconds(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f} s"


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}" if denominator else "n/a"


def _join(values: Iterable[float]) -> str:
    return ", ".join(f"{value:g}" for value in values)


def _batch_name(check: dict[str, Any]) -> str:
    if check["phase"] == "group_overhead":
        return "the group-overhead phase"
    if check["batch_sequence"] is None:
        return "the first build"
    return f"batch {check['batch_sequence']}"


def _model_order(results: dict[str, Any]) -> Any:
    order = {name: i for i, name in enumerate(results["settings"]["models"])}
    return lambda model: order.get(model, len(order))
