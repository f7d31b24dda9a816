"""The worked example's runs side by side: each model's refresh, first build and `table` rebuild.

`scripts/example` prints, per model, each day's refresh seconds against
the first build's and a `table` rebuild's (the tables headed "Day <n>: the
refresh against the first build and a 'table' rebuild"); this reads day
1's, or the one headed "The incremental refresh ..." in the output of runs
before the second day was added. Given
the saved output of several runs, this writes `<name>.md` (every run's
totals and per-model refreshes, and the ratio of the `table` rebuilds to
the refreshes) and `<name>.png` (each model's refresh per run, the rebuild
beside them) into OUT_DIR.

    .venv/bin/python bench/micro/example_runs.py OUT_DIR NAME \\
        before=example-before.txt after=example-after.txt
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

HEADING = "Day 1: the refresh against the first build and a 'table' rebuild"
# Before 2026-12-05 the example refreshed one batch, under this heading.
EARLIER_HEADING = "The incremental refresh against the first build and a 'table' rebuild"
ROW = re.compile(r"^\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+x$")
TOTAL = "all models"


@dataclass(frozen=True)
class ModelTimes:
    refresh: float
    build: float
    table: float


def read_run(text: str) -> dict[str, ModelTimes]:
    """The per-model rows of the comparison table in one run's output (its totals under TOTAL).

    Checked in tests/bench/test_bench_parts.py.
    """
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith((HEADING, EARLIER_HEADING)))
    start += 2
    runs: dict[str, ModelTimes] = {}
    for line in lines[start:]:
        match = ROW.match(line.replace(TOTAL, TOTAL.replace(" ", "_")))
        if match is None:
            break
        name, refresh, build, table = match.groups()
        runs[name.replace("_", " ") if name == "all_models" else name] = ModelTimes(
            float(refresh), float(build), float(table)
        )
    return runs


def report(runs: dict[str, dict[str, ModelTimes]]) -> str:
    """A markdown table: a row per model, per run its refresh seconds; the totals and ratios last."""
    labels = list(runs)
    models = [m for m in next(iter(runs.values())) if m != TOTAL]
    lines = [
        "| model | " + " | ".join(f"{label} s" for label in labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for model in models:
        cells = [f"{runs[label][model].refresh:.2f}" for label in labels]
        lines.append(f"| `{model}` | " + " | ".join(cells) + " |")
    for what, value in (
        ("refreshes", lambda t: f"{t.refresh:.2f}"),
        ("first builds", lambda t: f"{t.build:.2f}"),
        ("`table` rebuilds", lambda t: f"{t.table:.2f}"),
        ("table / refresh", lambda t: f"{t.table / t.refresh:.2f}x"),
    ):
        lines.append(
            f"| all models: {what} | "
            + " | ".join(value(runs[label][TOTAL]) for label in labels)
            + " |"
        )
    under = [
        sum(times.refresh < times.build for model, times in runs[label].items() if model != TOTAL)
        for label in labels
    ]
    lines.append(
        "| refreshes under their first build | "
        + " | ".join(f"{n} of {len(models)}" for n in under)
        + " |"
    )
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, dict[str, ModelTimes]], path: Path) -> None:
    """Each model's refresh seconds per run as grouped bars, the last run's `table` rebuild hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs)
    models = [m for m in next(iter(runs.values())) if m != TOTAL]
    width = 0.8 / (len(labels) + 1)
    figure, axes = plt.subplots(figsize=(12, 5))
    for index, label in enumerate(labels):
        axes.bar(
            [m + index * width for m in range(len(models))],
            [runs[label][model].refresh for model in models],
            width,
            label=f"refresh: {label}",
        )
    last = runs[labels[-1]]
    axes.bar(
        [m + len(labels) * width for m in range(len(models))],
        [last[model].table for model in models],
        width,
        label=f"table rebuild ({labels[-1]})",
        hatch="//",
        color="lightgrey",
    )
    axes.set_xticks([m + 0.4 - width / 2 for m in range(len(models))])
    axes.set_xticklabels(models, rotation=30, ha="right")
    axes.set_ylabel("seconds")
    axes.set_title("scripts/example: each model's incremental refresh per run")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    out, name = Path(argv[0]), argv[1]
    runs = {
        label: read_run(Path(file).read_text())
        for label, file in (arg.split("=", 1) for arg in argv[2:])
    }
    (out / f"{name}.md").write_text(report(runs))
    plot(runs, out / f"{name}.png")
    print((out / f"{name}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
