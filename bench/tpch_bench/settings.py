"""What one run of the benchmark covers, and where its files go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpch_bench.catalog import BenchModel

BENCH_DIR = Path(__file__).resolve().parents[1]
PROJECT_DIR = BENCH_DIR / "tpch_project"
DEFAULT_WORK_DIR = BENCH_DIR / "work"
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
# The committed results' plots are the figures of the documentation site
# (docs/performance.md), and MkDocs serves only files inside its docs_dir: so a
# run writing to the default results directory draws its plots there, the one
# copy the site, GitHub's rendering of docs/ and the results markdown all link
# to. Any other results directory keeps its plots beside its JSON and markdown.
DEFAULT_PLOTS_DIR = BENCH_DIR.parent / "docs" / "assets" / "bench"

# Batch kinds (bench/tpch_bench/batches.py says what each changes).
BATCH_KINDS = ("rf", "lineitem_updates", "customer_updates", "mixed")
DEFAULT_BATCH_KINDS = ("rf", "lineitem_updates", "customer_updates")
# Change sizes in percent of the changed table's rows (issue 5: 0.1 %, 1 %, 10 %).
DEFAULT_CHANGE_SIZES = (0.1, 1.0, 10.0)
DEFAULT_SCALE_FACTORS = (1.0, 5.0)
# Median of at least three (issue 5).
DEFAULT_REPETITIONS = 3


def plots_dir_for(results_dir: Path) -> Path:
    """Where the plots of results written to ``results_dir`` go (see DEFAULT_PLOTS_DIR)."""
    return DEFAULT_PLOTS_DIR if results_dir.resolve() == DEFAULT_RESULTS_DIR else results_dir


def scale_tag(scale_factor: float) -> str:
    """A name-safe form of a scale factor: 0.01 -> '0_01', 5.0 -> '5'."""
    return f"{scale_factor:g}".replace(".", "_")


@dataclass(frozen=True)
class BenchSettings:
    scale_factors: tuple[float, ...]
    change_sizes: tuple[float, ...]
    batch_kinds: tuple[str, ...]
    repetitions: int
    models: tuple[BenchModel, ...]
    work_dir: Path
    results_dir: Path
    label: str
    # Prefix of the schemas a run creates (sources and models, one pair per scale
    # factor), so that a smoke run inside the test suite cannot touch a real run's.
    schema_prefix: str = "tpch"
    # The embedded runtime's directory (warehouse and metastore); default
    # <work_dir>/runtime. The smoke test points it at the test suite's runtime,
    # whose session it shares.
    runtime_dir_override: Path | None = None
    # Spark configs over the embedded runtime's defaults (e.g. spark.driver.memory
    # for SF 5); they apply when the harness starts the session, not to one it reuses.
    spark_conf: tuple[tuple[str, str], ...] = ()
    # dbt's file log level: "debug" logs every statement with its duration.
    dbt_log_level_file: str = "info"
    # Pairs of group-overhead measurements after the batches (0: no such phase):
    # all ivm models refreshed in one invocation as one consistency group, and
    # each on its own (bench/tpch_bench/group_overhead.py).
    group_overhead_pairs: int = 0
    # The ivm models' ivm_join_state (project var bench_ivm_join_state).
    join_state: str = "none"
    # The ivm models' ivm_strategy (project var bench_ivm_strategy).
    strategy: str = "auto"
    # The ivm models' ivm_state_form (project var bench_ivm_state_form; the
    # MIN/MAX model keeps 'merged', which a log cannot hold).
    state_form: str = "auto"
    # Run the session as the driver of a local standalone cluster (a master and
    # two workers, each its own JVM: dbt.adapters.spark_ivm.runtime.cluster) instead of
    # local[2], so every task runs in an executor of another JVM.
    cluster: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.batch_kinds) - set(BATCH_KINDS))
        if unknown:
            raise ValueError(
                f"unknown batch kind(s) {', '.join(unknown)}; known: {', '.join(BATCH_KINDS)}"
            )
        # 0 repetitions skips the no-change refreshes and the batches: first
        # builds, then the group-overhead phase alone.
        if self.repetitions < 0:
            raise ValueError(f"repetitions must be 0 or more, got {self.repetitions}")
        if self.group_overhead_pairs < 0:
            raise ValueError(
                f"group-overhead pairs must be 0 or more, got {self.group_overhead_pairs}"
            )
        if self.group_overhead_pairs and not self.change_sizes:
            raise ValueError("the group-overhead phase takes its batch size from --sizes: give one")
        for size in self.change_sizes:
            if not 0 < size <= 100:
                raise ValueError(f"change sizes are percentages in (0, 100], got {size}")

    @property
    def group_overhead_size(self) -> float:
        """The group-overhead phase's batch size: the smallest change size of the run."""
        return min(self.change_sizes)

    @property
    def plots_dir(self) -> Path:
        return plots_dir_for(self.results_dir)

    @property
    def runtime_dir(self) -> Path:
        """The embedded runtime's warehouse and metastore (shared by every scale factor)."""
        return self.runtime_dir_override or self.work_dir / "runtime"

    @property
    def dbt_target_dir(self) -> Path:
        return self.work_dir / "dbt" / "target"

    @property
    def dbt_log_dir(self) -> Path:
        return self.work_dir / "dbt" / "logs"

    def data_dir(self, scale_factor: float) -> Path:
        return self.work_dir / "data" / f"sf{scale_tag(scale_factor)}"

    def source_schema(self, scale_factor: float) -> str:
        return f"{self.schema_prefix}_sf{scale_tag(scale_factor)}"

    def model_schema(self, scale_factor: float) -> str:
        return f"{self.schema_prefix}_sf{scale_tag(scale_factor)}_models"
