"""Runs of the benchmark side by side: how a change to the code moved each model's refresh.

``python -m tpch_bench.compare OLD.json NEW.json [...] --out DIR --label NAME``
(from bench/, or with bench/ on the path) writes ``DIR/NAME.md``, a table per
scale factor, batch kind and size with each run's median refresh, the
`table` rebuild of the same run and their ratio, and ``DIR/NAME-ratios.png``,
the ratios as bars. Ratios are only compared within a run (the rebuild is
timed next to the refresh on the same data), never across runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpch_bench.report import BatchSummary, _model_order, batch_summaries, load_results

Key = tuple[float, str, float]  # scale factor, batch kind, change size


@dataclass(frozen=True)
class Run:
    """One results file: its name in the comparison and its batch summaries."""

    name: str
    summaries: dict[tuple[Key, str], BatchSummary]

    @classmethod
    def load(cls, path: Path, engines: bool = False) -> Run:
        """The run of a results file; `engines`: its name says its Spark and Delta."""
        results = load_results(path)
        environment = results.get("environment") or {}
        commit = environment.get("git_commit") or ""
        engine = _engine(environment) if engines else ""
        name = commit[:7] or results.get("label") or path.stem
        if (results.get("settings") or {}).get("cluster"):
            # Runs of one commit differ by where their tasks ran (bench/run --cluster).
            name += " on the cluster"
        if engine:
            # Or by the Spark they ran on (issue 55: the default pair beside the newest).
            name += f" on {engine}"
        by_key = {
            ((s.scale_factor, s.kind, s.size), s.model): s
            for s in batch_summaries(results)
            if s.guard_ok
        }
        return cls(name=name, summaries=by_key)


def _engine(environment: dict[str, Any]) -> str:
    """'Spark 4.2.1 + Delta 4.4.0', from a run's environment; '' where it did not record them.

    >>> _engine({"versions": {"pyspark": "4.2.1"}, "delta": "4.4.0"})
    'Spark 4.2.1 + Delta 4.4.0'
    """
    spark = (environment.get("versions") or {}).get("pyspark")
    delta = environment.get("delta")
    return f"Spark {spark} + Delta {delta}" if spark and delta else ""


def comparison(runs: Sequence[Run], order: Any) -> list[tuple[Key, list[str]]]:
    """The (scale, kind, size) keys every run measured, with the models of each, in order."""
    keys = sorted({key for run in runs for key, _ in run.summaries})
    return [
        (key, sorted({m for run in runs for k, m in run.summaries if k == key}, key=order))
        for key in keys
    ]


def markdown(runs: Sequence[Run], order: Any, plot: Path | None) -> str:
    """One table per key: each run's refresh, its rebuild and table / refresh."""
    lines = [
        "# Benchmark runs compared",
        "",
        "Runs: " + ", ".join(f"`{run.name}`" for run in runs) + " (oldest first). "
        "Each cell is the median over the run's batches; `table / ivm` divides the "
        "rebuild's time by the refresh's, both timed in the same run.",
    ]
    for (sf, kind, size), models in comparison(runs, order):
        header = "| model | " + " | ".join(
            f"{run.name}: ivm s | table s | table / ivm | jobs" for run in runs
        )
        lines += ["", f"## SF {sf:g}, batch `{kind}` {size:g} %", "", header + " |"]
        lines.append("|---|" + "---:|---:|---:|---:|" * len(runs))
        for model in models:
            cells = []
            for run in runs:
                s = run.summaries.get(((sf, kind, size), model))
                cells.append(
                    " | ".join(
                        [
                            f"{s.ivm_seconds:.2f}",
                            f"{s.table_seconds:.2f}",
                            f"{s.speedup:.1f}x",
                            f"{s.ivm_jobs:g}",
                        ]
                    )
                    if s
                    else "- | - | - | -"
                )
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
    if plot is not None:
        lines += ["", f"![table / ivm per run]({plot.name})"]
    return "\n".join(lines) + "\n"


def ratio_plot(runs: Sequence[Run], order: Any, path: Path) -> Path | None:
    """Bars of table / ivm per model, one bar per run, one panel per key; 1x marked."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    panels = comparison(runs, order)
    if not panels:
        return None
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 3.6 * len(panels)), squeeze=False)
    width = 0.8 / len(runs)
    for axis, ((sf, kind, size), models) in zip((row[0] for row in axes), panels, strict=True):
        for i, run in enumerate(runs):
            ratios = [
                s.speedup if (s := run.summaries.get(((sf, kind, size), m))) else 0.0
                for m in models
            ]
            axis.bar([x + i * width for x in range(len(models))], ratios, width, label=run.name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(models))])
        axis.set_xticklabels(models, rotation=20, ha="right", fontsize=7)
        axis.set_ylabel("table / ivm (above 1: refresh wins)", fontsize=8)
        axis.set_title(f"SF {sf:g}, batch '{kind}' {size:g} %", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpch_bench.compare", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="results JSON files, oldest first")
    parser.add_argument("--out", type=Path, required=True, help="directory for the md and png")
    parser.add_argument("--label", required=True, help="file stem of the comparison")
    args = parser.parse_args(argv)
    # Runs on more than one Spark or Delta are named by theirs too.
    engines = {_engine(load_results(path).get("environment") or {}) for path in args.results}
    runs = [Run.load(path, engines=len(engines) > 1) for path in args.results]
    order = _model_order(load_results(args.results[-1]))
    args.out.mkdir(parents=True, exist_ok=True)
    plot = ratio_plot(runs, order, args.out / f"{args.label}-ratios.png")
    (args.out / f"{args.label}.md").write_text(markdown(runs, order, plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
