"""Does refresh time follow the change? The same day's batch at two warehouse sizes, side by side.

Issue 54's second target: with a day's batch of the same size
(`--batch-scale 60`) applied to the warehouse at scale 1500 and at scale
6000, the batch's refreshes should grow at most 1.5x while the `table`
rebuilds grow with the data (about 4x). Given the driver's JSON results of
the two runs, this writes `<name>.md` (each size's batch refresh and rebuild,
their growth, and each model's refresh at both sizes beside its rebuild) and
`<name>.png` (the two totals per size, and the per-model growth).

    .venv/bin/python integration_tests/warehouse/scaling.py OUT_DIR NAME \\
        1500=results/warehouse-scale1500-....json 6000=results/warehouse-scale6000-....json
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

# The refresh growth the issue accepts when the data grows about 4x.
REFRESH_GROWTH_TARGET = 1.5


@dataclass(frozen=True)
class BatchTimes:
    """One run's first batch: each model's refresh and its own `table` rebuild, in seconds."""

    scale: int
    refresh: dict[str, float]
    rebuild: dict[str, float]

    @property
    def refresh_total(self) -> float:
        return sum(self.refresh.values())

    @property
    def rebuild_total(self) -> float:
        return sum(self.rebuild.values())


def read_batch(scale: int, payload: list[dict]) -> BatchTimes:
    """The first batch of a driver result (`driver.py`'s JSON: its steps, the first build first).

    >>> steps = [{"name": "first build", "models": [], "table_models": {}},
    ...          {"name": "batch 1", "models": [{"model": "a", "seconds": 2.0}],
    ...           "table_models": {"a": 8.0}}]
    >>> read_batch(1500, steps)
    BatchTimes(scale=1500, refresh={'a': 2.0}, rebuild={'a': 8.0})
    """
    batch = next(step for step in payload if step["name"] != "first build")
    refresh = {m["model"]: float(m["seconds"]) for m in batch["models"]}
    return BatchTimes(scale, refresh, {k: float(v) for k, v in batch["table_models"].items()})


def markdown(small: BatchTimes, large: BatchTimes) -> str:
    """The comparison as a report: totals and growth first, then every model.

    >>> a = BatchTimes(1500, {"m": 2.0}, {"m": 5.0})
    >>> b = BatchTimes(6000, {"m": 3.0}, {"m": 20.0})
    >>> print(markdown(a, b).splitlines()[6])
    | batch refresh (models' sum) | 2.0 | 3.0 | 1.50x |
    """
    data_growth = large.scale / small.scale
    refresh_growth = large.refresh_total / small.refresh_total
    rebuild_growth = large.rebuild_total / small.rebuild_total
    verdict = "met" if refresh_growth <= REFRESH_GROWTH_TARGET else "missed"
    lines = [
        f"# A day's batch at scale {small.scale} and {large.scale}",
        "",
        f"The data grows {data_growth:g}x; the batch is the same size at both.",
        "",
        f"| | scale {small.scale} s | scale {large.scale} s | growth |",
        "|---|---|---|---|",
        (
            f"| batch refresh (models' sum) | {small.refresh_total:.1f} | "
            f"{large.refresh_total:.1f} | {refresh_growth:.2f}x |"
        ),
        (
            f"| `table` rebuild (models' sum) | {small.rebuild_total:.1f} | "
            f"{large.rebuild_total:.1f} | {rebuild_growth:.2f}x |"
        ),
        (
            f"| rebuild / refresh | {small.rebuild_total / small.refresh_total:.2f}x | "
            f"{large.rebuild_total / large.refresh_total:.2f}x | |"
        ),
        "",
        (
            f"Target: the refresh grows at most {REFRESH_GROWTH_TARGET}x while the rebuild "
            f"grows about {data_growth:g}x: {verdict} ({refresh_growth:.2f}x)."
        ),
        "",
        "## Per model (refresh / own `table` rebuild, seconds)",
        "",
        f"| model | scale {small.scale} | scale {large.scale} | refresh growth |",
        "|---|---|---|---|",
    ]
    for model in sorted(large.refresh, key=lambda m: -large.refresh[m]):
        before, after = small.refresh.get(model), large.refresh[model]
        growth = f"{after / before:.2f}x" if before else "-"
        lines.append(
            f"| {model} | {_cell(before, small.rebuild.get(model))} | "
            f"{_cell(after, large.rebuild.get(model))} | {growth} |"
        )
    return "\n".join(lines) + "\n"


def _cell(refresh: float | None, rebuild: float | None) -> str:
    if refresh is None:
        return "-"
    return f"{refresh:.1f}" + (f" / {rebuild:.1f}" if rebuild is not None else "")


def plot(small: BatchTimes, large: BatchTimes, path: Path) -> None:
    """Totals per size (refresh beside rebuild), and each model's refresh at both sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (totals, models) = plt.subplots(
        1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1, 3]}
    )
    scales = [f"scale {small.scale}", f"scale {large.scale}"]
    positions = range(len(scales))
    width = 0.38
    totals.bar(
        [p - width / 2 for p in positions],
        [small.refresh_total, large.refresh_total],
        width,
        label="ivm refresh",
    )
    totals.bar(
        [p + width / 2 for p in positions],
        [small.rebuild_total, large.rebuild_total],
        width,
        label="`table` rebuild",
    )
    totals.set_xticks(list(positions), scales)
    totals.set_ylabel("seconds, models' sum")
    totals.set_title("the same day's batch")
    totals.legend()
    names = sorted(large.refresh, key=lambda m: -large.refresh[m])
    index = range(len(names))
    models.bar(
        [i - width / 2 for i in index],
        [small.refresh.get(n, 0.0) for n in names],
        width,
        label=f"refresh, scale {small.scale}",
    )
    models.bar(
        [i + width / 2 for i in index],
        [large.refresh[n] for n in names],
        width,
        label=f"refresh, scale {large.scale}",
    )
    models.scatter(
        list(index),
        [large.rebuild.get(n, 0.0) for n in names],
        marker="_",
        s=120,
        color="black",
        label=f"own `table` rebuild, scale {large.scale}",
    )
    models.set_xticks(list(index), names, rotation=75, ha="right", fontsize=7)
    models.set_ylabel("seconds")
    models.set_title("each model's refresh")
    models.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, name = Path(argv[0]), argv[1]
    runs = []
    for spec in argv[2:]:
        scale, _, path = spec.partition("=")
        runs.append(read_batch(int(scale), json.loads(Path(path).read_text())))
    small, large = sorted(runs, key=lambda run: run.scale)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.md").write_text(markdown(small, large))
    plot(small, large, out_dir / f"{name}.png")
    print(out_dir / f"{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
